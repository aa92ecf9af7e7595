//! The HTTP API: its routes ([`router`]: `/metrics`, `/status`,
//! `POST /reload` and the runtime changes, at the paths of
//! [`crate::paths`]) and serving them safely: the listener is bound before
//! the daemon forwards (a port in use stops the start instead of leaving a
//! daemon without its API), mutating endpoints need a bearer token when
//! one is configured, request bodies are bounded, and connections that sit
//! idle are closed.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

use crate::paths;
use crate::reload::RuntimeError;
use crate::runtime::Change;
use crate::state::Shared;

/// A connection that has not sent a complete request head within this long
/// (including the wait between requests on a kept-alive connection) is
/// closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// No connection lives longer than this.
pub const MAX_CONNECTION: Duration = Duration::from_secs(60);
/// Largest request body accepted (the API's requests carry none).
pub const MAX_BODY: usize = 4096;

/// Why the API could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ApiSetupError {
    /// The address could not be bound (in use, or not on this machine).
    #[error("cannot serve the HTTP API on {addr}: {source} ([api] listen)")]
    Bind {
        /// `[api] listen`.
        addr: SocketAddr,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The token file is missing, not a regular file, too large or too
    /// short to be a secret (the rule validation applies too).
    #[error(transparent)]
    Token(#[from] lb::config::TokenError),
}

/// Reads a bearer token: the file's first line, trimmed.
pub fn read_token(path: &Path) -> Result<String, ApiSetupError> {
    Ok(lb::config::read_token(path)?)
}

/// Binds the API's listener now, so that a failure stops the start.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, ApiSetupError> {
    let bind_err = |source| ApiSetupError::Bind { addr, source };
    let l = std::net::TcpListener::bind(addr).map_err(bind_err)?;
    l.set_nonblocking(true).map_err(bind_err)?;
    Ok(l)
}

/// Whether a request may change the load balancer: always when no token is
/// configured (the API is then on loopback only, as validation ensures),
/// else only with `Authorization: Bearer <token>`. The comparison takes the
/// same time wherever the first difference is.
pub fn authorized(headers: &HeaderMap, token: Option<&str>) -> bool {
    let Some(token) = token else {
        return true;
    };
    let Some(given) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (given.trim().as_bytes(), token.as_bytes());
    let mut diff = a.len() ^ b.len();
    for (i, &x) in b.iter().enumerate() {
        diff |= usize::from(x ^ a.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

/// The answer to an unauthorized mutating request.
pub fn unauthorized() -> (StatusCode, &'static str) {
    (
        StatusCode::UNAUTHORIZED,
        "this endpoint needs `Authorization: Bearer <token>` (the token in [api] token_file)\n",
    )
}

/// Serves `app` on `listener` until `stop`: HTTP/1.1, each connection
/// closed after [`IDLE_TIMEOUT`] without a request head and at most
/// [`MAX_CONNECTION`] after it opened; bodies over [`MAX_BODY`] refused.
pub async fn serve(listener: std::net::TcpListener, app: Router, stop: Arc<AtomicBool>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("HTTP API: {e}");
            return;
        }
    };
    let app = app.layer(axum::extract::DefaultBodyLimit::max(MAX_BODY));
    while !stop.load(Ordering::Relaxed) {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = tokio::time::sleep(Duration::from_millis(100)) => continue,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors, for instance: back off, keep serving.
                tracing::warn!("HTTP API: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(IDLE_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(MAX_CONNECTION, conn).await;
        });
    }
}

/// What the API serves, in words (for the log).
pub fn summary() -> String {
    format!(
        "GET {}, {}; POST {}, {}, {}, {}",
        paths::METRICS,
        paths::STATUS,
        paths::RELOAD,
        paths::DRAIN,
        paths::UNDRAIN,
        paths::WEIGHT
    )
}

/// The API's routes over the shared state.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            paths::METRICS,
            get(|State(s): State<Arc<Shared>>| async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        crate::metrics::CONTENT_TYPE,
                    )],
                    s.metrics(),
                )
            }),
        )
        .route(
            paths::STATUS,
            get(|State(s): State<Arc<Shared>>| async move { Json(s.status()) }),
        )
        .route(
            paths::RELOAD,
            post(
                |State(s): State<Arc<Shared>>, headers: HeaderMap| async move {
                    change_endpoint(s, &headers, |_| StatusCode::BAD_REQUEST, Shared::reload)
                        .await
                },
            ),
        )
        .route(
            paths::DRAIN,
            post(
                |State(s): State<Arc<Shared>>,
                 UrlPath(b): UrlPath<String>,
                 headers: HeaderMap| async move {
                    runtime_endpoint(s, &headers, b, Change::Drain).await
                },
            ),
        )
        .route(
            paths::UNDRAIN,
            post(
                |State(s): State<Arc<Shared>>,
                 UrlPath(b): UrlPath<String>,
                 headers: HeaderMap| async move {
                    runtime_endpoint(s, &headers, b, Change::Undrain).await
                },
            ),
        )
        .route(
            paths::WEIGHT,
            post(
                |State(s): State<Arc<Shared>>,
                 UrlPath((b, w)): UrlPath<(String, u32)>,
                 headers: HeaderMap| async move {
                    runtime_endpoint(s, &headers, b, Change::Weight(w)).await
                },
            ),
        )
        .with_state(shared)
}

/// A `POST` that changes the load balancer (`/reload`, the runtime
/// changes): refused without the token, run off the async threads; 200
/// with `apply`'s answer as JSON, or `status` of its error with the reason
/// as JSON.
async fn change_endpoint<T, E>(
    s: Arc<Shared>,
    headers: &HeaderMap,
    status: fn(&E) -> StatusCode,
    apply: impl FnOnce(&Shared) -> Result<T, E> + Send + 'static,
) -> axum::response::Response
where
    T: Serialize + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    if !authorized(headers, s.api_token.as_deref()) {
        return unauthorized().into_response();
    }
    match tokio::task::spawn_blocking(move || apply(&s)).await {
        Ok(Ok(r)) => (StatusCode::OK, Json(r)).into_response(),
        Ok(Err(e)) => (
            status(&e),
            Json(serde_json::json!({ "error": e.to_string() })),
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `POST /backends/NAME/...`: a runtime change (404: no such backend,
/// 409: the file was edited since it was loaded, 400: the result would be
/// invalid).
async fn runtime_endpoint(
    s: Arc<Shared>,
    headers: &HeaderMap,
    backend: String,
    change: Change,
) -> axum::response::Response {
    change_endpoint(s, headers, runtime_status, move |s| {
        s.runtime_change(&backend, change)
    })
    .await
}

/// The HTTP status of the answer to a refused runtime change.
fn runtime_status(e: &RuntimeError) -> StatusCode {
    match e {
        RuntimeError::Edit(crate::runtime::EditError::UnknownBackend(_)) => StatusCode::NOT_FOUND,
        RuntimeError::FileChanged { .. } => StatusCode::CONFLICT,
        RuntimeError::Edit(_) | RuntimeError::Config(_) | RuntimeError::Apply(_) => {
            StatusCode::BAD_REQUEST
        }
        RuntimeError::Read { .. } | RuntimeError::Write(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn tokens_are_checked_exactly() {
        let mut h = HeaderMap::new();
        assert!(authorized(&h, None));
        assert!(!authorized(&h, Some("0123456789abcdef")));
        h.insert("authorization", "Bearer 0123456789abcdef".parse().unwrap());
        assert!(authorized(&h, Some("0123456789abcdef")));
        for wrong in [
            "0123456789abcdeF",
            "0123456789abcde",
            "0123456789abcdef0",
            "",
        ] {
            assert!(!authorized(&h, Some(wrong)), "{wrong:?}");
        }
        h.insert("authorization", "Basic 0123456789abcdef".parse().unwrap());
        assert!(!authorized(&h, Some("0123456789abcdef")));
    }

    #[test]
    fn short_or_missing_tokens_are_refused() {
        let dir = std::env::temp_dir().join(format!("fastpath-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t");
        std::fs::write(&f, "short\n").unwrap();
        assert!(matches!(
            read_token(&f),
            Err(ApiSetupError::Token(
                lb::config::TokenError::TooShort { .. }
            ))
        ));
        std::fs::write(&f, "  a-long-enough-secret-token  \nignored\n").unwrap();
        assert_eq!(read_token(&f).unwrap(), "a-long-enough-secret-token");
        assert!(matches!(
            read_token(&dir.join("missing")),
            Err(ApiSetupError::Token(lb::config::TokenError::Open { .. }))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An idle connection is closed by the server; a busy address is an
    /// error at bind time, not a daemon without its API.
    #[test]
    fn idle_connections_are_closed_and_bind_errors_surface() {
        let l = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        assert!(matches!(bind(addr), Err(ApiSetupError::Bind { .. })));
        let stop = Arc::new(AtomicBool::new(false));
        let app = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let st = Arc::clone(&stop);
        let server = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(serve(l, app, st))
        });
        // One request works and the connection stays for the next...
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut buf = [0u8; 512];
        let n = c.read(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).contains("200 OK"));
        // ...but not for ever: with nothing more sent, the server closes it.
        c.set_read_timeout(Some(IDLE_TIMEOUT + Duration::from_secs(5)))
            .unwrap();
        let started = std::time::Instant::now();
        let n = c.read(&mut buf).unwrap_or(0);
        assert_eq!(n, 0, "the idle connection got data instead of a close");
        assert!(started.elapsed() <= IDLE_TIMEOUT + Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        server.join().unwrap();
    }
}
