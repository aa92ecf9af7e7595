//! QUIC through the namespace fleet: a QUIC server (`fastpath-quic-peer`,
//! quinn) on every backend issuing QUIC-LB connection IDs with its server
//! ID, the load balancers' `[[quic_lb]]` configuration for them, and a
//! client that downloads over connections it moves (rebinding to another
//! address and port) mid-download. Shared by `fastpath lb demo` and the
//! fleet's QUIC system test, so that both show the same thing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::topology::{Topology, VIP};
use crate::{Error, Result};

/// The QUIC VIP's port.
pub const PORT: u16 = 443;

/// The QUIC-LB key the servers and the load balancers share (server ID and
/// nonce together are 8 octets, so the four-pass encoding; a test key,
/// never a deployment's).
pub const KEY: &str = "8f95f09245765f80256934e50c66207f";

/// The configuration's rotation codepoint.
pub const CODEPOINT: u8 = 1;

/// Server ID and nonce lengths, octets.
pub const SERVER_ID_LEN: usize = 2;
/// See [`SERVER_ID_LEN`].
pub const NONCE_LEN: usize = 6;

/// Backend `i`'s (1-based) server ID, hex.
pub fn server_id(i: usize) -> String {
    format!("{i:04x}")
}

/// The QUIC part of a load balancer's configuration for a fleet of
/// `backends` backends: the `[[quic_lb]]` configuration, a pool `h3` whose
/// backends carry their server IDs, and a UDP VIP on [`PORT`] with
/// `quic = routed`.
pub fn section(backends: usize, routed: bool) -> String {
    let list: Vec<String> = (1..=backends)
        .map(|i| {
            format!(
                "{{ address = \"{}\", quic_server_id = \"{}\" }}",
                Topology::backend_address(i),
                server_id(i)
            )
        })
        .collect();
    format!(
        "\n[[quic_lb]]\ncodepoint = {CODEPOINT}\nserver_id_len = {SERVER_ID_LEN}\nnonce_len = {NONCE_LEN}\nkey = \"{KEY}\"\n\
         length_self_encoding = true\n\
         [[pools]]\nname = \"h3\"\nbackends = [{}]\n\
         [[vips]]\nname = \"h3\"\naddress = \"{VIP}\"\nport = {PORT}\nprotocol = \"udp\"\nquic = {routed}\npool = \"h3\"\n",
        list.join(", ")
    )
}

/// One client run's report, as `fastpath-quic-peer client` prints it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Downloads {
    /// Connections opened.
    pub connections: usize,
    /// Downloads that completed.
    #[serde(default)]
    pub ok: usize,
    /// Downloads that did not (timed out or closed).
    pub broken: usize,
    /// Rebinds done in all.
    pub migrations: usize,
    /// Downloads per server name.
    #[serde(default)]
    pub servers: std::collections::BTreeMap<String, usize>,
    /// Broken downloads by error.
    #[serde(default)]
    pub errors: std::collections::BTreeMap<String, usize>,
    /// How long the run took.
    #[serde(default)]
    pub seconds: f64,
}

/// The QUIC peer binary, its certificate, and what the fleet runs of it.
pub struct QuicLab {
    peer: PathBuf,
    cert_dir: PathBuf,
    /// Every load balancer's configuration before the QUIC part.
    base: Vec<String>,
}

impl QuicLab {
    /// `fastpath-quic-peer` beside `fastpath`, if it is there.
    pub fn peer_beside(fastpath: &Path) -> Option<PathBuf> {
        Some(fastpath.with_file_name("fastpath-quic-peer")).filter(|p| p.is_file())
    }

    /// Finds `fastpath-quic-peer` beside `fastpath` (both are built by the
    /// workspace), makes a certificate in the topology's directory, and
    /// keeps each load balancer's configuration as it is now.
    pub fn new(t: &Topology, fastpath: &Path) -> Result<Self> {
        let Some(peer) = Self::peer_beside(fastpath) else {
            return Err(Error::Netns(netns::Error::Failed {
                command: fastpath.with_file_name("fastpath-quic-peer").display().to_string(),
                stderr: "not found beside fastpath: build it (cargo build -p quic-peer, as `make demo` and `cargo test --workspace` do)".into(),
            }));
        };
        let cert_dir = t.dir.join("quic-cert");
        let out = Command::new(&peer)
            .args(["cert", "--dir"])
            .arg(&cert_dir)
            .output()
            .map_err(Error::io(format!("running {}", peer.display())))?;
        if !out.status.success() {
            return Err(Error::Netns(netns::Error::Failed {
                command: format!("{} cert", peer.display()),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }));
        }
        let base = t
            .configs
            .iter()
            .map(|c| std::fs::read_to_string(c).map_err(Error::io(c.display())))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            peer,
            cert_dir,
            base,
        })
    }

    /// Writes every load balancer's configuration with the QUIC part,
    /// routed by connection ID or not; the caller reloads or starts them.
    pub fn write_configs(&self, t: &Topology, routed: bool) -> Result<()> {
        for (path, text) in t.configs.iter().zip(&self.base) {
            std::fs::write(path, format!("{text}{}", section(t.backends.len(), routed)))
                .map_err(Error::io(path.display()))?;
        }
        Ok(())
    }

    /// [`QuicLab::write_configs`], then a reload of every load balancer.
    pub fn reload(&self, t: &Topology, routed: bool) -> Result<()> {
        self.write_configs(t, routed)?;
        for k in 1..=t.lbs.len() {
            t.api_on(k, "POST", "/reload")?;
        }
        Ok(())
    }

    /// Starts a QUIC server on every backend, on the VIP's [`PORT`], for
    /// at most `duration` (each is also stopped with the topology).
    pub fn start_servers(&self, t: &mut Topology, duration: Duration) -> Result<()> {
        for i in 1..=t.backends.len() {
            let child = t.backends[i - 1]
                .command(&self.peer.to_string_lossy())
                .args(["server", "--listen", &format!("{VIP}:{PORT}")])
                .args(["--server-id", &server_id(i)])
                .args(["--codepoint", &CODEPOINT.to_string()])
                .args(["--server-id-len", &SERVER_ID_LEN.to_string()])
                .args(["--nonce-len", &NONCE_LEN.to_string(), "--key", KEY])
                .args(["--length-self-encoding", "--name", &format!("backend-{i}")])
                .args(["--duration-s", &duration.as_secs().max(1).to_string()])
                .arg("--cert-dir")
                .arg(&self.cert_dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(Error::io("starting a QUIC server"))?;
            t.procs.push(&format!("quic{i}"), child);
        }
        Ok(())
    }

    /// The client, started in the client's namespace: `connections`
    /// downloads of `bytes` each, each moving `migrations` times among
    /// `binds`, each given up after `timeout`. Its report comes from
    /// [`QuicLab::finish`].
    pub fn start_client(
        &self,
        t: &Topology,
        binds: &[String],
        connections: usize,
        bytes: u64,
        migrations: usize,
        timeout: Duration,
    ) -> Result<Child> {
        t.client
            .command(&self.peer.to_string_lossy())
            .args(["client", "--connect", &format!("{VIP}:{PORT}")])
            .args(["--connections", &connections.to_string()])
            .args(["--bytes", &bytes.to_string()])
            .args(["--migrations", &migrations.to_string()])
            .args(["--bind", &binds.join(",")])
            .args(["--timeout-s", &timeout.as_secs().max(1).to_string()])
            .arg("--cert-dir")
            .arg(&self.cert_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(Error::io("starting the QUIC client"))
    }

    /// Waits for a client started by [`QuicLab::start_client`], at most
    /// `limit` (then it is killed), and reads its report.
    pub fn finish(mut client: Child, limit: Duration) -> Result<Downloads> {
        let end = Instant::now() + limit;
        while client
            .try_wait()
            .map_err(Error::io("waiting for the QUIC client"))?
            .is_none()
        {
            if Instant::now() > end {
                let _ = client.kill();
                let _ = client.wait();
                return Err(Error::Timeout {
                    what: format!("the QUIC client did not end within {limit:?}"),
                    logs: String::new(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = client
            .wait_with_output()
            .map_err(Error::io("reading the QUIC client's report"))?;
        if !out.status.success() {
            return Err(Error::Netns(netns::Error::Failed {
                command: "fastpath-quic-peer client".into(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| {
            Error::Netns(netns::Error::Failed {
                command: "fastpath-quic-peer client".into(),
                stderr: format!(
                    "not its JSON report ({e}): {}",
                    String::from_utf8_lossy(&out.stdout)
                ),
            })
        })
    }

    /// [`QuicLab::start_client`] then [`QuicLab::finish`], bounded by the
    /// download timeout and a margin.
    pub fn downloads(
        &self,
        t: &Topology,
        binds: &[String],
        connections: usize,
        bytes: u64,
        migrations: usize,
        timeout: Duration,
    ) -> Result<Downloads> {
        let c = self.start_client(t, binds, connections, bytes, migrations, timeout)?;
        Self::finish(c, timeout + Duration::from_secs(30))
    }
}
