//! Errors as one line of text, for logs and for replies to clients.

/// An error and its sources as one line, `outer: inner: ...` (a source whose
/// text its parent already ends with is not repeated).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let t = src.to_string();
        if !s.ends_with(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = src.source();
    }
    s
}
