//! The HTTP API's client, for the command line (`fastpath lb status`,
//! `reload`, `drain`, `undrain`, `weight`) and the test topologies: one
//! request per connection over plain HTTP/1.0, the paths from
//! [`crate::paths`], the answers typed ([`Status`], [`Reloaded`],
//! [`RuntimeChanged`]).
//!
//! A change meant for a fleet goes to every load balancer at once
//! ([`fleet_change`], [`fleet_reload`]): all of them are asked first
//! whether they answer (and, for a backend, know it), and nothing is
//! changed anywhere unless all do; then the change is sent to all of them
//! together, so the fleet disagrees for the time of one request, not of N
//! commands, and each load balancer's answer is reported.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use crate::paths;
use crate::reload::{Reloaded, RuntimeChanged};
use crate::runtime::Change;
use crate::status::Status;

/// Why a request to a daemon's API failed (`fastpath lb status`, `reload`,
/// `drain`, ...).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Nothing answers at the address.
    #[error("cannot reach {api}: {source} (is `lb run --interface` running with [api] listen = \"{api}\"?)")]
    Connect {
        /// The API address.
        api: std::net::SocketAddr,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The exchange broke off.
    #[error("talking to {api}: {source}")]
    Io {
        /// The API address.
        api: std::net::SocketAddr,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The answer was not HTTP.
    #[error("{api} answered something that is not HTTP")]
    Malformed {
        /// The API address.
        api: std::net::SocketAddr,
    },
    /// The connection closed without an answer.
    #[error("{api} closed the connection without answering (is it a fastpath API? is the daemon stopping?)")]
    NoAnswer {
        /// The API address.
        api: std::net::SocketAddr,
    },
    /// The API answered with an error status.
    #[error("{api} answered {status}{}", if .body.is_empty() { String::new() } else { format!(": {}", .body) })]
    Status {
        /// The API address.
        api: std::net::SocketAddr,
        /// The status line's code and reason.
        status: String,
        /// The body, trimmed (an error message, if any; for a change, the
        /// daemon's reason).
        body: String,
    },
    /// The API answered with an empty document.
    #[error("{api} answered {path} with an empty body")]
    Empty {
        /// The API address.
        api: std::net::SocketAddr,
        /// The path asked for.
        path: String,
    },
    /// The answer was not the document expected.
    #[error("unexpected {path} document: {source}")]
    Document {
        /// The path asked for.
        path: &'static str,
        /// What did not parse.
        #[source]
        source: serde_json::Error,
    },
    /// A change's answer was not the one expected.
    #[error("unexpected answer from {api}: {body}")]
    Answer {
        /// The API address.
        api: std::net::SocketAddr,
        /// The answer's body.
        body: String,
        /// What did not parse.
        #[source]
        source: serde_json::Error,
    },
    /// A backend name that a path cannot carry as it is.
    #[error("backend {backend:?}: give a backend name (letters, digits, - _ . :) or an address")]
    BackendName {
        /// The name given.
        backend: String,
    },
}

/// One request to a daemon's HTTP API; the answer's body.
pub fn api_request(
    api: std::net::SocketAddr,
    method: &str,
    path: &str,
) -> Result<String, ApiError> {
    api_request_with(api, method, path, None)
}

/// One exchange with the API, with a bearer token (`[api] token_file` of
/// the daemon, which a change such as `POST /reload` needs when the daemon
/// has one): the status (code and reason) and the body.
pub fn api_exchange(
    api: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Result<(String, String), ApiError> {
    use std::io::{Read, Write};
    let io = |source| ApiError::Io { api, source };
    let mut s = std::net::TcpStream::connect_timeout(&api, Duration::from_secs(2))
        .map_err(|source| ApiError::Connect { api, source })?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    s.write_all(
        format!(
            "{method} {path} HTTP/1.0\r\nHost: {api}\r\n{}Content-Length: 0\r\n\r\n",
            token
                .map(|t| format!("Authorization: Bearer {t}\r\n"))
                .unwrap_or_default()
        )
        .as_bytes(),
    )
    .map_err(io)?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(io)?;
    if answer.is_empty() {
        return Err(ApiError::NoAnswer { api });
    }
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or(ApiError::Malformed { api })?;
    let status = head
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("HTTP/"))
        .and_then(|l| l.split_once(' '))
        .map(|(_, code)| code.trim().to_string())
        .ok_or(ApiError::Malformed { api })?;
    Ok((status, body.to_string()))
}

/// One request to a daemon's HTTP API; the answer's body, whatever its
/// status (a rejected reload answers 400 with the reason as JSON).
pub fn api_request_with(
    api: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Result<String, ApiError> {
    api_exchange(api, method, path, token).map(|(_, body)| body)
}

/// A document from the API: a 2xx answer with a body, else an error that
/// says which (an error status with its message, or an empty answer).
pub fn api_document(api: std::net::SocketAddr, path: &str) -> Result<String, ApiError> {
    api_document_with(api, path, None)
}

/// [`api_document`] with a bearer token (a daemon whose reads need it:
/// `[api] token_for_reads`, or a token on a data address).
pub fn api_document_with(
    api: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> Result<String, ApiError> {
    let (status, body) = api_exchange(api, "GET", path, token)?;
    if !status.starts_with('2') {
        return Err(ApiError::Status {
            api,
            status,
            body: body.trim().chars().take(500).collect(),
        });
    }
    if body.trim().is_empty() {
        return Err(ApiError::Empty {
            api,
            path: path.to_string(),
        });
    }
    Ok(body)
}

/// Fetches `/status` from a running daemon's API (`fastpath lb status`).
pub fn fetch_status(api: std::net::SocketAddr) -> Result<Status, ApiError> {
    fetch_status_with(api, None)
}

/// [`fetch_status`] with a bearer token.
pub fn fetch_status_with(
    api: std::net::SocketAddr,
    token: Option<&str>,
) -> Result<Status, ApiError> {
    let json = api_document_with(api, paths::STATUS, token)?;
    serde_json::from_str(&json).map_err(|source| ApiError::Document {
        path: paths::STATUS,
        source,
    })
}

/// `POST /reload` (`fastpath lb reload`): what the daemon applied, or an
/// [`ApiError::Status`] with its reason (a rejected file says where).
pub fn reload(api: std::net::SocketAddr, token: Option<&str>) -> Result<Reloaded, ApiError> {
    post(api, paths::RELOAD, token)
}

/// A runtime change to `backend` (a name or an address) in every pool that
/// lists it (`fastpath lb drain|undrain|weight`): what the daemon did, or
/// an [`ApiError::Status`] with its reason (404: no such backend, 409: the
/// file was edited since it was loaded, 400: the result would be invalid).
pub fn change(
    api: std::net::SocketAddr,
    backend: &str,
    change: Change,
    token: Option<&str>,
) -> Result<RuntimeChanged, ApiError> {
    // The name goes into the path: keep it to characters a path carries
    // as they are.
    if backend.is_empty()
        || !backend
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
    {
        return Err(ApiError::BackendName {
            backend: backend.to_string(),
        });
    }
    post(api, &paths::runtime_change(backend, change), token)
}

/// Drains `backend`: [`change`] with [`Change::Drain`].
pub fn drain(
    api: std::net::SocketAddr,
    backend: &str,
    token: Option<&str>,
) -> Result<RuntimeChanged, ApiError> {
    change(api, backend, Change::Drain, token)
}

/// Undrains `backend`: [`change`] with [`Change::Undrain`].
pub fn undrain(
    api: std::net::SocketAddr,
    backend: &str,
    token: Option<&str>,
) -> Result<RuntimeChanged, ApiError> {
    change(api, backend, Change::Undrain, token)
}

/// Sets `backend`'s weight: [`change`] with [`Change::Weight`].
pub fn weight(
    api: std::net::SocketAddr,
    backend: &str,
    weight: u32,
    token: Option<&str>,
) -> Result<RuntimeChanged, ApiError> {
    change(api, backend, Change::Weight(weight), token)
}

/// A `POST` that changes the load balancer, and its JSON answer; an error
/// status is an [`ApiError::Status`] with the daemon's reason.
fn post<T: serde::de::DeserializeOwned>(
    api: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> Result<T, ApiError> {
    let (status, body) = api_exchange(api, "POST", path, token)?;
    if !status.starts_with('2') {
        return Err(ApiError::Status {
            api,
            status,
            body: reason(&body),
        });
    }
    if body.trim().is_empty() {
        return Err(ApiError::Empty {
            api,
            path: path.to_string(),
        });
    }
    serde_json::from_str(&body).map_err(|source| ApiError::Answer { api, body, source })
}

/// One load balancer's part in a fleet-wide change: its answer, or why
/// there is none.
#[derive(Debug, Clone, Serialize)]
pub struct LbOutcome<T> {
    /// The load balancer's API address.
    pub api: String,
    /// What it did (none when it refused, failed or was not asked).
    pub answer: Option<T>,
    /// Why it did not (refused, unreachable, or not asked because another
    /// load balancer could not take the change).
    pub error: Option<String>,
}

/// A change over several load balancers ([`fleet_change`],
/// [`fleet_reload`]).
#[derive(Debug, Clone, Serialize)]
pub struct FleetChange<T> {
    /// Whether every load balancer applied it.
    pub applied: bool,
    /// Whether it was sent at all: false when a load balancer did not
    /// answer (or did not know the backend) beforehand, and nothing was
    /// changed anywhere.
    pub sent: bool,
    /// Each load balancer, in the order given.
    pub lbs: Vec<LbOutcome<T>>,
}

/// Runs `f` for every API at once; the results in the order of `apis`.
fn each_at_once<T: Send>(
    apis: &[SocketAddr],
    f: impl Fn(SocketAddr) -> T + Sync,
) -> Vec<Result<T, String>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = apis
            .iter()
            .map(|&api| {
                let f = &f;
                scope.spawn(move || f(api))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| "the request panicked".to_string()))
            .collect()
    })
}

/// The fleet-wide change `send` over `apis`: first every load balancer's
/// `/status` (with `token`), checked by `ready` (an error says why one may
/// not take the change); unless all are ready, nothing is sent. Then
/// `send` to all at once.
fn fleet<T: Send>(
    apis: &[SocketAddr],
    token: Option<&str>,
    ready: impl Fn(&Status) -> Result<(), String> + Sync,
    send: impl Fn(SocketAddr) -> Result<T, ApiError> + Sync,
) -> FleetChange<T> {
    let checked = each_at_once(apis, |api| {
        fetch_status_with(api, token)
            .map_err(|e| e.to_string())
            .and_then(|s| ready(&s))
    });
    let problems: Vec<Option<String>> = checked
        .into_iter()
        .map(|r| r.and_then(|r| r).err())
        .collect();
    if problems.iter().any(Option::is_some) {
        let lbs = apis
            .iter()
            .zip(problems)
            .map(|(api, p)| LbOutcome {
                api: api.to_string(),
                answer: None,
                error: Some(p.map_or_else(
                    || {
                        "not changed: another load balancer of the fleet cannot take the change"
                            .to_string()
                    },
                    |p| format!("not changed: {p}"),
                )),
            })
            .collect();
        return FleetChange {
            applied: false,
            sent: false,
            lbs,
        };
    }
    let lbs: Vec<LbOutcome<T>> = apis
        .iter()
        .zip(each_at_once(apis, &send))
        .map(|(api, r)| {
            let (answer, error) = match r {
                Ok(Ok(a)) => (Some(a), None),
                Ok(Err(e)) => (None, Some(e.to_string())),
                Err(e) => (None, Some(e)),
            };
            LbOutcome {
                api: api.to_string(),
                answer,
                error,
            }
        })
        .collect();
    FleetChange {
        applied: lbs.iter().all(|l| l.error.is_none()),
        sent: true,
        lbs,
    }
}

/// `change` to `backend` on every load balancer of `apis`
/// (`fastpath lb drain|undrain|weight` with several `--api`): sent to all
/// at once, and only if every one answers and lists the backend under a
/// VIP; each one's answer or error.
pub fn fleet_change(
    apis: &[SocketAddr],
    backend: &str,
    change: Change,
    token: Option<&str>,
) -> FleetChange<RuntimeChanged> {
    let knows = |s: &Status| {
        let listed = s.vips.iter().flat_map(|v| &v.backends).any(|b| {
            b.name == backend
                || matches!(
                    (b.address.parse::<std::net::IpAddr>(), backend.parse::<std::net::IpAddr>()),
                    (Ok(a), Ok(b)) if a == b
                )
        });
        if listed {
            Ok(())
        } else {
            Err(format!("it serves no backend {backend:?} under a VIP"))
        }
    };
    fleet(apis, token, knows, |api| {
        self::change(api, backend, change, token)
    })
}

/// `POST /reload` on every load balancer of `apis` (`fastpath lb reload`
/// with several `--api`): sent to all at once, and only if every one
/// answers; each one's answer or error.
pub fn fleet_reload(apis: &[SocketAddr], token: Option<&str>) -> FleetChange<Reloaded> {
    fleet(apis, token, |_| Ok(()), |api| reload(api, token))
}

/// The daemon's reason in an error answer: its JSON `error`, or the body.
fn reason(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A one-shot server answering `reply` to the first connection.
    fn answering(reply: &'static str) -> std::net::SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut c, _)) = l.accept() {
                let mut buf = [0u8; 1024];
                let _ = c.read(&mut buf);
                let _ = c.write_all(reply.as_bytes());
            }
        });
        addr
    }

    #[test]
    fn status_errors_say_what_the_api_answered() {
        let e = fetch_status(answering("")).unwrap_err();
        assert!(matches!(e, ApiError::NoAnswer { .. }), "{e}");
        let e = fetch_status(answering("HTTP/1.1 200 OK\r\n\r\n")).unwrap_err();
        assert!(matches!(e, ApiError::Empty { .. }), "{e}");
        assert!(e.to_string().contains("empty body"), "{e}");
        let e = fetch_status(answering(
            "HTTP/1.1 401 Unauthorized\r\n\r\n{\"error\":\"token\"}",
        ))
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("401 Unauthorized: {\"error\":\"token\"}"),
            "{e}"
        );
        let e = fetch_status(answering("SSH-2.0-OpenSSH\r\n")).unwrap_err();
        assert!(matches!(e, ApiError::Malformed { .. }), "{e}");
        // A rejected reload's reason stays readable through api_request.
        let body = api_request(
            answering("HTTP/1.1 400 Bad Request\r\n\r\n{\"error\":\"vips[0].pool\"}"),
            "POST",
            "/reload",
        )
        .unwrap();
        assert!(body.contains("vips[0].pool"));
    }

    /// A change refused says why, in the daemon's words; an empty or
    /// foreign answer is an error too, and a name a path cannot carry is
    /// refused before anything is sent.
    #[test]
    fn changes_say_why_they_were_refused() {
        let e = drain(
            answering("HTTP/1.1 404 Not Found\r\n\r\n{\"error\":\"no backend nope\"}"),
            "nope",
            None,
        )
        .unwrap_err();
        assert!(
            e.to_string().ends_with("404 Not Found: no backend nope"),
            "{e}"
        );
        let e = reload(answering("HTTP/1.1 200 OK\r\n\r\n"), None).unwrap_err();
        assert!(matches!(e, ApiError::Empty { .. }), "{e}");
        let e = weight(answering("HTTP/1.1 200 OK\r\n\r\n[1]"), "b1", 2, None).unwrap_err();
        assert!(matches!(e, ApiError::Answer { .. }), "{e}");
        let nobody: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        let e = undrain(nobody, "a b", None).unwrap_err();
        assert!(matches!(e, ApiError::BackendName { .. }), "{e}");
    }

    /// A fake load balancer's API: `/status` lists the backends `knows`,
    /// a POST answers `post` (a status line and a body); every request
    /// line is recorded. Serves until the test ends.
    fn fake_lb(
        knows: &'static [&'static str],
        post: &'static str,
    ) -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&seen);
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                let mut buf = [0u8; 2048];
                let n = c.read(&mut buf).unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let line = head.lines().next().unwrap_or("").to_string();
                log.lock().unwrap().push(line.clone());
                let reply = if line.starts_with("GET /status") {
                    let backends: Vec<serde_json::Value> = knows
                        .iter()
                        .map(|b| {
                            serde_json::json!({"name": b, "address": "10.1.0.1",
                            "healthy": true, "packets": 0, "bytes": 0})
                        })
                        .collect();
                    let doc = serde_json::json!({"driver": "x", "generation": 1,
                        "uptime_s": 0.0, "reloads": 0, "reload_failures": 0,
                        "last_reload_error": null, "forwarded": 0, "dropped": 0, "drops": {},
                        "conntrack_entries": 0, "bgp_announced": null, "bgp_error": null,
                        "vips": [{"name": "http", "packets": 0, "bytes": 0,
                                  "healthy_backends": 1, "backends": backends}]});
                    format!("HTTP/1.1 200 OK\r\n\r\n{doc}")
                } else {
                    post.to_string()
                };
                let _ = c.write_all(reply.as_bytes());
            }
        });
        (addr, seen)
    }

    const DRAINED: &str = "HTTP/1.1 200 OK\r\n\r\n{\"backend\":\"b1\",\"change\":\"drain\",\"pools\":[\"web\"],\"changed\":true,\"generation\":2,\"file\":\"lb.toml\"}";

    fn posts(seen: &std::sync::Mutex<Vec<String>>) -> usize {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("POST"))
            .count()
    }

    /// A fleet-wide drain reaches every load balancer when all of them
    /// answer and know the backend; it reaches none when one of them does
    /// not answer or does not know it; a refusal by one after the change
    /// was sent is reported for that one, beside the others' answers.
    #[test]
    fn fleet_changes_go_to_all_or_are_reported_per_load_balancer() {
        let (a, seen_a) = fake_lb(&["b1"], DRAINED);
        let (b, seen_b) = fake_lb(&["b1"], DRAINED);
        let r = fleet_change(&[a, b], "b1", Change::Drain, Some("t"));
        assert!(r.applied && r.sent, "{r:?}");
        assert_eq!(r.lbs.len(), 2);
        assert!(r
            .lbs
            .iter()
            .all(|l| l.answer.as_ref().is_some_and(|x| x.changed)));
        assert_eq!((posts(&seen_a), posts(&seen_b)), (1, 1));
        assert!(seen_a
            .lock()
            .unwrap()
            .contains(&"POST /backends/b1/drain HTTP/1.0".to_string()));

        // One unreachable: nothing sent to the other.
        let nobody: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let r = fleet_change(&[a, nobody], "b1", Change::Drain, None);
        assert!(!r.applied && !r.sent, "{r:?}");
        assert_eq!(
            posts(&seen_a),
            1,
            "a change went out although a peer was down"
        );
        assert!(r.lbs[0]
            .error
            .as_deref()
            .unwrap()
            .contains("another load balancer"));
        assert!(r.lbs[1].error.as_deref().unwrap().contains("cannot reach"));

        // One that does not serve the backend: nothing sent either.
        let (c, seen_c) = fake_lb(&["b2"], DRAINED);
        let r = fleet_change(&[a, c], "b1", Change::Drain, None);
        assert!(!r.sent, "{r:?}");
        assert!(r.lbs[1]
            .error
            .as_deref()
            .unwrap()
            .contains("no backend \"b1\""));
        assert_eq!((posts(&seen_a), posts(&seen_c)), (1, 0));

        // Sent to both, refused by one: each says what happened.
        let (d, _) = fake_lb(
            &["b1"],
            "HTTP/1.1 409 Conflict\r\n\r\n{\"error\":\"lb.toml changed on disk\"}",
        );
        let r = fleet_change(&[a, d], "b1", Change::Drain, None);
        assert!(r.sent && !r.applied, "{r:?}");
        assert!(r.lbs[0].answer.is_some() && r.lbs[0].error.is_none());
        assert!(r.lbs[1]
            .error
            .as_deref()
            .unwrap()
            .contains("409 Conflict: lb.toml changed"));

        // A reload over the fleet: every answer.
        let (e, _) = fake_lb(&[], "HTTP/1.1 200 OK\r\n\r\n{\"generation\":4,\"not_applied\":[],\"took_us\":1,\"parsed\":{\"chunks\":1,\"parsed\":1,\"whole\":true}}");
        let r = fleet_reload(&[e, e], None);
        assert!(r.applied, "{r:?}");
        assert!(r
            .lbs
            .iter()
            .all(|l| l.answer.as_ref().is_some_and(|x| x.generation == 4)));
    }
}
