//! The HTTP API's client, for the command line (`fastpath lb status`,
//! `reload`, `drain`, `undrain`, `weight`) and the test topologies: one
//! request per connection over plain HTTP/1.0, the paths from
//! [`crate::paths`], the answers typed ([`Status`], [`Reloaded`],
//! [`RuntimeChanged`]).

use std::time::Duration;

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
    let (status, body) = api_exchange(api, "GET", path, None)?;
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
    let json = api_document(api, paths::STATUS)?;
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
}
