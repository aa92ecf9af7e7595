//! The HTTP API: its routes ([`router`]: `/metrics`, `/status`,
//! `POST /reload` and the runtime changes, at the paths of
//! [`crate::paths`]) and serving them within the daemon's means: the
//! listener is bound before the daemon forwards (a port in use stops the
//! start instead of leaving a daemon without its API), mutating endpoints
//! need a bearer token when one is configured, and reads need it too where
//! `[api] token_for_reads` says so (by default whenever the API listens
//! beyond loopback with a token); request bodies are bounded, connections
//! that sit idle are closed, and at most [`Connections::cap`] are open at
//! once, so that a flood cannot take the descriptors health checks need
//! ([`crate::limits`]): above that a new connection pushes out the oldest
//! one that waits for a request (a flood that sends nothing pushes out its
//! own, and an operator who asks at once is answered), or is closed at
//! once when every open one is serving a request. Who
//! may ask, and how many at once, is [`crate::access`].

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

use crate::access::{unauthorized, Connections};
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
/// How long a new connection over the cap waits for the waiting
/// connection it pushes out to be gone.
const MAKING_ROOM: Duration = Duration::from_millis(50);

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

/// What a connection over the cap is told before it is closed (written
/// only if the socket takes it at once; the close is what matters).
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 62\r\n\r\ntoo many API connections open; try again when some have ended\n";

/// Serves `app` on `listener` until `stop`: HTTP/1.1, each connection
/// closed after [`IDLE_TIMEOUT`] without a request head and at most
/// [`MAX_CONNECTION`] after it opened; bodies over [`MAX_BODY`] refused;
/// at most [`Connections::cap`] of `conns` open at once: a connection
/// beyond that takes the place of the oldest one waiting for a request,
/// or, when all are serving one, is answered 503 if it can be at once,
/// and closed.
pub async fn serve(
    listener: std::net::TcpListener,
    app: Router,
    stop: Arc<AtomicBool>,
    conns: Arc<Connections>,
) {
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
        let Some(slot) = conns.admit(MAKING_ROOM).await else {
            // Closed now: its descriptor goes back at once.
            let _ = stream.try_write(BUSY);
            drop(stream);
            continue;
        };
        let tower = hyper_util::service::TowerToHyperService::new(app.clone());
        let state = Arc::clone(&slot.conn);
        // Waiting for a request head until hyper hands one over, and again
        // once it is answered: only then may it be closed to make room.
        let svc = hyper::service::service_fn(move |req| {
            use hyper::service::Service as _;
            state.set_waiting(false);
            let answer = tower.call(req);
            let state = Arc::clone(&state);
            async move {
                let r = answer.await;
                state.set_waiting(true);
                r
            }
        });
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(IDLE_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            tokio::select! {
                _ = tokio::time::timeout(MAX_CONNECTION, conn) => {}
                () = slot.conn.evicted() => {}
            }
            drop(slot);
        });
    }
}

/// What the API serves, in words (for the log).
pub fn summary() -> String {
    format!(
        "GET {}, {}, {}; POST {}, {}, {}, {}",
        paths::METRICS,
        paths::STATUS,
        paths::SOURCE,
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
            get(
                |State(s): State<Arc<Shared>>, headers: HeaderMap| async move {
                    if !s.api.may_read(&headers) {
                        return unauthorized().into_response();
                    }
                    let format = crate::metrics::Format::negotiate(
                        headers
                            .get(axum::http::header::ACCEPT)
                            .and_then(|v| v.to_str().ok()),
                    );
                    (
                        [(axum::http::header::CONTENT_TYPE, format.content_type())],
                        crate::metrics::metrics(&s, format),
                    )
                        .into_response()
                },
            ),
        )
        .route(
            paths::STATUS,
            get(
                |State(s): State<Arc<Shared>>, headers: HeaderMap| async move {
                    if !s.api.may_read(&headers) {
                        return unauthorized().into_response();
                    }
                    Json(crate::status::status(&s)).into_response()
                },
            ),
        )
        .route(
            paths::SOURCE,
            get(
                |State(s): State<Arc<Shared>>, headers: HeaderMap| async move {
                    if !s.api.may_read(&headers) {
                        return unauthorized().into_response();
                    }
                    Json(crate::status::config_source(&s)).into_response()
                },
            ),
        )
        .route(
            paths::RELOAD,
            post(
                |State(s): State<Arc<Shared>>, headers: HeaderMap| async move {
                    change_endpoint(s, &headers, |_| StatusCode::BAD_REQUEST, crate::reload::reload)
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
    if !s.api.may_change(headers) {
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
        crate::reload::runtime_change(s, &backend, change)
    })
    .await
}

/// The HTTP status of the answer to a refused runtime change.
fn runtime_status(e: &RuntimeError) -> StatusCode {
    match e {
        RuntimeError::Edit(crate::runtime::EditError::UnknownBackend(_)) => StatusCode::NOT_FOUND,
        RuntimeError::FileChanged { .. } | RuntimeError::FromEtcd { .. } => StatusCode::CONFLICT,
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
                .block_on(serve(l, app, st, Connections::new(8)))
        });
        // A connection that never sends a byte (a slowloris) is not kept
        // either.
        let mut fresh = std::net::TcpStream::connect(addr).unwrap();
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
        fresh
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let n = fresh.read(&mut buf).unwrap_or(1);
        let said = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(
            n == 0 || said.contains("408"),
            "a connection that sent nothing is still open: {said:?}"
        );
        stop.store(true, Ordering::Relaxed);
        server.join().unwrap();
    }

    /// Serves an app with `conns` on a thread of its own until the
    /// returned flag is set: `/` answers at once, `/slow` after 2 s.
    fn serving(
        conns: Arc<Connections>,
    ) -> (SocketAddr, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
        let l = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let app = Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    "slow"
                }),
            );
        let st = Arc::clone(&stop);
        let server = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(serve(l, app, st, conns))
        });
        (addr, stop, server)
    }

    /// Waits up to 5 s for `conns` to have `n` open.
    fn until_open(conns: &Connections, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while conns.open() != n && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(conns.open(), n);
    }

    /// With the cap reached by connections that send nothing (a flood), a
    /// new connection that asks is answered: the oldest waiting one is
    /// closed to make room, and no more than the cap are ever open.
    #[test]
    fn a_flood_that_sends_nothing_makes_room_for_one_that_asks() {
        let conns = Connections::new(2);
        let (addr, stop, server) = serving(Arc::clone(&conns));
        let mut held: Vec<_> = (0..2)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        until_open(&conns, 2);
        let started = std::time::Instant::now();
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        c.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
        let mut answer = String::new();
        let _ = c.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(conns.refused(), 1);
        // The oldest of the flood was closed.
        held[0]
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(held[0].read(&mut buf).unwrap_or(1), 0, "still open");
        assert!(conns.open() <= 2);
        held.clear();
        stop.store(true, Ordering::Relaxed);
        server.join().unwrap();
    }

    /// With the cap reached by connections each serving a request, a new
    /// connection is closed at once (its descriptor given back) instead of
    /// held, and the requests in progress are answered; once they end,
    /// the API serves again.
    #[test]
    fn connections_over_the_cap_of_busy_ones_are_closed_at_once() {
        let conns = Connections::new(2);
        let (addr, stop, server) = serving(Arc::clone(&conns));
        let mut busy: Vec<_> = (0..2)
            .map(|_| {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.write_all(b"GET /slow HTTP/1.0\r\nHost: x\r\n\r\n")
                    .unwrap();
                s
            })
            .collect();
        until_open(&conns, 2);
        // Both requests are being served.
        std::thread::sleep(Duration::from_millis(300));
        let mut over = std::net::TcpStream::connect(addr).unwrap();
        over.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let started = std::time::Instant::now();
        let mut answer = String::new();
        let _ = over.read_to_string(&mut answer);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the connection over the cap was held"
        );
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 503"),
            "{answer:?}"
        );
        assert_eq!(conns.refused(), 1);
        for s in &mut busy {
            let mut answer = String::new();
            s.read_to_string(&mut answer).unwrap();
            assert!(answer.starts_with("HTTP/1.0 200"), "{answer:?}");
        }
        drop(busy);
        until_open(&conns, 0);
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer:?}");
        stop.store(true, Ordering::Relaxed);
        server.join().unwrap();
    }

    /// `[api] token_for_reads`: unset, reads need the token on a data
    /// address with a token and not on loopback; set, it decides; `true`
    /// without a token is refused.
    #[test]
    fn reads_need_the_token_by_default_only_beyond_loopback() {
        let dir = std::env::temp_dir().join(format!("fastpath-reads-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("api.token");
        std::fs::write(&token_file, "a-long-enough-secret-token\n").unwrap();
        let token_line = format!("token_file = \"{}\"\n", token_file.display());
        let api = |listen: &str, token: bool, reads: Option<bool>| {
            let text = format!(
                "[api]\nlisten = \"{listen}\"\n{}{}[encap]\nsource = \"10.0.0.1\"\n\
                 [[pools]]\nname = \"p\"\nbackends = [{{ address = \"10.1.0.1\" }}]\n",
                if token { token_line.as_str() } else { "" },
                reads
                    .map(|r| format!("token_for_reads = {r}\n"))
                    .unwrap_or_default()
            );
            lb::Config::parse(&text, "t.toml").map(|c| c.api.reads_need_token())
        };
        assert!(api("10.0.0.1:9180", true, None).unwrap());
        assert!(!api("127.0.0.1:9180", true, None).unwrap());
        assert!(!api("127.0.0.1:9180", false, None).unwrap());
        assert!(api("127.0.0.1:9180", true, Some(true)).unwrap());
        assert!(!api("10.0.0.1:9180", true, Some(false)).unwrap());
        let e = api("127.0.0.1:9180", false, Some(true)).unwrap_err();
        assert_eq!(e.key, "api.token_for_reads", "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The answer over the cap says how long its body is, truly.
    #[test]
    fn the_busy_answer_is_well_formed() {
        let text = std::str::from_utf8(BUSY).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(len, body.len());
    }
}
