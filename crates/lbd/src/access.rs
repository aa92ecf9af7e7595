//! Who may use the HTTP API and how many at once: the bearer token
//! (`[api] token_file`, and `[api] token_for_reads` for reads) and the cap
//! on open connections that [`crate::limits`] sets, so that a flood cannot
//! take the descriptors health checks need. What [`crate::state::Shared`]
//! holds of the API lives here, apart from the routes ([`crate::http`]), so
//! that the state depends on nothing that uses it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

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

/// The API's open connections, and how many it may hold at once.
#[derive(Debug)]
pub struct Connections {
    open: AtomicUsize,
    cap: AtomicUsize,
    refused: AtomicU64,
}

/// One admitted connection: its place is given back when it ends.
#[derive(Debug)]
pub(crate) struct Slot(Arc<Connections>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Connections {
    /// None open, at most `cap`.
    pub fn new(cap: usize) -> Arc<Connections> {
        Arc::new(Connections {
            open: AtomicUsize::new(0),
            cap: AtomicUsize::new(cap),
            refused: AtomicU64::new(0),
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

    /// Connections closed on arrival because [`Connections::cap`] were
    /// open.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// A place for one more connection, unless the cap is reached (the
    /// accept loop is the only caller, so the check and the count cannot
    /// race with another admission).
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Slot> {
        if self.open() >= self.cap() {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.open.fetch_add(1, Ordering::AcqRel);
        Some(Slot(Arc::clone(self)))
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
