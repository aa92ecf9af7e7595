//! `fastpath-quic-peer`: real QUIC (quinn) at both ends of the load
//! balancer, for tests, the demo and benchmarks.
//!
//! - `cert --dir D` writes a self-signed certificate for `quic.test` and its
//!   key, which every server serves and every client trusts.
//! - `server` serves downloads: a stream that asks `GET N` gets a line
//!   naming the server, then N octets. Its connection IDs are QUIC-LB's
//!   (`--server-id`, the configuration as `fastpath lb quic-cid` takes it),
//!   so a load balancer finds it from any client address.
//! - `client` runs downloads over many connections at once, each rebinding
//!   its UDP socket to a new port (and, given `--bind`, a new address)
//!   `--migrations` times mid-download, as a NAT rebinding or a move from
//!   Wi-Fi to cellular does. It prints one JSON document: how many
//!   completed, how many broke and why, which servers served them.
//!
//! Every run is bounded: the server by `--duration-s`, each download by
//! `--timeout-s`.

use std::io::Read;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(about = "QUIC server and migrating client for fastpath's tests (quinn)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write cert.der and key.der (self-signed, for quic.test) into --dir.
    Cert {
        /// Where to write them.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Serve downloads with QUIC-LB connection IDs.
    Server(ServerArgs),
    /// Download over migrating connections and report.
    Client(ClientArgs),
}

/// One QUIC-LB configuration, as `fastpath lb quic-cid` takes it.
#[derive(Args)]
struct CidArgs {
    /// Config rotation codepoint, 0-6.
    #[arg(long, default_value_t = 0)]
    codepoint: u8,
    /// Server ID length, octets.
    #[arg(long, default_value_t = 2)]
    server_id_len: usize,
    /// Nonce length, octets.
    #[arg(long, default_value_t = 6)]
    nonce_len: usize,
    /// AES-128 key, 32 hex digits (none: plaintext).
    #[arg(long)]
    key: Option<String>,
    /// Write the length into the first octet.
    #[arg(long)]
    length_self_encoding: bool,
}

#[derive(Args)]
struct ServerArgs {
    /// Address and port to serve on (the VIP, held on the backend's loopback).
    #[arg(long)]
    listen: SocketAddr,
    /// This server's QUIC-LB server ID, hex; none: random connection IDs of
    /// 8 octets (what a server without QUIC-LB issues).
    #[arg(long)]
    server_id: Option<String>,
    #[command(flatten)]
    cid: CidArgs,
    /// The name the server gives in each download's first line.
    #[arg(long, default_value = "server")]
    name: String,
    /// Directory with cert.der and key.der (`cert`).
    #[arg(long)]
    cert_dir: PathBuf,
    /// Exit after this many seconds.
    #[arg(long, default_value_t = 60)]
    duration_s: u64,
}

#[derive(Args)]
struct ClientArgs {
    /// The VIP and port.
    #[arg(long)]
    connect: SocketAddr,
    /// Connections, run at once.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Octets each downloads.
    #[arg(long, default_value_t = 1 << 20)]
    bytes: u64,
    /// Rebinds per connection, spread evenly over the download.
    #[arg(long, default_value_t = 2)]
    migrations: usize,
    /// Local addresses to rebind to, in turn (default: the first socket's
    /// address, a new port each time).
    #[arg(long, value_delimiter = ',')]
    bind: Vec<IpAddr>,
    /// Directory with cert.der (`cert`).
    #[arg(long)]
    cert_dir: PathBuf,
    /// Give up on a download after this many seconds.
    #[arg(long, default_value_t = 20)]
    timeout_s: u64,
}

fn from_hex(s: &str) -> anyhow::Result<Vec<u8>> {
    quic_lb::parse_hex(s).with_context(|| format!("{s:?}"))
}

/// The client's flow-control window per stream, octets: a download of
/// several windows keeps data flowing from the server after each rebind.
const RECEIVE_WINDOW: u32 = 16 * 1024;

/// Connection IDs carrying this server's QUIC-LB server ID, nonces from the
/// kernel's random source.
struct LbCids {
    config: quic_lb::Config,
    server_id: Vec<u8>,
    random: std::fs::File,
}

impl LbCids {
    fn octets(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        // /dev/urandom does not fail short reads of this size; a failure
        // leaves zeros, which still route (the nonce only makes IDs unique).
        let _ = self.random.read_exact(&mut b);
        b
    }
}

impl quinn::ConnectionIdGenerator for LbCids {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        let r = self.octets(self.config.nonce_len() + 1);
        match self.config.encode(&self.server_id, &r[1..], r[0]) {
            Ok(cid) => quinn::ConnectionId::new(cid.as_bytes()),
            // Lengths were checked at start; unreachable in practice, and a
            // random ID is what a server without configuration issues.
            Err(_) => quinn::ConnectionId::new(&r),
        }
    }

    fn cid_len(&self) -> usize {
        self.config.cid_len()
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

fn cert_dir_files(dir: &std::path::Path) -> (PathBuf, PathBuf) {
    (dir.join("cert.der"), dir.join("key.der"))
}

fn cert(dir: PathBuf) -> anyhow::Result<()> {
    std::fs::create_dir_all(&dir)?;
    let c = rcgen::generate_simple_self_signed(vec!["quic.test".to_string()])?;
    let (cert, key) = cert_dir_files(&dir);
    std::fs::write(&cert, c.cert.der())?;
    std::fs::write(&key, c.key_pair.serialize_der())?;
    Ok(())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

async fn server(a: ServerArgs) -> anyhow::Result<()> {
    let (cert, key) = cert_dir_files(&a.cert_dir);
    let cert = rustls::pki_types::CertificateDer::from(std::fs::read(&cert)?);
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(std::fs::read(&key)?);
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key.into())?;
    tls.alpn_protocols = vec![b"fastpath-test".to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let server_config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut endpoint_config = quinn::EndpointConfig::default();
    if let Some(sid) = &a.server_id {
        let sid = from_hex(sid).context("--server-id")?;
        let key = match &a.cid.key {
            Some(k) => Some(quic_lb::parse_key(k).context("--key")?),
            None => None,
        };
        let config = quic_lb::Config::new(
            a.cid.codepoint,
            a.cid.server_id_len,
            a.cid.nonce_len,
            key,
            a.cid.length_self_encoding,
        )?;
        anyhow::ensure!(
            sid.len() == config.server_id_len(),
            "--server-id: {} octets",
            config.server_id_len()
        );
        let shared = Arc::new((config, sid));
        endpoint_config.cid_generator(move || {
            Box::new(LbCids {
                config: shared.0.clone(),
                server_id: shared.1.clone(),
                random: std::fs::File::open("/dev/urandom").expect("/dev/urandom"),
            })
        });
    }
    let socket = UdpSocket::bind(a.listen).with_context(|| format!("binding {}", a.listen))?;
    let endpoint = quinn::Endpoint::new(
        endpoint_config,
        Some(server_config),
        socket,
        Arc::new(quinn::TokioRuntime),
    )?;
    let name = Arc::new(a.name);
    let serve = async {
        while let Some(incoming) = endpoint.accept().await {
            let name = name.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    let name = name.clone();
                    tokio::spawn(async move {
                        let Ok(req) = recv.read_to_end(64).await else {
                            return;
                        };
                        let req = String::from_utf8_lossy(&req);
                        let Some(n) = req
                            .strip_prefix("GET ")
                            .and_then(|n| n.trim().parse::<u64>().ok())
                        else {
                            return;
                        };
                        if send
                            .write_all(format!("server {name}\n").as_bytes())
                            .await
                            .is_err()
                        {
                            return;
                        }
                        let chunk = vec![0x5a; 16 * 1024];
                        let mut left = n;
                        while left > 0 {
                            let k = left.min(chunk.len() as u64) as usize;
                            if send.write_all(&chunk[..k]).await.is_err() {
                                return;
                            }
                            left -= k as u64;
                        }
                        let _ = send.finish();
                        let _ = send.stopped().await;
                    });
                }
            });
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(a.duration_s), serve).await;
    endpoint.close(0u32.into(), b"done");
    Ok(())
}

/// One download's outcome.
#[derive(Default)]
struct Outcome {
    ok: bool,
    server: Option<String>,
    migrations: usize,
    error: Option<String>,
    received: u64,
}

async fn download(
    a: &ClientArgs,
    tls: Arc<quinn::crypto::rustls::QuicClientConfig>,
    index: usize,
) -> Outcome {
    let mut out = Outcome::default();
    let result = async {
        let first: IpAddr = a.bind.first().copied().unwrap_or(if a.connect.is_ipv4() {
            IpAddr::from([0, 0, 0, 0])
        } else {
            IpAddr::from([0u16; 8])
        });
        let mut endpoint = quinn::Endpoint::client(SocketAddr::new(first, 0))?;
        // A small receive window keeps the server sending after each
        // rebind: with quinn's default window the whole download could sit
        // in the client's buffers before it moves, and never cross the
        // network from the new address.
        let mut transport = quinn::TransportConfig::default();
        transport.stream_receive_window(quinn::VarInt::from_u32(RECEIVE_WINDOW));
        transport.receive_window(quinn::VarInt::from_u32(2 * RECEIVE_WINDOW));
        let mut config = quinn::ClientConfig::new(tls);
        config.transport_config(Arc::new(transport));
        endpoint.set_default_client_config(config);
        let conn = endpoint.connect(a.connect, "quic.test")?.await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(format!("GET {}\n", a.bytes).as_bytes())
            .await?;
        send.finish()?;
        let mut line = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        // The header line.
        while !line.contains(&b'\n') {
            let n = recv
                .read(&mut buf)
                .await?
                .ok_or_else(|| anyhow::anyhow!("stream ended in the header"))?;
            line.extend_from_slice(&buf[..n]);
        }
        let nl = line.iter().position(|&b| b == b'\n').unwrap_or(0);
        out.server = Some(
            String::from_utf8_lossy(&line[..nl])
                .trim_start_matches("server ")
                .to_string(),
        );
        out.received = (line.len() - nl - 1) as u64;
        let step = a.bytes / (a.migrations as u64 + 1);
        let mut next = step;
        while out.received < a.bytes {
            if out.migrations < a.migrations && out.received >= next {
                let addr = a
                    .bind
                    .get((out.migrations + 1 + index) % a.bind.len().max(1))
                    .copied()
                    .unwrap_or(first);
                let socket = UdpSocket::bind(SocketAddr::new(addr, 0))?;
                endpoint.rebind(socket)?;
                out.migrations += 1;
                next += step;
            }
            match recv.read(&mut buf).await? {
                Some(n) => out.received += n as u64,
                None => break,
            }
        }
        anyhow::ensure!(
            out.received == a.bytes,
            "{} of {} octets",
            out.received,
            a.bytes
        );
        conn.close(0u32.into(), b"done");
        endpoint.wait_idle().await;
        anyhow::Ok(())
    };
    match tokio::time::timeout(Duration::from_secs(a.timeout_s), result).await {
        Ok(Ok(())) => out.ok = true,
        Ok(Err(e)) => out.error = Some(format!("{e:#}")),
        Err(_) => out.error = Some(format!("not done within {} s", a.timeout_s)),
    }
    out
}

async fn client(a: ClientArgs) -> anyhow::Result<()> {
    let (cert, _) = cert_dir_files(&a.cert_dir);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from(std::fs::read(
        &cert,
    )?))?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"fastpath-test".to_vec()];
    let tls = Arc::new(quinn::crypto::rustls::QuicClientConfig::try_from(tls)?);
    let a = Arc::new(a);
    let started = Instant::now();
    let results = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..a.connections {
        let (a, tls, results) = (a.clone(), tls.clone(), results.clone());
        tasks.push(tokio::spawn(async move {
            let o = download(&a, tls, i).await;
            if let Ok(mut r) = results.lock() {
                r.push(o);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let results = std::mem::take(&mut *results.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    let ok = results.iter().filter(|o| o.ok).count();
    let mut servers = std::collections::BTreeMap::<String, usize>::new();
    let mut errors = std::collections::BTreeMap::<String, usize>::new();
    for o in &results {
        if let Some(s) = &o.server {
            *servers.entry(s.clone()).or_default() += 1;
        }
        if let Some(e) = &o.error {
            *errors.entry(e.clone()).or_default() += 1;
        }
    }
    let doc = serde_json::json!({
        "connections": results.len(),
        "ok": ok,
        "broken": results.len() - ok,
        "migrations": results.iter().map(|o| o.migrations).sum::<usize>(),
        "servers": servers,
        "errors": errors,
        "seconds": started.elapsed().as_secs_f64(),
    });
    println!("{doc}");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match cli.command {
        Command::Cert { dir } => cert(dir),
        Command::Server(a) => rt.block_on(server(a)),
        Command::Client(a) => rt.block_on(client(a)),
    }
}
