//! The HTTP API's paths, written once: the daemon's routes are registered
//! with these ([`crate::http`]) and the command line's client asks for them
//! ([`crate::client`]). A runtime change's path is its route with the
//! backend (and weight) filled in ([`runtime_change`]).

use crate::runtime::Change;

/// `GET`: the Prometheus exposition ([`crate::metrics`]).
pub const METRICS: &str = "/metrics";
/// `GET`: the status document ([`crate::status::Status`]).
pub const STATUS: &str = "/status";
/// `GET`: where the configuration comes from and which revision runs
/// (the status document's `config_source` alone: a fleet of 1,000 VIPs
/// has a status of megabytes, too much to poll for a revision).
pub const SOURCE: &str = "/status/source";
/// `POST`: re-read the configuration file ([`crate::reload`]).
pub const RELOAD: &str = "/reload";
/// `POST`: drain a backend, by name or address (a route: `{backend}`
/// stands for it).
pub const DRAIN: &str = "/backends/{backend}/drain";
/// `POST`: undrain a backend (a route, as [`DRAIN`]).
pub const UNDRAIN: &str = "/backends/{backend}/undrain";
/// `POST`: set a backend's weight (a route: `{weight}` stands for the
/// weight).
pub const WEIGHT: &str = "/backends/{backend}/weight/{weight}";

/// The route of a runtime change.
pub fn route(change: Change) -> &'static str {
    match change {
        Change::Drain => DRAIN,
        Change::Undrain => UNDRAIN,
        Change::Weight(_) => WEIGHT,
    }
}

/// The path that asks for `change` to `backend`. The name is put in as it
/// is: [`crate::client::change`] accepts only names a path carries
/// unchanged.
pub fn runtime_change(backend: &str, change: Change) -> String {
    let route = match change {
        Change::Weight(w) => route(change).replace("{weight}", &w.to_string()),
        _ => route(change).to_string(),
    };
    route.replace("{backend}", backend)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_change_paths_fill_in_their_routes() {
        assert_eq!(runtime_change("b1", Change::Drain), "/backends/b1/drain");
        assert_eq!(
            runtime_change("10.0.0.1", Change::Undrain),
            "/backends/10.0.0.1/undrain"
        );
        assert_eq!(
            runtime_change("b1", Change::Weight(3)),
            "/backends/b1/weight/3"
        );
    }
}
