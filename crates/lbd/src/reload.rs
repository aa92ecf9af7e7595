//! Changing the running configuration: a reload (SIGHUP, `POST /reload`)
//! re-reads the file; a runtime change (`POST /backends/NAME/drain`,
//! `/undrain`, `/weight/N`) edits it ([`crate::runtime`]). Either is
//! validated whole, built aside and swapped in in one step, or refused
//! with nothing changed: the running configuration keeps serving and the
//! reason is logged and returned.
//!
//! A runtime change is written back into the file so that a restart keeps
//! it; a file edited since it was loaded is not overwritten.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use serde::Serialize;

use lb::Config;

use crate::health;
use crate::state::Shared;

/// Why a reload was refused (the running configuration stays).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new file is invalid.
    #[error(transparent)]
    Config(#[from] lb::config::ConfigError),
    /// The XDP program's VIP set could not be updated.
    #[error("updating the XDP VIP set: {0}")]
    XdpVips(#[source] netio::Error),
    /// Tunnel health checks were asked for and the tunnel cannot be made.
    #[error(transparent)]
    Tunnel(#[from] crate::tunnel::TunnelError),
    /// The new file changes who may reach the API or with which token,
    /// which only a restart applies: applied in part, the reload would be
    /// taken for applying it while the old address or token stays in use.
    #[error(
        "{what}; only a restart applies it: restart the daemon, or undo the change and \
         reload (nothing was applied)"
    )]
    NeedsRestart {
        /// What changed and what stays in use until a restart.
        what: String,
    },
    /// The token file could not be read again.
    #[error("reading the API token again: {0}")]
    Token(#[source] lb::config::TokenError),
    /// The configuration comes from etcd, which the daemon follows: a
    /// reload of a file would diverge from the fleet.
    #[error("the configuration comes from etcd (prefix {prefix}), which this load balancer follows by itself: push a change with `fastpath lb config push`")]
    FromEtcd {
        /// The fleet's prefix.
        prefix: String,
    },
}

/// Refuses a configuration whose `[api]` differs from what the API runs
/// with (`running`, the configuration it started with, and `token`, the
/// token it checks), or whose token file (`new_token`, read again now)
/// holds another token: the listening socket and the token are set up
/// once, at start, and an operator who moved the API or rotated a leaked
/// token must not be told it was applied.
fn api_unchanged(
    running: &lb::config::Api,
    token: Option<&str>,
    new: &lb::config::Api,
    new_token: Option<&str>,
) -> Result<(), ReloadError> {
    let refuse = |what: String| Err(ReloadError::NeedsRestart { what });
    if running.listen != new.listen {
        let shown = |l: Option<std::net::SocketAddr>| l.map_or("nowhere".into(), |a| a.to_string());
        return refuse(format!(
            "api.listen changed from {} to {}: the API keeps listening on {} until a restart",
            shown(running.listen),
            shown(new.listen),
            shown(running.listen)
        ));
    }
    if running.token_file != new.token_file || running.token_for_reads != new.token_for_reads {
        return refuse(
            "api.token_file or api.token_for_reads changed: the API keeps checking the token \
             it started with, as it started"
                .into(),
        );
    }
    if token != new_token {
        let file = new
            .token_file
            .as_ref()
            .map_or(String::new(), |f| format!(" in {}", f.display()));
        return refuse(format!(
            "the API token{file} changed: the API keeps accepting the token it started with \
             (and refusing the new one) until a restart"
        ));
    }
    Ok(())
}

/// Why a runtime change (drain, undrain, weight) was refused; nothing
/// changed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The backend, or the file's layout (see [`crate::runtime::EditError`]).
    #[error(transparent)]
    Edit(#[from] crate::runtime::EditError),
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The configuration file.
        path: PathBuf,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The file on disk is not the configuration that runs.
    #[error(
        "{path} changed on disk since it was loaded; not overwriting that edit: \
         apply it first (`fastpath lb reload` or SIGHUP), or undo it, then try again"
    )]
    FileChanged {
        /// The configuration file.
        path: PathBuf,
    },
    /// The change would make the configuration invalid.
    #[error("the configuration after the change is invalid: {0}")]
    Config(#[from] lb::config::ConfigError),
    /// The change could not be applied.
    #[error(transparent)]
    Apply(#[from] ReloadError),
    /// The file could not be written (nothing was applied).
    #[error(transparent)]
    Write(#[from] crate::runtime::WriteError),
    /// The configuration comes from etcd: a change made here alone would
    /// silently diverge from the fleet's.
    #[error("the configuration comes from etcd (prefix {prefix}): change the fleet's configuration with `fastpath lb config push` (a drain or weight set on one load balancer alone would diverge from the fleet)")]
    FromEtcd {
        /// The fleet's prefix.
        prefix: String,
    },
}

/// What a runtime change did (the API's answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct RuntimeChanged {
    /// The backend as asked for.
    pub backend: String,
    /// The change.
    pub change: crate::runtime::Change,
    /// The pools that list the backend: all changed.
    pub pools: Vec<String>,
    /// False when it already was as asked (nothing written or applied).
    pub changed: bool,
    /// The configuration generation after it.
    pub generation: u64,
    /// The configuration file written.
    pub file: String,
}

/// What a reload applied (the API's answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Reloaded {
    /// The configuration generation after it (`/status` `generation`).
    pub generation: u64,
    /// Keys that changed but take effect only at the next start (the
    /// running load balancer keeps the values it started with), as
    /// `section.key`; empty when everything was applied.
    pub not_applied: Vec<String>,
    /// Microseconds from reading the file to the new tables swapped in
    /// (0 for a runtime change, which reports its own).
    pub took_us: u64,
    /// What the parse did: the file's elements and how many were parsed
    /// again (the others were unchanged since the last load).
    pub parsed: lb::config::ChunkStats,
}

/// Re-reads the configuration file and swaps it in, or explains why not.
/// Keys that cannot change while running are reported, not applied.
pub fn reload(shared: &Shared) -> Result<Reloaded, ReloadError> {
    if let Some(src) = &shared.etcd {
        let e = ReloadError::FromEtcd {
            prefix: src.prefix().to_string(),
        };
        tracing::warn!("reload refused: {e}");
        return Err(e);
    }
    reload_with(shared, |cache| Config::load_with(&shared.file.path, cache))
}

/// [`reload`] of a text read elsewhere (the fleet's configuration from
/// etcd, merged with the machine's file), `label` naming it in errors:
/// the same validation, the same refusals (`[api]` changes need a
/// restart) and the same "not applied until restart" keys.
pub fn reload_from_text(
    shared: &Shared,
    text: String,
    label: &str,
) -> Result<Reloaded, ReloadError> {
    reload_with(shared, |cache| {
        crate::source::check_text(text, label, cache)
    })
}

fn reload_with(
    shared: &Shared,
    load: impl FnOnce(
        &mut lb::config::ParseCache,
    ) -> Result<lb::config::Checked, lb::config::ConfigError>,
) -> Result<Reloaded, ReloadError> {
    let mut applied = shared
        .file
        .applied
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let applied = &mut *applied;
    let started = std::time::Instant::now();
    let result = load(&mut applied.cache)
        .map(|c| (c.config, c.text))
        .map_err(ReloadError::from)
        .and_then(|(cfg, text)| {
            let new_token = cfg
                .api
                .token_file
                .as_deref()
                .map(lb::config::read_token)
                .transpose()
                .map_err(ReloadError::Token)?;
            api_unchanged(
                &shared.file.boot.api,
                shared.api.token.as_deref(),
                &cfg.api,
                new_token.as_deref(),
            )?;
            let mut r = apply_config(shared, cfg)?;
            applied.text = text;
            r.took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            r.parsed = applied.cache.last();
            Ok(r)
        });
    match &result {
        Ok(r) => {
            shared.changes.reloads.fetch_add(1, Ordering::Relaxed);
            *shared
                .changes
                .last_reload_error
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = None;
            tracing::info!(
                generation = r.generation,
                took_ms = r.took_us as f64 / 1e3,
                elements_parsed = r.parsed.parsed,
                elements = r.parsed.chunks,
                "configuration reloaded"
            );
            if !r.not_applied.is_empty() {
                tracing::warn!(
                    "not applied until the next start: {} (the running values stay)",
                    r.not_applied.join(", ")
                );
            }
        }
        Err(e) => {
            shared
                .changes
                .reload_failures
                .fetch_add(1, Ordering::Relaxed);
            *shared
                .changes
                .last_reload_error
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            tracing::error!("reload rejected, the running configuration stays: {e}");
        }
    }
    result
}

/// Swaps in a validated configuration (a reload's or a runtime
/// change's) in one step, or changes nothing; counts a generation.
fn apply_config(shared: &Shared, mut cfg: Config) -> Result<Reloaded, ReloadError> {
    if cfg.encap.mac.is_none() {
        cfg.encap.mac.clone_from(&shared.file.interface_mac);
    }
    let checks = health::checks(&cfg);
    shared.health.ensure_tunnel(&checks)?;
    let mut c = shared.control.lock().unwrap_or_else(|p| p.into_inner());
    c.apply(cfg.clone())?;
    *shared
        .health
        .check_names
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = checks;
    if let Some(f) = &shared.datapath.xdp_vips {
        f.set(&crate::ports::vip_addresses(&cfg))
            .map_err(ReloadError::XdpVips)?;
        // The prefixes of the tables just applied (their matcher).
        f.set_prefixes(&crate::ports::vip_prefixes(&c.tables().load().matcher))
            .map_err(ReloadError::XdpVips)?;
        crate::tasks::peers::set_xdp_redirects(f, &cfg).map_err(ReloadError::XdpVips)?;
    }
    drop(c);
    // The checks, and so the API's share of open files, may have changed.
    crate::limits::share_open_files(&shared.budget, &shared.api_connections, &cfg, None);
    // The backends or gateway_mac may have changed.
    shared.gateway.kick();
    Ok(Reloaded {
        generation: shared.file.generation.fetch_add(1, Ordering::Relaxed) + 1,
        not_applied: shared.file.boot.restart_keys(&cfg),
        took_us: 0,
        parsed: lb::config::ChunkStats::default(),
    })
}

/// Drains, undrains or reweighs `backend` (a name, or an address) in
/// every pool that lists it: the file's text is edited
/// ([`crate::runtime::edit`]), the result validated and applied whole
/// like a reload, then written back in one step. Nothing changes on
/// any error: an unknown backend, a file edited since it was loaded
/// (reload it first), a configuration the change makes invalid.
pub fn runtime_change(
    shared: &Shared,
    backend: &str,
    change: crate::runtime::Change,
) -> Result<RuntimeChanged, RuntimeError> {
    let result = runtime_change_inner(shared, backend, change);
    match &result {
        Ok(r) => {
            shared
                .changes
                .runtime_changes
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                backend,
                %change,
                pools = ?r.pools,
                generation = r.generation,
                changed = r.changed,
                "runtime change applied and written to the configuration file"
            );
        }
        Err(e) => {
            shared
                .changes
                .runtime_change_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(backend, %change, "runtime change refused: {e}");
        }
    }
    result
}

fn runtime_change_inner(
    shared: &Shared,
    backend: &str,
    change: crate::runtime::Change,
) -> Result<RuntimeChanged, RuntimeError> {
    if let Some(src) = &shared.etcd {
        return Err(RuntimeError::FromEtcd {
            prefix: src.prefix().to_string(),
        });
    }
    let mut applied = shared
        .file
        .applied
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let path = &shared.file.path;
    let file = path.display().to_string();
    let on_disk = std::fs::read_to_string(path).map_err(|source| RuntimeError::Read {
        path: path.clone(),
        source,
    })?;
    if on_disk != applied.text {
        return Err(RuntimeError::FileChanged { path: path.clone() });
    }
    // Only the pools that list the backend are parsed and edited: the
    // running configuration was parsed from exactly this text.
    let edited = {
        let c = shared.control();
        crate::runtime::edit_with(&on_disk, c.config(), backend, change)?
    };
    let generation = shared.file.generation.load(Ordering::Relaxed);
    let mut out = RuntimeChanged {
        backend: backend.to_string(),
        change,
        pools: edited.pools.clone(),
        changed: edited.changed,
        generation,
        file,
    };
    if !edited.changed {
        return Ok(out);
    }
    let cfg = Config::check_text(edited.text.clone(), &out.file, &mut applied.cache)?.config;
    let old = shared.control().config().clone();
    crate::runtime::write_atomically(path, &edited.text)?;
    match apply_config(shared, cfg) {
        Ok(r) => {
            out.generation = r.generation;
            applied.text = edited.text;
            Ok(out)
        }
        Err(e) => {
            // Not applied: the file goes back to what runs.
            let _ = crate::runtime::write_atomically(path, &on_disk);
            let _ = shared.control().apply(old);
            Err(e.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(listen: &str, token_file: Option<&str>) -> lb::config::Api {
        lb::config::Api {
            listen: Some(listen.parse().unwrap()),
            token_file: token_file.map(Into::into),
            token_for_reads: None,
        }
    }

    /// A moved API, another token file or another token in the same file
    /// is refused, saying a restart is needed and what stays in use; the
    /// same `[api]` and token pass.
    #[test]
    fn api_changes_are_refused_as_needing_a_restart() {
        let running = api("127.0.0.1:9180", Some("/etc/t"));
        let tok = Some("0123456789abcdef");
        assert!(api_unchanged(&running, tok, &running.clone(), tok).is_ok());
        let moved = api("127.0.0.1:9181", Some("/etc/t"));
        let e = api_unchanged(&running, tok, &moved, tok).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("api.listen")
                && msg.contains("keeps listening on 127.0.0.1:9180")
                && msg.contains("restart"),
            "{msg}"
        );
        let other_file = api("127.0.0.1:9180", Some("/etc/u"));
        let msg = api_unchanged(&running, tok, &other_file, tok)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("api.token_file") && msg.contains("restart"),
            "{msg}"
        );
        let rotated = Some("fedcba9876543210");
        let msg = api_unchanged(&running, tok, &running.clone(), rotated)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("token in /etc/t changed") && msg.contains("restart"),
            "{msg}"
        );
        let mut reads = running.clone();
        reads.token_for_reads = Some(true);
        assert!(api_unchanged(&running, tok, &reads, tok).is_err());
    }
}
