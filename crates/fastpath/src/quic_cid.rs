//! `fastpath lb quic-cid`: routable QUIC connection IDs (IETF QUIC-LB) for
//! a backend's QUIC server to issue, and decoded to check one by hand.

use std::io::Read;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::report::{emit, Report};
use crate::Format;

/// Make and read routable QUIC connection IDs (IETF QUIC-LB,
/// draft-ietf-quic-load-balancers-21), as a QUIC server behind the load
/// balancer issues them and as the load balancer reads them.
///
/// A connection ID is a first octet (three bits of config rotation
/// codepoint, then the length of what follows or random bits), the server
/// ID and a nonce. Without --key they are in the clear; with a 16-octet
/// key, server ID and nonce of exactly 16 octets are one AES-128 block,
/// and any other length goes through a four-pass Feistel network with
/// AES-128 as its round function. The load balancer needs only the
/// configuration (codepoint, lengths, key) to find the server again after
/// the client's address or port changed.
///
/// Examples:
///   fastpath lb quic-cid encode --server-id-len 2 --nonce-len 6 --server-id 0a01
///   fastpath lb quic-cid encode --codepoint 1 --server-id-len 3 --nonce-len 4 \
///       --key 8f95f09245765f80256934e50c66207f --length-self-encoding \
///       --server-id ed793a --nonce ee080dbf
///   fastpath lb quic-cid decode --codepoint 1 --server-id-len 3 --nonce-len 4 \
///       --key 8f95f09245765f80256934e50c66207f 2720b1d07b359d3c --format json
///
/// `decode` exits with status 1 when the connection ID is unroutable under
/// the configuration (the report says why); `--format json` prints
/// {"routable", "codepoint", "server_id", "nonce", "cid", "encoding",
/// "unroutable"}.
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct QuicCidArgs {
    #[command(subcommand)]
    command: QuicCidCommand,
}

#[derive(Subcommand)]
enum QuicCidCommand {
    /// Issue a connection ID for a server ID (a random nonce unless --nonce).
    Encode {
        #[command(flatten)]
        config: ConfigArgs,
        /// The server's ID, hex, of --server-id-len octets.
        #[arg(long, value_name = "HEX")]
        server_id: String,
        /// The nonce, hex, of --nonce-len octets (default: random).
        #[arg(long, value_name = "HEX")]
        nonce: Option<String>,
        /// `table`: a line for people; `json`: one document.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Read a connection ID back: its server ID and nonce.
    Decode {
        #[command(flatten)]
        config: ConfigArgs,
        /// The connection ID, hex (octets past the configuration's length
        /// are ignored, as a load balancer ignores them).
        #[arg(value_name = "CID_HEX")]
        cid: String,
        /// `table`: a line for people; `json`: one document.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

/// One QUIC-LB configuration, as flags.
#[derive(Args)]
struct ConfigArgs {
    /// Config rotation codepoint, 0-6 (7 never routes).
    #[arg(long, default_value_t = 0)]
    codepoint: u8,
    /// Server ID length, octets (at least 1).
    #[arg(long)]
    server_id_len: usize,
    /// Nonce length, octets (at least 4; server ID and nonce at most 19).
    #[arg(long)]
    nonce_len: usize,
    /// AES-128 key, 32 hex digits; none: plaintext.
    #[arg(long, value_name = "HEX")]
    key: Option<String>,
    /// Servers write the length of what follows into the first octet.
    #[arg(long)]
    length_self_encoding: bool,
}

impl ConfigArgs {
    fn config(&self) -> anyhow::Result<quic_lb::Config> {
        let key = match &self.key {
            None => None,
            Some(k) => Some(quic_lb::parse_key(k).with_context(|| format!("--key {k:?}"))?),
        };
        Ok(quic_lb::Config::new(
            self.codepoint,
            self.server_id_len,
            self.nonce_len,
            key,
            self.length_self_encoding,
        )?)
    }
}

/// Octets from hex digits (an optional `0x`; whole octets only).
fn from_hex(s: &str) -> anyhow::Result<Vec<u8>> {
    quic_lb::parse_hex(s).with_context(|| format!("{s:?}"))
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What `quic-cid` prints.
#[derive(Serialize)]
struct CidReport {
    routable: bool,
    codepoint: u8,
    encoding: &'static str,
    server_id: Option<String>,
    nonce: Option<String>,
    cid: String,
    /// Why the connection ID does not route, when it does not.
    unroutable: Option<String>,
}

impl Report for CidReport {
    fn to_text(&self) -> String {
        match (&self.unroutable, &self.server_id, &self.nonce) {
            (Some(why), _, _) => format!("{}  unroutable: {why}", self.cid),
            (None, Some(sid), Some(nonce)) => format!(
                "{}  codepoint {}  server ID {sid}  nonce {nonce}  ({})",
                self.cid, self.codepoint, self.encoding
            ),
            _ => self.cid.clone(),
        }
    }
}

/// Octets from the kernel's random source (a nonce, the first octet's
/// random bits).
fn random(n: usize) -> anyhow::Result<Vec<u8>> {
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("reading /dev/urandom")?;
    Ok(b)
}

/// Runs `fastpath lb quic-cid`.
pub fn run(a: QuicCidArgs) -> anyhow::Result<()> {
    match a.command {
        QuicCidCommand::Encode {
            config,
            server_id,
            nonce,
            format,
        } => {
            let cfg = config.config()?;
            let sid = from_hex(&server_id).context("--server-id")?;
            let rnd = random(cfg.nonce_len() + 1)?;
            let nonce = match nonce {
                Some(n) => from_hex(&n).context("--nonce")?,
                None => rnd[1..].to_vec(),
            };
            let cid = cfg.encode(&sid, &nonce, rnd[0])?;
            emit(
                format,
                &CidReport {
                    routable: true,
                    codepoint: cfg.codepoint(),
                    encoding: cfg.encoding().name(),
                    server_id: Some(to_hex(&sid)),
                    nonce: Some(to_hex(&nonce)),
                    cid: to_hex(cid.as_bytes()),
                    unroutable: None,
                },
            )
        }
        QuicCidCommand::Decode {
            config,
            cid,
            format,
        } => {
            let cfg = config.config()?;
            let octets = from_hex(&cid).context("the connection ID")?;
            let report = match cfg.decode(&octets) {
                Ok(d) => CidReport {
                    routable: true,
                    codepoint: d.codepoint,
                    encoding: cfg.encoding().name(),
                    server_id: Some(to_hex(d.server_id.as_bytes())),
                    nonce: Some(to_hex(d.nonce.as_bytes())),
                    cid: to_hex(&octets),
                    unroutable: None,
                },
                Err(why) => CidReport {
                    routable: false,
                    codepoint: octets.first().map_or(0, |b| b >> 5),
                    encoding: cfg.encoding().name(),
                    server_id: None,
                    nonce: None,
                    cid: to_hex(&octets),
                    unroutable: Some(why.to_string()),
                },
            };
            emit(format, &report)?;
            match report.unroutable {
                Some(why) => anyhow::bail!("unroutable: {why}"),
                None => Ok(()),
            }
        }
    }
}
