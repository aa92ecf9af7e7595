//! The fleet's configuration in an etcd cluster that asks what production
//! clusters ask: clients on TLS only, with a certificate of the cluster's
//! CA (`--client-cert-auth`), and etcd's users and roles (a load balancer
//! may read the prefix, an operator may write it). Everything reached
//! through the bootstrap file (`--etcd-file`), as a machine would be set
//! up: the operator's push and show, the reader refused a push with etcd's
//! reason, and the mistakes an operator makes in that file (a wrong CA, a
//! plain endpoint, a wrong password, a key others can read) each refused
//! with the file or endpoint named.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use lab::etcd::EtcdCluster;

const PREFIX: &str = "/fastpath/tls";

fn cluster(tag: &str) -> EtcdCluster {
    common::etcd_cluster(tag, true)
}

/// A bootstrap file `name` in `dir` for `user` (password `password`),
/// with `endpoints` and the CA file `ca`.
fn bootstrap(
    dir: &Path,
    name: &str,
    endpoints: &[String],
    ca: &Path,
    tls: &lab::etcd::TlsFiles,
    auth: Option<(&str, &str)>,
) -> PathBuf {
    let mut text = format!(
        "endpoints = [{}]\nprefix = \"{PREFIX}\"\ntimeout_ms = 3000\n\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
        endpoints
            .iter()
            .map(|e| format!("\"{e}\""))
            .collect::<Vec<_>>()
            .join(", "),
        ca.display(),
        tls.cert.display(),
        tls.key.display()
    );
    if let Some((user, password)) = auth {
        let pw = dir.join(format!("{name}.password"));
        std::fs::write(&pw, format!("{password}\n")).unwrap();
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        text += &format!(
            "\n[auth]\nuser = \"{user}\"\npassword_file = \"{}\"\n",
            pw.display()
        );
    }
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn fastpath(c: &EtcdCluster, args: &[&str]) -> Output {
    let mut cmd = c.command("timeout");
    cmd.arg("30").arg(env!("CARGO_BIN_EXE_fastpath")).args(args);
    cmd.output().expect("running fastpath")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
#[ignore = "system test: root, namespaces, etcd, openssl"]
fn the_cluster_is_reached_over_tls_with_users_through_the_bootstrap_file() {
    let mut c = cluster("tl");
    let tls = c.tls_files().expect("a TLS cluster");
    let dir = c.dir().to_path_buf();
    let endpoints = c.endpoints();
    assert!(endpoints.iter().all(|e| e.starts_with("https://")));
    let fleet = dir.join("fleet.toml");
    std::fs::write(
        &fleet,
        "[encap]\nsource = \"10.0.0.1\"\n\n[[pools]]\nname = \"web\"\nbackends = [{ address = \"10.1.0.1\" }]\n\n\
         [[vips]]\nname = \"http\"\naddress = \"198.18.0.80\"\nport = 80\nprotocol = \"tcp\"\npool = \"web\"\n",
    )
    .unwrap();
    let fleet = fleet.to_str().unwrap().to_string();

    // Certificates only (no users yet): a push and a show.
    let plain = bootstrap(&dir, "certs", &endpoints, &tls.ca, &tls, None);
    let o = fastpath(
        &c,
        &[
            "lb",
            "config",
            "push",
            &fleet,
            "--etcd-file",
            plain.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));

    // A CA that did not sign the members' certificate: refused, naming
    // the endpoint, within the file's deadline.
    let wrong_ca = dir.join("wrong-ca.pem");
    std::fs::copy(&tls.cert, &wrong_ca).unwrap();
    let bad = bootstrap(&dir, "wrongca", &endpoints, &wrong_ca, &tls, None);
    let started = std::time::Instant::now();
    let o = fastpath(
        &c,
        &["lb", "config", "show", "--etcd-file", bad.to_str().unwrap()],
    );
    assert!(!o.status.success(), "a member behind a CA not trusted");
    assert!(stderr(&o).contains("198.19.250."), "{}", stderr(&o));
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    // Plain http against TLS members: the file itself is refused.
    let http: Vec<String> = endpoints
        .iter()
        .map(|e| e.replace("https://", "http://"))
        .collect();
    let bad = bootstrap(&dir, "http", &http, &tls.ca, &tls, None);
    let o = fastpath(
        &c,
        &["lb", "config", "show", "--etcd-file", bad.to_str().unwrap()],
    );
    assert!(
        !o.status.success() && stderr(&o).contains("expects https://"),
        "{}",
        stderr(&o)
    );

    // Users on: the reader reads, the writer pushes, the reader cannot.
    let (reader_pw, writer_pw) = c.enable_auth(PREFIX).unwrap();
    let reader = bootstrap(
        &dir,
        "reader",
        &endpoints,
        &tls.ca,
        &tls,
        Some(("reader", &reader_pw)),
    );
    let writer = bootstrap(
        &dir,
        "writer",
        &endpoints,
        &tls.ca,
        &tls,
        Some(("writer", &writer_pw)),
    );
    let changed = std::fs::read_to_string(&fleet).unwrap().replace(
        "{ address = \"10.1.0.1\" }",
        "{ address = \"10.1.0.1\" }, { address = \"10.1.0.2\" }",
    );
    std::fs::write(&fleet, &changed).unwrap();
    let o = fastpath(
        &c,
        &[
            "lb",
            "config",
            "push",
            &fleet,
            "--etcd-file",
            reader.to_str().unwrap(),
        ],
    );
    assert!(!o.status.success(), "a reader's push must be refused");
    assert!(
        stderr(&o).to_lowercase().contains("permission denied"),
        "{}",
        stderr(&o)
    );
    let o = fastpath(
        &c,
        &[
            "lb",
            "config",
            "push",
            &fleet,
            "--etcd-file",
            writer.to_str().unwrap(),
            "--format",
            "json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = fastpath(
        &c,
        &[
            "lb",
            "config",
            "show",
            "--etcd-file",
            reader.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("10.1.0.2"),
        "the reader sees the writer's push"
    );
    // A wrong password: etcd's refusal, said.
    let wrong = bootstrap(
        &dir,
        "wrongpw",
        &endpoints,
        &tls.ca,
        &tls,
        Some(("reader", "not-it")),
    );
    let o = fastpath(
        &c,
        &[
            "lb",
            "config",
            "show",
            "--etcd-file",
            wrong.to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).to_lowercase().contains("authentication failed"),
        "{}",
        stderr(&o)
    );
    // A password file others can read: refused before connecting.
    let exposed = dir.join("reader.password");
    std::fs::set_permissions(&exposed, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = fastpath(
        &c,
        &[
            "lb",
            "config",
            "show",
            "--etcd-file",
            reader.to_str().unwrap(),
        ],
    );
    assert!(
        !o.status.success() && stderr(&o).contains("chmod 600"),
        "{}",
        stderr(&o)
    );
}
