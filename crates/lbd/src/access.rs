//! Who may use the HTTP API and how many at once: the bearer token
//! (`[api] token_file`, and `[api] token_for_reads` for reads) and the cap
//! on open connections that [`crate::limits`] sets, so that a flood cannot
//! take the descriptors health checks need. What [`crate::state::Shared`]
//! holds of the API lives here, apart from the routes ([`crate::http`]), so
//! that the state depends on nothing that uses it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use axum::http::{HeaderMap, StatusCode};

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

/// The answer to an unauthorized request.
pub fn unauthorized() -> (StatusCode, &'static str) {
    (
        StatusCode::UNAUTHORIZED,
        "this endpoint needs `Authorization: Bearer <token>` (the token in [api] token_file)\n",
    )
}

/// What the API lets through without the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// The bearer token (`[api] token_file`), if any.
    pub token: Option<String>,
    /// Whether reads (`GET /status`, `/metrics`) need it too
    /// ([`lb::config::Api::reads_need_token`]).
    pub reads_need_token: bool,
}

impl Access {
    /// Whether a read may be answered.
    pub fn may_read(&self, headers: &HeaderMap) -> bool {
        !self.reads_need_token || authorized(headers, self.token.as_deref())
    }

    /// Whether a change may be made.
    pub fn may_change(&self, headers: &HeaderMap) -> bool {
        authorized(headers, self.token.as_deref())
    }
}

/// The API's open connections, and how many it may hold at once. When
/// the cap is reached, a new connection takes the place of the oldest one
/// that is waiting for a request (one that has sent nothing yet, or sits
/// idle between requests): a flood of connections that send nothing then
/// pushes out its own, and the operator who connects and asks at once is
/// answered. Only when every open connection is in the middle of a request
/// is a new one closed on arrival.
#[derive(Debug)]
pub struct Connections {
    open: AtomicUsize,
    cap: AtomicUsize,
    refused: AtomicU64,
    /// The open connections, oldest first (entries of ended ones are
    /// pruned as they are met, and whenever there are twice the cap).
    order: Mutex<VecDeque<Weak<Conn>>>,
}

/// What the accept loop knows of one admitted connection.
#[derive(Debug)]
pub(crate) struct Conn {
    /// Whether it is waiting for a request head (just accepted, or idle
    /// between requests): it may be closed to make room.
    waiting: AtomicBool,
    /// Told when it is closed to make room.
    close: tokio::sync::Notify,
}

impl Conn {
    /// Marks the connection as serving a request (`false`) or waiting for
    /// one (`true`).
    pub(crate) fn set_waiting(&self, waiting: bool) {
        self.waiting.store(waiting, Ordering::Release);
    }

    /// Completes when the connection is to be closed to make room.
    pub(crate) async fn evicted(&self) {
        self.close.notified().await;
    }
}

/// One admitted connection: its place is given back when it ends.
#[derive(Debug)]
pub(crate) struct Slot {
    all: Arc<Connections>,
    /// This connection's state.
    pub(crate) conn: Arc<Conn>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.all.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Connections {
    /// None open, at most `cap`.
    pub fn new(cap: usize) -> Arc<Connections> {
        Arc::new(Connections {
            open: AtomicUsize::new(0),
            cap: AtomicUsize::new(cap),
            refused: AtomicU64::new(0),
            order: Mutex::new(VecDeque::new()),
        })
    }

    /// Sets how many may be open (connections already open stay).
    pub fn set_cap(&self, cap: usize) {
        self.cap.store(cap, Ordering::Release);
    }

    /// How many may be open at once.
    pub fn cap(&self) -> usize {
        self.cap.load(Ordering::Acquire)
    }

    /// How many are open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Connections closed because [`Connections::cap`] were open: new ones
    /// closed on arrival, and waiting ones closed to make room for a new
    /// one.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// A place for one more connection, unless the cap is reached (the
    /// accept loop is the only caller, so the check and the count cannot
    /// race with another admission). Counts nothing when there is none.
    pub(crate) fn try_admit(self: &Arc<Self>) -> Option<Slot> {
        if self.open() >= self.cap() {
            return None;
        }
        self.open.fetch_add(1, Ordering::AcqRel);
        let conn = Arc::new(Conn {
            waiting: AtomicBool::new(true),
            close: tokio::sync::Notify::new(),
        });
        let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        if order.len() >= 2 * self.cap().max(1) {
            order.retain(|w| w.strong_count() > 0);
        }
        order.push_back(Arc::downgrade(&conn));
        Some(Slot {
            all: Arc::clone(self),
            conn,
        })
    }

    /// Tells the oldest open connection that waits for a request to close;
    /// whether there was one. It counts as refused.
    pub(crate) fn evict_oldest_waiting(&self) -> bool {
        let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        order.retain(|w| w.strong_count() > 0);
        let Some(at) = order.iter().position(|w| {
            w.upgrade()
                .is_some_and(|c| c.waiting.load(Ordering::Acquire))
        }) else {
            return false;
        };
        if let Some(c) = order.remove(at).and_then(|w| w.upgrade()) {
            // notify_one keeps the permit if the task is not waiting yet.
            c.close.notify_one();
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Counts a connection closed on arrival.
    pub(crate) fn refuse(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// A place for one more connection: at once if the cap allows, else
    /// by closing the oldest waiting connection and waiting (at most
    /// `within`) for it to be gone. `None` when every open connection is
    /// serving a request (counted as refused).
    pub(crate) async fn admit(self: &Arc<Self>, within: std::time::Duration) -> Option<Slot> {
        if let Some(s) = self.try_admit() {
            return Some(s);
        }
        if !self.evict_oldest_waiting() {
            self.refuse();
            return None;
        }
        let until = tokio::time::Instant::now() + within;
        loop {
            // The evicted connection's task runs on this runtime: let it.
            tokio::task::yield_now().await;
            if let Some(s) = self.try_admit() {
                return Some(s);
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            if tokio::time::Instant::now() >= until {
                self.refuse();
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Reads need the token only where [`Access::reads_need_token`] says
    /// so; changes always need it when there is one.
    #[test]
    fn reads_need_the_token_where_configured() {
        let token = Some("0123456789abcdef".to_string());
        let mut with = HeaderMap::new();
        with.insert("authorization", "Bearer 0123456789abcdef".parse().unwrap());
        let without = HeaderMap::new();
        let open = Access {
            token: token.clone(),
            reads_need_token: false,
        };
        assert!(open.may_read(&without) && open.may_read(&with));
        assert!(!open.may_change(&without) && open.may_change(&with));
        let closed = Access {
            token,
            reads_need_token: true,
        };
        assert!(!closed.may_read(&without) && closed.may_read(&with));
        let none = Access {
            token: None,
            reads_need_token: false,
        };
        assert!(none.may_read(&without) && none.may_change(&without));
    }
}
