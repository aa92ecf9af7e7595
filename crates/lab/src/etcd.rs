//! A throwaway etcd cluster: real `etcd` members (Debian's etcd-server)
//! in a network namespace of their own, each on an address of its own,
//! reachable from other namespaces over veth links this module adds (one
//! per client namespace, so that one client can be cut off alone).
//!
//! Addresses: member `i` (1-based) listens on `198.19.250.i` (clients on
//! port 2379, peers on 2380); the link to client `k` is
//! `198.19.251.(4k+1)` (etcd's side) and `.(4k+2)` (the client's), with a
//! route to 198.19.250.0/24 through it. Every member is killed by its PID
//! when the cluster is dropped, and its data directory removed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use netns::Netns;

use crate::{Error, Result};

/// The client port of every member.
pub const CLIENT_PORT: u16 = 2379;
/// The peer port of every member.
pub const PEER_PORT: u16 = 2380;
/// How long a member waits for a heartbeat before calling an election
/// (etcd's default, 1 s): a killed leader is replaced within about this.
pub const ELECTION_TIMEOUT_MS: u64 = 1000;
/// Bound on every etcdctl this module runs.
const ETCDCTL_TIMEOUT: &str = "5";

struct Member {
    name: String,
    addr: String,
    child: Option<Child>,
}

/// A running cluster; dropped, its members are killed and their data removed.
pub struct EtcdCluster {
    ns: Netns,
    dir: PathBuf,
    members: Vec<Member>,
    tag: String,
    /// Client namespaces connected, by `k`.
    links: Vec<usize>,
    /// Clients must speak TLS with a certificate of the cluster's CA.
    tls: bool,
    /// root's password, once users are on ([`EtcdCluster::enable_auth`]).
    root_password: Option<String>,
}

/// The files a TLS cluster made ([`EtcdCluster::start_tls`]), in its
/// scratch directory.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA that signed the members' and the client's certificates.
    pub ca: PathBuf,
    /// A client certificate (CN `fastpath`).
    pub cert: PathBuf,
    /// Its key (mode 0600).
    pub key: PathBuf,
}

/// The address of member `i` (1-based).
pub fn member_address(i: usize) -> String {
    format!("198.19.250.{i}")
}

impl EtcdCluster {
    /// Starts `members` members (1 to 7) in a namespace `fpe-TAG` and
    /// waits (up to 30 s) until every one answers as healthy.
    pub fn start(tag: &str, members: usize) -> Result<EtcdCluster> {
        EtcdCluster::start_with(tag, members, false)
    }

    /// [`EtcdCluster::start`] with clients on TLS only: the members serve
    /// `https://` with certificates of a CA made here (openssl) and take
    /// only clients with a certificate of the same CA (`--client-cert-auth`).
    pub fn start_tls(tag: &str, members: usize) -> Result<EtcdCluster> {
        EtcdCluster::start_with(tag, members, true)
    }

    fn start_with(tag: &str, members: usize, tls: bool) -> Result<EtcdCluster> {
        if !netns::available() {
            return Err(Error::Unavailable);
        }
        let members = members.clamp(1, 7);
        let ns = Netns::new(&format!("fpe-{tag}"))?;
        let dir = std::env::temp_dir().join(format!("fastpath-etcd-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(Error::io(dir.display()))?;
        let mut c = EtcdCluster {
            ns,
            dir,
            members: (1..=members)
                .map(|i| Member {
                    name: format!("m{i}"),
                    addr: member_address(i),
                    child: None,
                })
                .collect(),
            tag: tag.to_string(),
            links: Vec::new(),
            tls,
            root_password: None,
        };
        if tls {
            c.make_certificates()?;
        }
        for m in &c.members {
            c.ns.ip(&["addr", "add", &format!("{}/32", m.addr), "dev", "lo"])?;
        }
        for i in 1..=members {
            c.spawn(i, "new")?;
        }
        c.wait_healthy(Duration::from_secs(30))?;
        Ok(c)
    }

    /// The namespace the members run in.
    pub fn netns(&self) -> &Netns {
        &self.ns
    }

    /// The client URLs of every member, `http://ADDR:2379` (`https://`
    /// for a TLS cluster).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| self.client_url(m)).collect()
    }

    fn client_url(&self, m: &Member) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}:{CLIENT_PORT}", m.addr)
    }

    /// The CA, client certificate and key of a TLS cluster.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        self.tls.then(|| TlsFiles {
            ca: self.dir.join("ca.pem"),
            cert: self.dir.join("client.pem"),
            key: self.dir.join("client.key"),
        })
    }

    /// Makes the CA, the members' certificate (every member's address
    /// and the name `etcd.test`) and a client certificate, with openssl,
    /// each call bounded.
    fn make_certificates(&self) -> Result<()> {
        let d = &self.dir;
        let run = |args: &[&str]| -> Result<()> {
            let o = Command::new("timeout")
                .arg("30")
                .arg("openssl")
                .args(args)
                .current_dir(d)
                .stdin(Stdio::null())
                .output()
                .map_err(Error::io("openssl"))?;
            if o.status.success() {
                Ok(())
            } else {
                Err(Error::Timeout {
                    what: format!("openssl {args:?}: {}", String::from_utf8_lossy(&o.stderr)),
                    logs: String::new(),
                })
            }
        };
        let sans: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("IP:{}", m.addr))
            .chain(["DNS:etcd.test".to_string()])
            .collect();
        std::fs::write(
            d.join("server.ext"),
            format!(
                "subjectAltName={}\nextendedKeyUsage=serverAuth,clientAuth\n",
                sans.join(",")
            ),
        )
        .map_err(Error::io("server.ext"))?;
        std::fs::write(d.join("client.ext"), "extendedKeyUsage=clientAuth\n")
            .map_err(Error::io("client.ext"))?;
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=fastpath test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ])?;
        for (name, cn) in [("server", "etcd.test"), ("client", "fastpath")] {
            run(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ])?;
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ])?;
        }
        for key in ["ca.key", "server.key", "client.key"] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(d.join(key), std::fs::Permissions::from_mode(0o600))
                .map_err(Error::io(key))?;
        }
        Ok(())
    }

    /// Turns etcd's users on: `root` (made here), `reader` with read on
    /// `prefix`, `writer` with read and write on it, each with its
    /// password (the user's name backwards, a test's secret). Returns the
    /// two passwords.
    pub fn enable_auth(&mut self, prefix: &str) -> Result<(String, String)> {
        let ep = self.endpoints_arg();
        let root = "toor".to_string();
        let (reader, writer) = ("redaer".to_string(), "retirw".to_string());
        let steps: Vec<Vec<String>> = vec![
            vec!["user".into(), "add".into(), format!("root:{root}")],
            vec!["user".into(), "add".into(), format!("reader:{reader}")],
            vec!["user".into(), "add".into(), format!("writer:{writer}")],
            vec!["role".into(), "add".into(), "read".into()],
            vec!["role".into(), "add".into(), "write".into()],
            vec![
                "role".into(),
                "grant-permission".into(),
                "--prefix=true".into(),
                "read".into(),
                "read".into(),
                prefix.into(),
            ],
            vec![
                "role".into(),
                "grant-permission".into(),
                "--prefix=true".into(),
                "write".into(),
                "readwrite".into(),
                prefix.into(),
            ],
            vec![
                "user".into(),
                "grant-role".into(),
                "reader".into(),
                "read".into(),
            ],
            vec![
                "user".into(),
                "grant-role".into(),
                "writer".into(),
                "write".into(),
            ],
            vec!["auth".into(), "enable".into()],
        ];
        for step in steps {
            let args: Vec<&str> = step.iter().map(String::as_str).collect();
            let o = self.etcdctl(&ep, &args)?;
            if !o.status.success() {
                return Err(Error::Timeout {
                    what: format!("etcdctl {args:?}: {}", String::from_utf8_lossy(&o.stderr)),
                    logs: self.logs(),
                });
            }
        }
        self.root_password = Some(root);
        Ok((reader, writer))
    }

    /// [`EtcdCluster::endpoints`] joined with commas (the CLI's form).
    pub fn endpoints_arg(&self) -> String {
        self.endpoints().join(",")
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://{}:{PEER_PORT}", m.name, m.addr))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("m{i}.log"))
    }

    /// What member `i` has logged.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
    }

    fn spawn(&mut self, i: usize, state: &str) -> Result<()> {
        let initial = self.initial_cluster();
        let log = self.log_path(i);
        let m = self
            .members
            .get(i.wrapping_sub(1))
            .ok_or_else(|| Error::Timeout {
                what: format!("no etcd member {i}"),
                logs: String::new(),
            })?;
        let data = self.dir.join(format!("{}.etcd", m.name));
        let client = self.client_url(m);
        let peer = format!("http://{}:{PEER_PORT}", m.addr);
        let mut c = self.ns.command("etcd");
        c.args(["--name", &m.name, "--data-dir"])
            .arg(&data)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &initial,
                "--initial-cluster-state",
                state,
                "--initial-cluster-token",
                &format!("fastpath-{}", self.tag),
                "--heartbeat-interval",
                "100",
                "--election-timeout",
                &ELECTION_TIMEOUT_MS.to_string(),
            ])
            .stdin(Stdio::null());
        crate::log_to(&mut c, &log)?;
        if self.tls {
            let d = &self.dir;
            c.arg("--cert-file")
                .arg(d.join("server.pem"))
                .arg("--key-file")
                .arg(d.join("server.key"))
                .arg("--trusted-ca-file")
                .arg(d.join("ca.pem"))
                .arg("--client-cert-auth");
        }
        let child = c.spawn().map_err(|source| {
            Error::Netns(netns::Error::Spawn {
                program: format!("etcd member {i} in {}", self.ns.name()),
                source,
            })
        })?;
        if let Some(m) = self.members.get_mut(i - 1) {
            m.child = Some(child);
        }
        Ok(())
    }

    /// Runs `etcdctl ARGS` (API v3) in the members' namespace against
    /// `endpoints`, bounded to a few seconds.
    pub fn etcdctl(&self, endpoints: &str, args: &[&str]) -> Result<Output> {
        let mut v = vec![
            "timeout",
            ETCDCTL_TIMEOUT,
            "etcdctl",
            "--endpoints",
            endpoints,
            "--dial-timeout=2s",
            "--command-timeout=3s",
        ];
        let tls: Vec<String> = match self.tls_files() {
            Some(t) => vec![
                format!("--cacert={}", t.ca.display()),
                format!("--cert={}", t.cert.display()),
                format!("--key={}", t.key.display()),
            ],
            None => Vec::new(),
        };
        v.extend(tls.iter().map(String::as_str));
        let user = self
            .root_password
            .as_ref()
            .map(|p| format!("--user=root:{p}"));
        v.extend(user.iter().map(String::as_str));
        v.extend_from_slice(args);
        let mut c = self.ns.command(v[0]);
        c.args(&v[1..]).env("ETCDCTL_API", "3").stdin(Stdio::null());
        c.output().map_err(Error::io("etcdctl"))
    }

    /// Waits until every running member says it is healthy.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let running: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| self.client_url(m))
            .collect();
        let mut last = String::new();
        while Instant::now() < deadline {
            match self.etcdctl(&running.join(","), &["endpoint", "health"]) {
                Ok(o) if o.status.success() => return Ok(()),
                Ok(o) => last = String::from_utf8_lossy(&o.stderr).into_owned(),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(Error::Timeout {
            what: format!("etcd members {running:?} not healthy within {timeout:?}: {last}"),
            logs: self.logs(),
        })
    }

    /// Every member's log, for a failure's message.
    pub fn logs(&self) -> String {
        (1..=self.members.len())
            .map(|i| {
                let l = self.log(i);
                let tail: String = l
                    .lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                format!("--- etcd m{i}\n{tail}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The member (1-based) that leads now, as the running members see it.
    pub fn leader(&self) -> Result<usize> {
        let mut last = String::new();
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            let ep = self.client_url(m);
            let o = self.etcdctl(&ep, &["endpoint", "status", "-w", "json"])?;
            let v: serde_json::Value = match serde_json::from_slice(&o.stdout) {
                Ok(v) => v,
                Err(e) => {
                    last = format!("{e}: {}", String::from_utf8_lossy(&o.stderr));
                    continue;
                }
            };
            let status = &v[0]["Status"];
            let (Some(me), Some(leader)) = (
                status["header"]["member_id"].as_u64(),
                status["leader"].as_u64(),
            ) else {
                continue;
            };
            if me == leader {
                return Ok(i + 1);
            }
        }
        Err(Error::Timeout {
            what: format!("no etcd member says it leads: {last}"),
            logs: self.logs(),
        })
    }

    /// Kills member `i` (SIGKILL, by its PID) and waits for it.
    pub fn kill_member(&mut self, i: usize) {
        if let Some(m) = self.members.get_mut(i.wrapping_sub(1)) {
            if let Some(mut c) = m.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Starts member `i` again (after [`EtcdCluster::kill_member`]) on its
    /// data directory.
    pub fn restart_member(&mut self, i: usize) -> Result<()> {
        self.kill_member(i);
        self.spawn(i, "existing")
    }

    /// Connects the client namespace `client` as client `k` (1 to 60): a
    /// veth pair `etcd0` there, with a route to the members.
    pub fn connect(&mut self, client: &Netns, k: usize) -> Result<()> {
        let ours = format!("e{k}");
        netns::veth(
            &self.ns,
            &ours,
            &format!("02:00:00:e7:{k:02x}:01"),
            client,
            "etcd0",
            &format!("02:00:00:e7:{k:02x}:02"),
        )?;
        self.ns.ip(&[
            "addr",
            "add",
            &format!("198.19.251.{}/30", 4 * k + 1),
            "dev",
            &ours,
        ])?;
        client.ip(&[
            "addr",
            "add",
            &format!("198.19.251.{}/30", 4 * k + 2),
            "dev",
            "etcd0",
        ])?;
        client.ip(&[
            "route",
            "add",
            "198.19.250.0/24",
            "via",
            &format!("198.19.251.{}", 4 * k + 1),
        ])?;
        self.links.push(k);
        Ok(())
    }

    /// Cuts client `k` off from every member (`cut`), or joins it again:
    /// its link goes down on etcd's side.
    pub fn partition(&self, k: usize, cut: bool) -> Result<()> {
        self.ns.ip(&[
            "link",
            "set",
            "dev",
            &format!("e{k}"),
            if cut { "down" } else { "up" },
        ])?;
        Ok(())
    }

    /// The scratch directory (data and logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A command running `program` in the members' namespace.
    pub fn command(&self, program: &str) -> Command {
        self.ns.command(program)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 1..=self.members.len() {
            self.kill_member(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
