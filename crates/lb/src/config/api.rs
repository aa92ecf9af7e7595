//! `[api]`: the HTTP control API and its token.

use serde::{Deserialize, Serialize};

use super::{problem, Problem};

/// `[api]`: the HTTP control API.
///
/// ```toml
/// [api]
/// listen = "127.0.0.1:9180"  # off when absent; elsewhere than loopback needs token_file
/// # token_file = "/etc/fastpath/token"
/// # token_for_reads = true
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Api {
    /// Where to serve `/metrics`, `/status` and `POST /reload` (off when
    /// absent), on a port other than 0. Keep it on a loopback or management address; any other
    /// address needs `token_file`.
    pub listen: Option<std::net::SocketAddr>,
    /// A file whose first line is a bearer token (at least 16 characters):
    /// requests that change the load balancer (`POST /reload`) must carry
    /// `Authorization: Bearer <token>`. Required when `listen` is not a
    /// loopback address.
    pub token_file: Option<std::path::PathBuf>,
    /// Whether reads (`GET /status`, `GET /metrics`) need the token too.
    /// Unset: they do when `listen` is not a loopback address and there is
    /// a token (a data address is reachable by whoever reaches the
    /// machine, and `/status` names every backend); on loopback they stay
    /// open, for a local Prometheus and `fastpath lb status`. `true` needs
    /// `token_file`; `false` keeps reads open on any address (a scraper
    /// that cannot send a token, behind a firewall).
    pub token_for_reads: Option<bool>,
}

impl Api {
    /// Whether reads need the token (see [`Api::token_for_reads`]).
    pub fn reads_need_token(&self) -> bool {
        self.token_file.is_some()
            && self
                .token_for_reads
                .unwrap_or_else(|| self.listen.is_some_and(|l| !l.ip().is_loopback()))
    }
}

impl Api {
    /// `[api]`: anyone who reaches a non-loopback API could reconfigure the
    /// load balancer, so such an address needs a token.
    pub(super) fn check(&self) -> Result<(), Problem> {
        if let Some(addr) = self.listen {
            // Port 0 would bind a port the kernel picks, which nobody
            // (`fastpath lb status`, Prometheus) could find.
            if addr.port() == 0 {
                return problem(
                    "api.listen".into(),
                    format!(
                        "{addr} has port 0 (the kernel would pick one nobody knows): give a \
                         port, like 127.0.0.1:9180"
                    ),
                );
            }
            if !addr.ip().is_loopback() && self.token_file.is_none() {
                return problem(
                    "api.listen".into(),
                    format!(
                        "{addr} is reachable from other machines: set api.token_file \
                         (a file holding a bearer token) or listen on 127.0.0.1"
                    ),
                );
            }
        }
        if self.token_for_reads == Some(true) && self.token_file.is_none() {
            return problem(
                "api.token_for_reads".into(),
                "reads cannot need a token when there is none: set api.token_file".into(),
            );
        }
        Ok(())
    }
}
