//! How to reach the etcd cluster: its endpoints, a deadline, and what a
//! production cluster asks of its clients (TLS with the cluster's CA, a
//! client certificate, a user and password), given on the command line or
//! in a small bootstrap file that a load balancer and an operator share:
//!
//! ```toml
//! endpoints = ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]
//! prefix = "/fastpath/edge"
//! name = "lb1"              # optional: this load balancer's name
//! timeout_ms = 5000         # optional: the deadline of every call
//!
//! [tls]
//! ca = "/etc/fastpath/etcd-ca.pem"     # the members' CA
//! cert = "/etc/fastpath/lb1.pem"       # optional: a client certificate
//! key = "/etc/fastpath/lb1-key.pem"    #   and its key (mode 0600)
//! domain = "etcd.internal"             # optional: the members' name
//!
//! [auth]
//! user = "fastpath-lb1"
//! password_file = "/etc/fastpath/etcd-password"   # mode 0600
//! ```
//!
//! Everything is read and checked when the file is loaded, before anything
//! connects: a missing file, an `http://` endpoint beside `[tls]`, a key
//! or password readable by others are each refused with the file named.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The largest bootstrap, certificate, key or password file read.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// How often the client pings a member over HTTP/2 while a call is open
/// (a watch). etcd turns away a client that pings more often than its
/// `--grpc-keepalive-min-time` (5 s by default) while it sends nothing
/// back: it closes the connection, which ends every watch on it.
pub const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);
/// The deadline of every call when the file does not say.
pub const DEFAULT_TIMEOUT_MS: u64 = 5000;

/// Why a bootstrap file or what it names cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// A file is larger than [`MAX_FILE_BYTES`].
    #[error("{path}: {bytes} bytes, more than the {max} a bootstrap, certificate, key or password file may have")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        bytes: u64,
        /// The bound.
        max: u64,
    },
    /// The bootstrap file is not what it should be.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: toml::de::Error,
    },
    /// A value that cannot work.
    #[error("{path}: {what}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, and what to do.
        what: String,
    },
    /// A secret others can read.
    #[error("{path}: readable by others (mode {mode:o}); a key or password file must be readable by its owner only (chmod 600)")]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
}

/// The `[tls]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFiles {
    ca: PathBuf,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    domain: Option<String>,
}

/// The `[auth]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthFiles {
    user: String,
    password_file: PathBuf,
}

/// The bootstrap file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    endpoints: Vec<String>,
    prefix: Option<String>,
    name: Option<String>,
    timeout_ms: Option<u64>,
    tls: Option<TlsFiles>,
    auth: Option<AuthFiles>,
}

/// TLS toward the members, read from the files named.
#[derive(Clone)]
pub struct Tls {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
}

/// A user and password toward the cluster.
#[derive(Clone)]
pub struct Auth {
    user: String,
    password: String,
}

/// Everything a client needs to reach the cluster.
#[derive(Clone)]
pub struct Access {
    /// The members' client URLs.
    pub endpoints: Vec<String>,
    /// The deadline of every call.
    pub deadline: Duration,
    tls: Option<Tls>,
    auth: Option<Auth>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password, nor the key.
        f.debug_struct("Access")
            .field("endpoints", &self.endpoints)
            .field("deadline", &self.deadline)
            .field("tls", &self.tls.is_some())
            .field("user", &self.auth.as_ref().map(|a| a.user.as_str()))
            .finish()
    }
}

/// A bootstrap file, loaded: how to reach the cluster, and the prefix and
/// name it gives.
#[derive(Debug, Clone)]
pub struct Bootstrap {
    /// How to reach the cluster.
    pub access: Access,
    /// The fleet's prefix, if the file gives it.
    pub prefix: Option<String>,
    /// This load balancer's name, if the file gives it.
    pub name: Option<String>,
}

impl Access {
    /// The plain form: `endpoints` over http, each call bounded by
    /// `deadline`.
    pub fn plain(endpoints: Vec<String>, deadline: Duration) -> Access {
        Access {
            endpoints,
            deadline,
            tls: None,
            auth: None,
        }
    }

    /// Whether TLS is used.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The user, if any.
    pub fn user(&self) -> Option<&str> {
        self.auth.as_ref().map(|a| a.user.as_str())
    }

    /// etcd-client's options for one member, each connection attempt
    /// bounded by `connect`.
    pub(crate) fn options(&self, connect: Duration) -> etcd_client::ConnectOptions {
        let mut o = etcd_client::ConnectOptions::new()
            .with_connect_timeout(connect)
            .with_timeout(self.deadline)
            .with_keep_alive(KEEP_ALIVE_EVERY, self.deadline.max(Duration::from_secs(1)))
            // A member cut off from its leader answers nothing rather
            // than a stale view: a watch through it is cancelled and
            // redone elsewhere.
            .with_require_leader(true);
        if let Some(t) = &self.tls {
            let mut tls = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(&t.ca_pem));
            if let Some((cert, key)) = &t.identity {
                tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
            }
            if let Some(d) = &t.domain {
                tls = tls.domain_name(d.clone());
            }
            o = o.with_tls(tls);
        }
        if let Some(a) = &self.auth {
            o = o.with_user(a.user.clone(), a.password.clone());
        }
        o
    }
}

/// Reads `path`, at most [`MAX_FILE_BYTES`]; with `secret`, refuses a file
/// that others can read.
fn read(path: &Path, secret: bool) -> Result<Vec<u8>, AccessError> {
    let err = |source| AccessError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(err)?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(AccessError::TooLarge {
            path: path.to_path_buf(),
            bytes: meta.len(),
            max: MAX_FILE_BYTES,
        });
    }
    let mode = meta.permissions().mode() & 0o777;
    if secret && mode & 0o077 != 0 {
        return Err(AccessError::Exposed {
            path: path.to_path_buf(),
            mode,
        });
    }
    std::fs::read(path).map_err(err)
}

impl Bootstrap {
    /// What a command line gives: the bootstrap file `file` if any, else
    /// plain `endpoints` with `deadline` (no prefix or name: the caller's
    /// flags give them, and they override the file's).
    pub fn from_args(
        file: Option<&Path>,
        endpoints: Vec<String>,
        deadline: Duration,
    ) -> Result<Bootstrap, AccessError> {
        match file {
            Some(f) => Bootstrap::load(f),
            None => Ok(Bootstrap {
                access: Access::plain(endpoints, deadline),
                prefix: None,
                name: None,
            }),
        }
    }

    /// Loads the bootstrap file `path` and every file it names.
    pub fn load(path: &Path) -> Result<Bootstrap, AccessError> {
        let bytes = read(path, false)?;
        let text = String::from_utf8_lossy(&bytes);
        let file: File = toml::from_str(&text).map_err(|source| AccessError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |what: String| AccessError::Invalid {
            path: path.to_path_buf(),
            what,
        };
        if file.endpoints.is_empty() {
            return Err(invalid(
                "endpoints: at least one member's client URL".into(),
            ));
        }
        let scheme = if file.tls.is_some() {
            "https://"
        } else {
            "http://"
        };
        if let Some(e) = file.endpoints.iter().find(|e| !e.starts_with(scheme)) {
            return Err(invalid(format!(
                "endpoint {e}: {} expects {scheme} endpoints",
                if file.tls.is_some() {
                    "[tls]"
                } else {
                    "without [tls], the file"
                }
            )));
        }
        if let Some(p) = file.prefix.as_deref().filter(|p| !p.starts_with('/')) {
            return Err(invalid(format!("prefix {p:?}: must start with /")));
        }
        let timeout_ms = file.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
        if !(100..=600_000).contains(&timeout_ms) {
            return Err(invalid(format!(
                "timeout_ms = {timeout_ms}: between 100 and 600000"
            )));
        }
        let tls = match &file.tls {
            None => None,
            Some(t) => {
                let identity =
                    match (&t.cert, &t.key) {
                        (Some(c), Some(k)) => Some((read(c, false)?, read(k, true)?)),
                        (None, None) => None,
                        _ => return Err(invalid(
                            "[tls]: cert and key go together (a client certificate and its key)"
                                .into(),
                        )),
                    };
                Some(Tls {
                    ca_pem: read(&t.ca, false)?,
                    identity,
                    domain: t.domain.clone(),
                })
            }
        };
        let auth = match &file.auth {
            None => None,
            Some(a) => {
                let password = read(&a.password_file, true)?;
                let password = String::from_utf8_lossy(&password).trim_end().to_string();
                if a.user.is_empty() || password.is_empty() {
                    return Err(invalid(
                        "[auth]: a user and a non-empty password file".into(),
                    ));
                }
                Some(Auth {
                    user: a.user.clone(),
                    password,
                })
            }
        };
        Ok(Bootstrap {
            access: Access {
                endpoints: file.endpoints,
                deadline: Duration::from_millis(timeout_ms),
                tls,
                auth,
            },
            prefix: file.prefix,
            name: file.name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fleetconf-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn write(path: &Path, text: &str, mode: u32) {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_complete_file_is_loaded_and_its_secrets_never_printed() {
        let d = dir("ok");
        write(&d.join("ca.pem"), "CA", 0o644);
        write(&d.join("c.pem"), "CERT", 0o644);
        write(&d.join("k.pem"), "KEY", 0o600);
        write(&d.join("pw"), "s3cret\n", 0o600);
        let f = d.join("etcd.toml");
        write(
            &f,
            &format!(
                "endpoints = [\"https://198.19.250.1:2379\"]\nprefix = \"/fastpath/edge\"\nname = \"lb1\"\n\
                 [tls]\nca = \"{0}/ca.pem\"\ncert = \"{0}/c.pem\"\nkey = \"{0}/k.pem\"\n\
                 [auth]\nuser = \"u\"\npassword_file = \"{0}/pw\"\n",
                d.display()
            ),
            0o644,
        );
        let b = Bootstrap::load(&f).unwrap();
        assert_eq!(b.prefix.as_deref(), Some("/fastpath/edge"));
        assert_eq!(b.name.as_deref(), Some("lb1"));
        assert!(b.access.uses_tls());
        assert_eq!(b.access.user(), Some("u"));
        assert_eq!(b.access.deadline, Duration::from_millis(DEFAULT_TIMEOUT_MS));
        let shown = format!("{b:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("KEY"),
            "{shown}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn mistakes_are_refused_naming_the_file() {
        let d = dir("bad");
        write(&d.join("ca.pem"), "CA", 0o644);
        write(&d.join("pw"), "x", 0o644);
        let f = d.join("etcd.toml");
        let cases = [
            ("endpoints = []\n", "at least one"),
            (
                "endpoints = [\"http://a:2379\"]\n[tls]\nca = \"CA\"\n",
                "expects https://",
            ),
            ("endpoints = [\"https://a:2379\"]\n", "expects http://"),
            (
                "endpoints = [\"http://a:2379\"]\nprefix = \"edge\"\n",
                "must start with /",
            ),
            (
                "endpoints = [\"http://a:2379\"]\ntimeout_ms = 5\n",
                "between",
            ),
            (
                "endpoints = [\"http://a:2379\"]\npasword = 1\n",
                "unknown field",
            ),
            (
                "endpoints = [\"http://a:2379\"]\n[auth]\nuser = \"u\"\npassword_file = \"PW\"\n",
                "chmod 600",
            ),
            (
                "endpoints = [\"https://a:2379\"]\n[tls]\nca = \"CA\"\ncert = \"CA\"\n",
                "cert and key go together",
            ),
            (
                "endpoints = [\"https://a:2379\"]\n[tls]\nca = \"/nonexistent/ca.pem\"\n",
                "/nonexistent/ca.pem",
            ),
        ];
        for (text, want) in cases {
            let text = text
                .replace("\"CA\"", &format!("\"{}/ca.pem\"", d.display()))
                .replace("\"PW\"", &format!("\"{}/pw\"", d.display()));
            write(&f, &text, 0o644);
            let e = Bootstrap::load(&f).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
            assert!(
                e.contains("etcd.toml") || e.contains("/nonexistent") || e.contains("/pw"),
                "{e}"
            );
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
