//! `[[quic_lb]]`: routing QUIC by connection ID (IETF QUIC-LB,
//! draft-ietf-quic-load-balancers-21). A VIP with `quic = true` reads the
//! destination connection ID of each UDP datagram; a routable one names the
//! backend whose `quic_server_id` it carries, whatever the client's address
//! and port, so a connection survives the client's migration.
//!
//! ```toml
//! [[quic_lb]]                   # one per config rotation codepoint, 0-6
//! codepoint = 0
//! server_id_len = 2             # octets; every configuration the same
//! nonce_len = 6                 # octets, at least 4; at most 19 together
//! key_file = "/etc/fastpath/quic-lb-0.key"   # 32 hex digits; or key = "...";
//!                                            # neither: plaintext
//! length_self_encoding = true   # servers write the CID length in octet 1
//!
//! [[pools]]
//! name = "h3"
//! backends = [{ address = "10.1.0.1", quic_server_id = "0001" },
//!             { address = "10.1.0.2", quic_server_id = "0002" }]
//!
//! [[vips]]
//! name = "h3"
//! address = "198.18.0.10"
//! port = 443
//! protocol = "udp"
//! quic = true
//! pool = "h3"
//! ```
//!
//! Rotating a key: add the new key at a free codepoint, reload every load
//! balancer, then give it to the servers (they issue new connection IDs with
//! it and retire the old ones); remove the old codepoint once its
//! connections have ended. Load balancers learn a configuration before the
//! servers use it, as the draft asks.
//!
//! Every configuration shares one server ID allocation (a backend has one
//! `quic_server_id`), which the draft allows for configurations of one
//! server ID length: so all of them have the same `server_id_len`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{problem, Config, Problem};

/// `[[quic_lb]]`: one QUIC-LB configuration.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct QuicLbConf {
    /// Config rotation codepoint, 0-6.
    pub codepoint: u8,
    /// Server ID length, octets (at least 1).
    pub server_id_len: usize,
    /// Nonce length, octets (at least 4; at most 19 with the server ID).
    pub nonce_len: usize,
    /// The AES-128 key as 32 hex digits written here (a file of its own,
    /// `key_file`, keeps it out of a world-readable configuration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A file whose first line is the key, 32 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// Servers write the connection ID's length into its first octet; the
    /// load balancer then checks a long header's length against it.
    #[serde(default)]
    pub length_self_encoding: bool,
}

/// Why a QUIC-LB key or configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum QuicConfError {
    /// The key file could not be read.
    #[error("quic_lb key file {path}: {why}")]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// The key is not 32 hex digits.
    #[error("{0}")]
    Key(String),
    /// The lengths or codepoint are not QUIC-LB's.
    #[error(transparent)]
    Config(#[from] quic_lb::ConfigError),
}

/// A key from hex: 32 digits, an optional `0x` ([`quic_lb::parse_key`]).
fn parse_key(text: &str) -> Result<quic_lb::Key, String> {
    quic_lb::parse_key(text.trim())
        .map_err(|e| format!("a QUIC-LB key is 32 hex digits (AES-128): {e}"))
}

/// Octets of a server ID written in hex (`quic_server_id`), at least one
/// ([`quic_lb::parse_hex`]).
pub(super) fn parse_server_id(text: &str) -> Result<Vec<u8>, String> {
    match quic_lb::parse_hex(text) {
        Ok(octets) if octets.is_empty() => Err(format!(
            "{text:?} is not whole octets of hex (an even number of digits, at least 2)"
        )),
        Ok(octets) => Ok(octets),
        Err(e) => Err(format!("{text:?}: {e}")),
    }
}

impl QuicLbConf {
    /// The key: `key`, or the first line of `key_file` (a regular file of at
    /// most 4 KiB), or none.
    pub fn read_key(&self) -> Result<Option<quic_lb::Key>, QuicConfError> {
        match (&self.key, &self.key_file) {
            (Some(k), _) => parse_key(k).map(Some).map_err(QuicConfError::Key),
            (None, Some(path)) => read_key_file(path).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// The configuration as QUIC-LB's types, its key read.
    pub fn build(&self) -> Result<quic_lb::Config, QuicConfError> {
        Ok(quic_lb::Config::new(
            self.codepoint,
            self.server_id_len,
            self.nonce_len,
            self.read_key()?,
            self.length_self_encoding,
        )?)
    }
}

fn read_key_file(path: &Path) -> Result<quic_lb::Key, QuicConfError> {
    let err = |why: String| QuicConfError::KeyFile {
        path: path.to_path_buf(),
        why,
    };
    let bytes = super::load::read_small_file(path, 4096).map_err(err)?;
    let text = String::from_utf8(bytes).map_err(|_| err("not UTF-8 text".into()))?;
    parse_key(text.lines().next().unwrap_or("")).map_err(err)
}

impl Config {
    /// The `[[quic_lb]]` configurations by codepoint, keys read (the daemon
    /// builds its routing from this; [`Config::load`] calls it so that a key
    /// file that cannot be read is refused where the file is checked).
    pub fn quic_configs(&self) -> Result<quic_lb::Configs, QuicConfError> {
        let mut set = quic_lb::Configs::new();
        for q in &self.quic_lb {
            set.insert(q.build()?)?;
        }
        Ok(set)
    }

    /// `[[quic_lb]]`, `quic = true` VIPs and `quic_server_id`s together: the
    /// configurations are QUIC-LB's and share one server ID length; a QUIC
    /// VIP is UDP and has configurations to route by; every backend of its
    /// pool (includes too) has a server ID of that length, unique in the
    /// pool.
    pub(super) fn check_quic(&self) -> Result<(), Problem> {
        let mut codepoints = HashMap::new();
        for (i, q) in self.quic_lb.iter().enumerate() {
            let key = |k: &str| format!("quic_lb[{i}].{k}");
            if let Some(j) = codepoints.insert(q.codepoint, i) {
                return problem(
                    key("codepoint"),
                    format!("codepoint {} is also quic_lb[{j}]'s", q.codepoint),
                );
            }
            if let Err(e) =
                quic_lb::Config::new(q.codepoint, q.server_id_len, q.nonce_len, None, false)
            {
                let k = match e {
                    quic_lb::ConfigError::Codepoint(_) => "codepoint",
                    quic_lb::ConfigError::ServerIdLen(_) => "server_id_len",
                    _ => "nonce_len",
                };
                return problem(key(k), e.to_string());
            }
            if q.key.is_some() && q.key_file.is_some() {
                return problem(key("key"), "give the key or key_file, not both".to_string());
            }
            if let Some(k) = &q.key {
                parse_key(k).or_else(|e| problem(key("key"), e))?;
            }
            if let Some(first) = self.quic_lb.first() {
                if q.server_id_len != first.server_id_len {
                    return problem(
                        key("server_id_len"),
                        format!(
                            "{} octets, while quic_lb[0] has {}: every configuration shares the \
                             backends' one quic_server_id, so all have one server ID length",
                            q.server_id_len, first.server_id_len
                        ),
                    );
                }
            }
        }
        let sid_len = self.quic_lb.first().map(|q| q.server_id_len);
        let index = self.pool_index();
        let mut checked_pools = std::collections::HashSet::new();
        for (i, v) in self.vips.iter().enumerate() {
            if !v.quic {
                continue;
            }
            let key = |k: &str| format!("vips[{i}].{k}");
            if v.protocol != super::Protocol::Udp {
                return problem(
                    key("quic"),
                    "QUIC runs over UDP: a quic VIP has protocol = \"udp\"".to_string(),
                );
            }
            let Some(sid_len) = sid_len else {
                return problem(
                    key("quic"),
                    "no [[quic_lb]] configuration to route QUIC connection IDs by".to_string(),
                );
            };
            if !checked_pools.insert(v.pool.as_str()) {
                continue;
            }
            // A cycle was reported by the pools' own check before this.
            let Ok(members) = self.members_as_written(&index, &v.pool) else {
                continue;
            };
            let mut seen: HashMap<Vec<u8>, String> = HashMap::new();
            for (b, _) in &members {
                let name = b.display_name();
                let Some(text) = &b.quic_server_id else {
                    return problem(
                        key("pool"),
                        format!(
                            "backend {name} of pool {:?} has no quic_server_id: QUIC VIP {:?} \
                             routes connection IDs to backends by it",
                            v.pool, v.name
                        ),
                    );
                };
                let sid = parse_server_id(text).or_else(|e| {
                    problem(key("pool"), format!("backend {name}'s quic_server_id: {e}"))
                })?;
                if sid.len() != sid_len {
                    return problem(
                        key("pool"),
                        format!(
                            "backend {name}'s quic_server_id {text:?} is {} octets; \
                             [[quic_lb]] server_id_len is {sid_len}",
                            sid.len()
                        ),
                    );
                }
                if let Some(other) = seen.insert(sid, name.clone()) {
                    return problem(
                        key("pool"),
                        format!(
                            "backends {other} and {name} of pool {:?} have one quic_server_id \
                             ({text}): a connection ID would name both",
                            v.pool
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra_quic: &str, backends: &str, vip: &str) -> Result<Config, String> {
        let text = format!(
            r#"
[encap]
source = "10.0.0.1"
{extra_quic}
[[pools]]
name = "h3"
backends = [{backends}]

[[vips]]
name = "h3"
address = "198.18.0.10"
port = 443
pool = "h3"
{vip}
"#
        );
        Config::parse(&text, "t.toml").map_err(|e| e.to_string())
    }

    const ONE: &str = "[[quic_lb]]\ncodepoint = 0\nserver_id_len = 2\nnonce_len = 6\nkey = \"8f95f09245765f80256934e50c66207f\"\n";
    const TWO: &str = "{ address = \"10.1.0.1\", quic_server_id = \"0001\" }, { address = \"10.1.0.2\", quic_server_id = \"0002\" }";

    #[test]
    fn a_whole_quic_configuration_builds_its_routing() {
        let c = cfg(ONE, TWO, "protocol = \"udp\"\nquic = true").expect("valid");
        let set = c.quic_configs().expect("keys");
        let conf = set.get(0).expect("codepoint 0");
        assert_eq!(conf.encoding(), quic_lb::Encoding::FourPass);
        let cid = conf
            .encode(&[0, 2], &[1, 2, 3, 4, 5, 6], 0)
            .expect("encode");
        assert_eq!(
            set.route_short(cid.as_bytes())
                .expect("routes")
                .1
                .as_bytes(),
            &[0, 2]
        );
    }

    #[test]
    fn mistakes_are_refused_by_key() {
        let cases = [
            (ONE, TWO, "protocol = \"tcp\"\nquic = true", "vips[0].quic", "over UDP"),
            ("", TWO, "protocol = \"udp\"\nquic = true", "vips[0].quic", "no [[quic_lb]]"),
            (ONE, "{ address = \"10.1.0.1\" }", "protocol = \"udp\"\nquic = true", "vips[0].pool", "no quic_server_id"),
            (ONE, "{ address = \"10.1.0.1\", quic_server_id = \"01\" }", "protocol = \"udp\"\nquic = true", "vips[0].pool", "is 1 octets"),
            (ONE, "{ address = \"10.1.0.1\", quic_server_id = \"0001\" }, { address = \"10.1.0.2\", quic_server_id = \"0x0001\" }", "protocol = \"udp\"\nquic = true", "vips[0].pool", "have one quic_server_id"),
            (ONE, "{ address = \"10.1.0.1\", quic_server_id = \"00g1\" }", "protocol = \"udp\"\nquic = true", "vips[0].pool", "not hex"),
            (ONE, "{ address = \"10.1.0.1\", quic_server_id = \"+001\" }", "protocol = \"udp\"\nquic = true", "vips[0].pool", "not hex"),
            ("[[quic_lb]]\ncodepoint = 7\nserver_id_len = 2\nnonce_len = 6\n", TWO, "protocol = \"udp\"\nquic = true", "quic_lb[0].codepoint", "0-6"),
            ("[[quic_lb]]\ncodepoint = 1\nserver_id_len = 2\nnonce_len = 3\n", TWO, "protocol = \"udp\"\nquic = true", "quic_lb[0].nonce_len", "at least 4"),
            ("[[quic_lb]]\ncodepoint = 1\nserver_id_len = 10\nnonce_len = 10\n", TWO, "protocol = \"udp\"\nquic = true", "quic_lb[0].nonce_len", "at most 19"),
            ("[[quic_lb]]\ncodepoint = 1\nserver_id_len = 2\nnonce_len = 6\nkey = \"00ff\"\n", TWO, "protocol = \"udp\"\nquic = true", "quic_lb[0].key", "32 hex digits"),
            ("[[quic_lb]]\ncodepoint = 1\nserver_id_len = 2\nnonce_len = 6\n[[quic_lb]]\ncodepoint = 1\nserver_id_len = 2\nnonce_len = 5\n", TWO, "protocol = \"udp\"\nquic = true", "quic_lb[1].codepoint", "also quic_lb[0]"),
            ("[[quic_lb]]\ncodepoint = 1\nserver_id_len = 2\nnonce_len = 6\n[[quic_lb]]\ncodepoint = 2\nserver_id_len = 3\nnonce_len = 5\n", TWO, "protocol = \"udp\"\nquic = true", "quic_lb[1].server_id_len", "one server ID length"),
            ("[[quic_lb]]\ncodepoint = 1\nserver_id_len = 2\nnonce_len = 6\nkey = \"8f95f09245765f80256934e50c66207f\"\nkey_file = \"/k\"\n", TWO, "protocol = \"udp\"\nquic = true", "quic_lb[0].key", "not both"),
        ];
        for (quic, backends, vip, key, says) in cases {
            let err = cfg(quic, backends, vip).expect_err(says);
            assert!(
                err.contains(key) && err.contains(says),
                "want {key}: {says}; got {err}"
            );
        }
    }

    #[test]
    fn a_key_file_is_read_bounded_and_checked() {
        let dir = std::env::temp_dir().join(format!("fastpath-quic-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let good = dir.join("good.key");
        std::fs::write(&good, "8f95f09245765f80256934e50c66207f\n").expect("write");
        let bad = dir.join("bad.key");
        std::fs::write(&bad, "not a key\n").expect("write");
        let conf = |p: &Path| QuicLbConf {
            codepoint: 0,
            server_id_len: 2,
            nonce_len: 6,
            key: None,
            key_file: Some(p.to_path_buf()),
            length_self_encoding: false,
        };
        assert!(conf(&good).read_key().expect("read").is_some());
        let e = conf(&bad).read_key().expect_err("bad key").to_string();
        assert!(e.contains("32 hex digits") && e.contains("bad.key"), "{e}");
        let e = conf(&dir.join("missing"))
            .read_key()
            .expect_err("missing")
            .to_string();
        assert!(e.contains("missing"), "{e}");
        // A device is not a key file (and is not read for ever).
        let e = conf(Path::new("/dev/zero"))
            .read_key()
            .expect_err("device")
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).expect("clean");
    }
}
