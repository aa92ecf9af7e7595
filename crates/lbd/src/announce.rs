//! The paper's section 3.2 announcement: fastpath writes the VIP routes
//! into a file per address family that BIRD includes, and enables or
//! disables the static protocol that holds them (one per family: BIRD's
//! static protocols are). No BGP is spoken here: BIRD holds the sessions,
//! and is asked through [`crate::bird`].
//!
//! Each routes file also states its protocol's wanted state (`disabled
//! no;` while fastpath forwards, `disabled yes;` otherwise, [`with_state`]),
//! included after the shipped `disabled;` so that the file's word is the
//! last. BIRD restarts a protocol on `birdc configure` when its configured
//! state differs from its run-time one; with the file saying what
//! `birdc enable`/`disable` did, a configure (fastpath's own after a VIP-set
//! change, or an operator's) changes only the routes that changed, route by
//! route, and the VIPs that did not change stay announced throughout. The
//! file is written before every `birdc disable` (a withdrawal, a stop,
//! `fastpath lb withdraw`), so a BIRD restarted or reconfigured after a
//! crash never announces a dead load balancer.
//!
//! An announcement is a promise that this load balancer forwards, so it is
//! never assumed: every step reads back from BIRD (`birdc show protocols
//! all`) whether each protocol is up, how many routes it holds, and what the
//! established BGP sessions export, and puts BIRD back where it differs
//! from what fastpath wants: a restarted BIRD, a routes file replaced, a
//! BIRD configuration that does not include the routes files (and so
//! starts each protocol `disabled` again on every configure): each is
//! repaired at the next step. What to do is decided by a pure function
//! ([`decide`]: what fastpath wants and what BIRD shows in, [`Action`]s
//! out); [`Announcer::apply`] carries it out through a [`Bird`], and
//! [`Announcer::step`] is one poll of the controller
//! ([`crate::tasks::bgp`]): the routes files, then the decisions.
//!
//! `/status`, `/metrics` and `lb status` say what BIRD said when the BGP
//! task last read it, and how long ago ([`BgpState::last`], [`status`]),
//! beside what fastpath wants and a `mismatch` in words when the two
//! differ. They never run birdc themselves.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use lb::config::{Bgp, Config};
use serde::{Deserialize, Serialize};

use crate::bird::{
    read_view, read_view_with_routes, Bird, BirdError, BirdView, Family, FamilyView, Target,
};

/// Why a step of the announcer fell short; each is kept, typed.
#[derive(Debug, thiserror::Error)]
pub enum AnnounceError {
    /// The file of VIP routes that BIRD includes could not be written.
    #[error("writing {path}: {source}")]
    RoutesFile {
        /// The file (`[bgp] vips_file` or `vips_file6`).
        path: PathBuf,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// BIRD did not answer, or refused a command.
    #[error(transparent)]
    Bird(#[from] Arc<BirdError>),
    /// BIRD has no protocol of the name `[bgp]` gives.
    #[error(
        "BIRD has no protocol {protocol} for the {family} VIPs: its configuration must define it \
         (dist/bird/fastpath.conf does, as [bgp] {key} names it)"
    )]
    NoProtocol {
        /// The protocol's name.
        protocol: String,
        /// Its family.
        family: Family,
        /// The key that names it.
        key: &'static str,
    },
}

impl From<BirdError> for AnnounceError {
    fn from(e: BirdError) -> AnnounceError {
        AnnounceError::Bird(Arc::new(e))
    }
}

/// Everything one step of the announcer could not do, in the order met.
#[derive(Debug, thiserror::Error)]
#[error("{}", join(.0))]
pub struct StepError(pub Vec<AnnounceError>);

/// The errors in words, `; ` between them.
fn join(errors: &[AnnounceError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// One family as the controller wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyPlan {
    /// Its protocol and routes file.
    pub target: Target,
    /// The routes in its file: its VIPs with a healthy backend.
    pub routes: u64,
    /// Those routes' prefixes.
    pub prefixes: BTreeSet<String>,
}

/// What the controller wants of BIRD and what it did, shared with the API.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The `[bgp]` section it works with.
    pub bgp: Bgp,
    /// Whether the datapath beats: the VIPs are to be announced.
    pub forwarding: bool,
    /// The families it manages: IPv4, and IPv6 from its first VIP on.
    pub families: Vec<FamilyPlan>,
    /// Times BIRD was found changed behind fastpath's back and put back.
    pub repairs: u64,
    /// What the last step could not do.
    pub error: Option<Arc<StepError>>,
    /// Whether BIRD announced some VIP when the last step ended.
    pub announced: bool,
    /// The configuration generation the step worked from (the daemon's
    /// `generation` in `/status`; 0 where not known).
    pub generation: u64,
}

impl Plan {
    /// Whether fastpath wants some VIP announced.
    pub fn wanted(&self) -> bool {
        self.forwarding && self.families.iter().any(|f| f.routes > 0)
    }
}

/// A reading of BIRD's state and when it began.
#[derive(Debug, Clone)]
pub struct Reading {
    /// When the question was put.
    pub started: Instant,
    /// BIRD's answer, or why there was none.
    pub view: Result<BirdView, Arc<BirdError>>,
}

impl Reading {
    /// Asks BIRD now (its protocols only).
    pub fn take(bird: &dyn Bird) -> Reading {
        let started = Instant::now();
        Reading {
            started,
            view: read_view(bird).map_err(Arc::new),
        }
    }

    /// Asks BIRD now for its protocols and the routes `wanted`'s static
    /// protocols hold.
    pub fn take_with_routes(bird: &dyn Bird, wanted: &[Wanted]) -> Reading {
        let started = Instant::now();
        let statics: Vec<&str> = wanted.iter().map(|w| w.target.protocol.as_str()).collect();
        Reading {
            started,
            view: read_view_with_routes(bird, &statics).map_err(Arc::new),
        }
    }
}

/// The prefixes of a routes file's text (`route 198.18.0.80/32
/// blackhole;` lines), as [`crate::bird::prefix`] writes them.
pub fn route_prefixes(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("route "))
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(crate::bird::prefix)
        .collect()
}

/// One family as fastpath wants it, for [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// Its protocol and routes file.
    pub target: Target,
    /// The routes file's text as fastpath wrote it.
    pub text: String,
    /// The routes in it.
    pub routes: u64,
}

/// What the announcer remembers between steps, for [`decide`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    /// A `birdc configure` is owed: a routes file's routes changed and
    /// BIRD has not read it since.
    pub configure_owed: bool,
    /// Per family, the routes file's text for which a configure was made
    /// because BIRD held other routes: not made again for the same text
    /// (BIRD's configuration may not include the file; a configure per
    /// poll would have BIRD read its whole configuration every poll, and
    /// restart each protocol whose state that configuration does not
    /// state).
    pub stale_configured: BTreeMap<Family, String>,
    /// Protocols fastpath enabled and saw up: one found down later was
    /// reset behind its back.
    pub enabled: BTreeSet<String>,
}

/// Why a protocol is disabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    /// Fastpath had it announced and the datapath stopped beating.
    Stalled,
    /// BIRD has it up though fastpath never enabled it and does not
    /// forward: a repair.
    Unasked,
}

/// One thing to do so that BIRD shows what fastpath wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// BIRD holds other routes than the family's file (it read another
    /// version of it, or none): a configure is owed, once for this text.
    Stale {
        /// The family.
        family: Family,
        /// The file's text it was found stale against.
        text: String,
    },
    /// Have BIRD read its configuration (and so the routes files) again.
    /// The files state each protocol's wanted state, so this changes only
    /// routes where BIRD's run-time state is the file's (and sets it where
    /// it is not); what follows it in the same decision is decided again
    /// on a fresh reading.
    Configure,
    /// The protocol is up as wanted: remember that fastpath has it on.
    Keep {
        /// The protocol.
        protocol: String,
    },
    /// Enable the protocol: announce the family's VIPs.
    Enable {
        /// The family's protocol and file.
        target: Target,
        /// The state BIRD shows it in (`down`, mostly).
        state: String,
        /// Whether fastpath had it on and BIRD turned it off (disabled by
        /// hand, or a configure of a BIRD whose configuration does not
        /// include the routes files): a repair.
        repair: bool,
    },
    /// Disable the protocol: withdraw the family's VIPs.
    Disable {
        /// The family's protocol and file.
        target: Target,
        /// Why.
        why: Withdrawal,
    },
    /// BIRD has no such protocol: nothing can be done but say so.
    Missing {
        /// The family's protocol and file.
        target: Target,
    },
}

/// What to do so that BIRD shows what fastpath wants: the families in
/// `wanted` announced if `forwarding`, withdrawn otherwise, given what BIRD
/// shows (`view`) and what the announcer remembers. Pure: it reads nothing
/// and runs nothing; [`Announcer::apply`] carries the actions out.
pub fn decide(
    forwarding: bool,
    wanted: &[Wanted],
    view: &BirdView,
    memory: &Memory,
) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut configure = memory.configure_owed;
    for w in wanted {
        let v = view.family(&w.target);
        // Route by route where BIRD was asked for them: the same number
        // of other routes is stale too.
        let differs = match view.held.get(&w.target.protocol) {
            Some(held) => *held != route_prefixes(&w.text),
            None => v.routes != w.routes,
        };
        if v.state.as_deref() == Some("up")
            && differs
            && memory.stale_configured.get(&w.target.family) != Some(&w.text)
        {
            actions.push(Action::Stale {
                family: w.target.family,
                text: w.text.clone(),
            });
            configure = true;
        }
    }
    if configure {
        actions.push(Action::Configure);
    }
    for w in wanted {
        let t = &w.target;
        let Some(state) = view.family(t).state else {
            actions.push(Action::Missing { target: t.clone() });
            continue;
        };
        let enabled = memory.enabled.contains(&t.protocol);
        match (forwarding, state.as_str()) {
            // On its way up or down: BIRD is at it already.
            (_, "start" | "stop") => {}
            (true, "up") => actions.push(Action::Keep {
                protocol: t.protocol.clone(),
            }),
            (true, _) => actions.push(Action::Enable {
                target: t.clone(),
                state: state.clone(),
                repair: enabled,
            }),
            (false, "up") => actions.push(Action::Disable {
                target: t.clone(),
                why: if enabled {
                    Withdrawal::Stalled
                } else {
                    Withdrawal::Unasked
                },
            }),
            (false, _) => {}
        }
    }
    actions
}

/// Announcement state, driven by [`Announcer::step`].
#[derive(Debug, Default)]
pub struct Announcer {
    /// The families managed in this run: IPv4, and IPv6 once the
    /// configuration has an IPv6 VIP (before that, a BIRD without an IPv6
    /// protocol is no error).
    managed: Vec<Target>,
    /// What [`decide`] is told of the steps before.
    memory: Memory,
    /// Times BIRD was put back.
    pub repairs: u64,
    /// The last step's errors as they were logged, if it had any: they
    /// are logged again only when they change (the step's own are typed,
    /// in [`Plan::error`]).
    last_logged: Option<String>,
}

impl Announcer {
    /// Makes BIRD's state match: for each managed family, the routes of the
    /// VIPs of `cfg` that `serving` accepts (those with a healthy backend)
    /// in its routes file, read by BIRD, and its protocol enabled if the
    /// forwarder is `forwarding`, disabled otherwise. Reads BIRD first and
    /// acts only where it differs ([`decide`], then [`Announcer::apply`]).
    /// What it wants, and BIRD's state as it left it.
    pub fn step(
        &mut self,
        bird: &dyn Bird,
        b: &Bgp,
        cfg: &Config,
        forwarding: bool,
        serving: &dyn Fn(usize) -> bool,
    ) -> (Plan, Reading) {
        let mut errors: Vec<AnnounceError> = Vec::new();
        // Families: IPv4, IPv6 once it has VIPs; targets renamed by a
        // reload are withdrawn.
        let targets = targets(b);
        for old in std::mem::take(&mut self.managed) {
            if targets.contains(&old) {
                self.managed.push(old);
            } else {
                let _ = self.disable(bird, &old, "no longer named in [bgp]");
            }
        }
        for t in targets {
            let has_vips = cfg
                .vips
                .iter()
                .any(|v| v.address.is_some_and(|a| Family::of(a) == t.family));
            if !self.managed.contains(&t) && (t.family == Family::Ipv4 || has_vips) {
                self.managed.push(t);
            }
        }
        // The routes files, as the file system has them: rewritten where
        // they differ (a restarted machine's empty /run, another writer),
        // with the protocol's wanted state. A configure is owed only where
        // the routes changed: a change of state alone is made by the
        // enable or disable that follows (and a configure would change
        // nothing, as BIRD's run-time state is then the file's).
        let mut wanted = Vec::new();
        for t in &self.managed {
            let text = with_state(&routes(cfg, t.family == Family::Ipv6, serving), forwarding);
            let old = std::fs::read_to_string(&t.routes_file).ok();
            if old.as_deref() != Some(text.as_str()) {
                match write_routes(&t.routes_file, &text) {
                    Ok(()) => {
                        self.memory.configure_owed |= !only_state_differs(old.as_deref(), &text);
                    }
                    Err(e) => errors.push(e),
                }
            }
            wanted.push(Wanted {
                target: t.clone(),
                routes: route_count(&text),
                text,
            });
        }
        let mut plan = Plan {
            bgp: b.clone(),
            forwarding,
            families: wanted
                .iter()
                .map(|w| FamilyPlan {
                    target: w.target.clone(),
                    routes: w.routes,
                    prefixes: route_prefixes(&w.text),
                })
                .collect(),
            repairs: self.repairs,
            error: None,
            announced: false,
            generation: 0,
        };
        let reading = self.apply(bird, forwarding, &wanted, &mut errors);
        plan.repairs = self.repairs;
        self.finish(&mut plan, &reading, errors);
        (plan, reading)
    }

    /// Reads BIRD, and carries out what [`decide`] says to make it show
    /// `wanted`; a configure that succeeds is followed by a fresh reading
    /// and a fresh decision (at most one configure a step). Errors are
    /// added to `errors`; BIRD's state as it was left is returned.
    pub fn apply(
        &mut self,
        bird: &dyn Bird,
        forwarding: bool,
        wanted: &[Wanted],
        errors: &mut Vec<AnnounceError>,
    ) -> Reading {
        let mut reading = Reading::take_with_routes(bird, wanted);
        let mut configured = false;
        let mut acted = false;
        'decide: loop {
            let view = match &reading.view {
                Ok(v) => v.clone(),
                Err(e) => {
                    errors.push(AnnounceError::Bird(Arc::clone(e)));
                    return reading;
                }
            };
            for action in decide(forwarding, wanted, &view, &self.memory) {
                match action {
                    Action::Stale { family, text } => {
                        self.memory.stale_configured.insert(family, text);
                        self.memory.configure_owed = true;
                    }
                    // Owed still: made at the next step.
                    Action::Configure if configured => {}
                    Action::Configure => {
                        configured = true;
                        match bird.run(&["configure"]) {
                            Ok(_) => {
                                self.memory.configure_owed = false;
                                // The files state what fastpath wants, so a
                                // protocol fastpath had on stays on: one found
                                // down now was turned off by something else (a
                                // BIRD configuration that does not include the
                                // file), and putting it back is a repair.
                                reading = Reading::take_with_routes(bird, wanted);
                                continue 'decide;
                            }
                            Err(e) => errors.push(e.into()),
                        }
                    }
                    Action::Keep { protocol } => {
                        // Up without an enable: a configure that read
                        // `disabled no;` in the file enabled it.
                        if !self.memory.enabled.contains(&protocol) {
                            tracing::info!(protocol = %protocol, "BGP: VIPs announced ({protocol} up)");
                        }
                        self.memory.enabled.insert(protocol);
                    }
                    Action::Enable {
                        target: t,
                        state,
                        repair,
                    } => {
                        if repair {
                            self.repairs += 1;
                            self.memory.enabled.remove(&t.protocol);
                            tracing::warn!(
                                protocol = %t.protocol,
                                state,
                                "BGP: BIRD has {} {state} though fastpath announced its {} VIPs \
                                 (disabled by hand, or BIRD's configuration does not include the routes file): \
                                 enabling it again",
                                t.protocol,
                                t.family
                            );
                        } else {
                            tracing::info!(protocol = %t.protocol, "BGP: {} VIPs announced", t.family);
                        }
                        match bird.run(&["enable", &t.protocol]) {
                            Ok(_) => {
                                acted = true;
                                self.memory.enabled.insert(t.protocol.clone());
                            }
                            Err(e) => errors.push(e.into()),
                        }
                    }
                    Action::Disable { target: t, why } => {
                        self.memory.enabled.remove(&t.protocol);
                        match why {
                            Withdrawal::Stalled => tracing::warn!(
                                protocol = %t.protocol,
                                "BGP: {} VIPs withdrawn: the datapath stopped beating",
                                t.family
                            ),
                            Withdrawal::Unasked => {
                                self.repairs += 1;
                                tracing::warn!(
                                    protocol = %t.protocol,
                                    "BGP: BIRD has {} up though fastpath does not forward: disabling it",
                                    t.protocol
                                );
                            }
                        }
                        match bird.run(&["disable", &t.protocol]) {
                            Ok(_) => acted = true,
                            Err(e) => errors.push(e.into()),
                        }
                    }
                    Action::Missing { target: t } => errors.push(AnnounceError::NoProtocol {
                        protocol: t.protocol.clone(),
                        family: t.family,
                        key: t.key(),
                    }),
                }
            }
            break;
        }
        if acted {
            reading = Reading::take_with_routes(bird, wanted);
        }
        reading
    }

    /// Records the step's errors (logged when they change) and whether
    /// BIRD announces.
    fn finish(&mut self, plan: &mut Plan, reading: &Reading, errors: Vec<AnnounceError>) {
        let error = (!errors.is_empty()).then(|| Arc::new(StepError(errors)));
        let words = error.as_ref().map(ToString::to_string);
        if words.is_some() && words != self.last_logged {
            tracing::error!("BGP controller: {}", words.as_deref().unwrap_or(""));
        }
        self.last_logged = words;
        plan.error = error;
        plan.announced = reading.view.as_ref().is_ok_and(|v| {
            plan.families
                .iter()
                .any(|f| v.family(&f.target).announced())
        });
    }

    /// Disables `t`'s protocol, its routes file saying `disabled yes;`
    /// first (a BIRD that reads it later keeps the protocol off); what
    /// could not be done, in words.
    fn disable(&mut self, bird: &dyn Bird, t: &Target, why: &str) -> Option<String> {
        self.memory.enabled.remove(&t.protocol);
        let mut failed = Vec::new();
        if let Err(e) = mark_withdrawn(&t.routes_file) {
            tracing::error!(protocol = %t.protocol, "BGP controller: {e}");
            failed.push(e.to_string());
        }
        match bird.run(&["disable", &t.protocol]) {
            Ok(_) => {
                tracing::info!(protocol = %t.protocol, "BGP: {} VIPs withdrawn ({why})", t.family);
            }
            Err(e) => {
                tracing::error!(
                    protocol = %t.protocol,
                    "BGP controller: could not withdraw the {} VIPs: {e}",
                    t.family
                );
                failed.push(e.to_string());
            }
        }
        (!failed.is_empty())
            .then(|| format!("{} VIPs ({}): {}", t.family, t.protocol, failed.join("; ")))
    }

    /// Withdraws every VIP (on shutdown, and when `[bgp]` goes away); what
    /// could not be withdrawn, one entry a family.
    pub fn withdraw(&mut self, bird: &dyn Bird) -> Vec<String> {
        std::mem::take(&mut self.managed)
            .iter()
            .filter_map(|t| self.disable(bird, t, "stopping"))
            .collect()
    }
}

/// The families `[bgp]` can announce: IPv4 always, IPv6 unless
/// `protocol6` is empty.
pub fn targets(b: &Bgp) -> Vec<Target> {
    let mut t = vec![Target {
        family: Family::Ipv4,
        protocol: b.protocol.clone(),
        routes_file: b.vips_file.clone(),
    }];
    if !b.protocol6.is_empty() {
        t.push(Target {
            family: Family::Ipv6,
            protocol: b.protocol6.clone(),
            routes_file: b.routes_file6(),
        });
    }
    t
}

/// What a configuration with `[bgp]` will not announce, in words: IPv6
/// VIPs when `protocol6` is empty, VIPs that match a prefix group (they
/// have no one address to announce). `check-config` prints these and the
/// daemon logs them at start, so that no VIP goes unannounced silently.
pub fn unannounced(cfg: &Config) -> Vec<String> {
    let Some(b) = &cfg.bgp else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let v6: Vec<&str> = cfg
        .vips
        .iter()
        .filter(|v| v.address.is_some_and(|a| a.is_ipv6()))
        .map(|v| v.name.as_str())
        .collect();
    if !v6.is_empty() && b.protocol6.is_empty() {
        out.push(format!(
            "IPv6 VIPs {} are not announced: [bgp] protocol6 is empty (set it to BIRD's IPv6 static \
             protocol, fastpath_vips6 in dist/bird/fastpath.conf, or route them another way)",
            v6.join(", ")
        ));
    }
    let grouped: Vec<&str> = cfg
        .vips
        .iter()
        .filter(|v| v.address.is_none())
        .map(|v| v.name.as_str())
        .collect();
    if !grouped.is_empty() {
        out.push(format!(
            "VIPs {} match prefix groups and are not announced through [bgp] (no one address to \
             announce): route their prefixes to the load balancers another way",
            grouped.join(", ")
        ));
    }
    out
}

/// The BIRD static routes for the configuration's address VIPs whose
/// index `serving` accepts (one route per address, whatever its ports; an
/// address is announced if any VIP on it serves). Only the family of `ipv6`
/// is written: BIRD's static protocol is per address family.
pub fn routes(cfg: &Config, ipv6: bool, serving: &dyn Fn(usize) -> bool) -> String {
    let mut addrs: Vec<std::net::IpAddr> = cfg
        .vips
        .iter()
        .enumerate()
        .filter(|(i, _)| serving(*i))
        .filter_map(|(_, v)| v.address)
        .filter(|a| a.is_ipv6() == ipv6)
        .collect();
    addrs.sort();
    addrs.dedup();
    let mut s = String::from(lb::config::VIPS_FILE_HEADER);
    for a in addrs {
        let len = if a.is_ipv4() { 32 } else { 128 };
        let _ = writeln!(s, "route {a}/{len} blackhole;");
    }
    s
}

/// The routes in a routes file's text.
fn route_count(text: &str) -> u64 {
    text.lines().filter(|l| l.starts_with("route ")).count() as u64
}

/// The line of a routes file that states its protocol's wanted state:
/// BIRD's `disabled` option, which the file sets after the shipped
/// configuration's `disabled;` (the last one read is BIRD's).
pub fn state_line(announce: bool) -> &'static str {
    if announce {
        "disabled no;"
    } else {
        "disabled yes;"
    }
}

/// Whether a line is a `disabled` option (a state line of any version).
fn is_state_line(line: &str) -> bool {
    let l = line.trim_start();
    l.strip_prefix("disabled")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', ';']))
}

/// A routes file's text (as [`routes`] writes it) with its protocol's
/// wanted state: the header, the state line, then the routes; any state
/// line the text had is replaced.
pub fn with_state(text: &str, announce: bool) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut stated = false;
    for line in text.lines() {
        if is_state_line(line) {
            continue;
        }
        // After the leading comments (the header), before the first
        // statement.
        if !stated && !line.starts_with('#') {
            out.push_str(state_line(announce));
            out.push('\n');
            stated = true;
        }
        out.push_str(line);
        out.push('\n');
    }
    if !stated {
        out.push_str(state_line(announce));
        out.push('\n');
    }
    out
}

/// The wanted state a routes file's text states: `Some(true)` for
/// `disabled no;`, `Some(false)` for `disabled yes;` (or a bare
/// `disabled;`), none without a state line (a file of an older version).
pub fn stated(text: &str) -> Option<bool> {
    text.lines()
        .rev()
        .find(|l| is_state_line(l))
        .map(|l| !matches!(l.trim(), "disabled;" | "disabled yes;"))
}

/// Whether `new` differs from the file's `old` text in its state line
/// alone (its routes and comments the same): no configure is owed for it.
fn only_state_differs(old: Option<&str>, new: &str) -> bool {
    let rest = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !is_state_line(l))
            .map(str::to_string)
            .collect()
    };
    old.is_some_and(|o| rest(o) == rest(new))
}

/// Has the routes file at `path` say `disabled yes;`, its routes kept: a
/// withdrawal's first step, so that a BIRD that reads the file later (a
/// configure, a restart) keeps the protocol off. A missing file is left
/// missing: BIRD then keeps the shipped `disabled;`.
pub fn mark_withdrawn(path: &Path) -> Result<(), AnnounceError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(AnnounceError::RoutesFile {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let new = with_state(&text, false);
    if new == text {
        return Ok(());
    }
    write_routes(path, &new)
}

/// Replaces `path` with `text` whole: written to a new file of a name of
/// its own beside it (never an existing file or link), then renamed over
/// it, so BIRD never reads half a file.
fn write_routes(path: &Path, text: &str) -> Result<(), AnnounceError> {
    use std::io::Write as _;
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let err = |source| AnnounceError::RoutesFile {
        path: path.to_path_buf(),
        source,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = path.with_file_name(format!(
        ".{name}.{}.{}.{nanos:x}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(err)?;
    let res = f
        .write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res.map_err(err)
}

/// The controller's part of the shared state: what it wants and did, and
/// BIRD's state as it last read it, kept together so that a document
/// shows a plan beside the reading of the same step. Requests read this
/// and never ask BIRD themselves: a BIRD that hangs or floods costs the
/// BGP task its time, never the API.
#[derive(Debug, Default)]
pub struct BgpState {
    /// The last step's plan (none without `[bgp]`) and reading.
    last: Mutex<(Option<Plan>, Option<Reading>)>,
}

impl BgpState {
    /// What the controller wants, as of its last step.
    pub fn plan(&self) -> Option<Plan> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }

    /// The last step's plan and BIRD's state as that step last read it
    /// (how old it is: [`Reading::started`]); none before the first step.
    pub fn last(&self) -> Option<(Plan, Reading)> {
        let l = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match &*l {
            (Some(p), Some(r)) => Some((p.clone(), r.clone())),
            _ => None,
        }
    }

    /// Publishes a step: its plan, and its reading (none keeps the last).
    pub(crate) fn set(&self, plan: Option<Plan>, reading: Option<Reading>) {
        let mut l = self.last.lock().unwrap_or_else(|p| p.into_inner());
        l.0 = plan;
        if let Some(r) = reading {
            l.1 = Some(r);
        }
    }
}

/// One family in `/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BgpFamilyStatus {
    /// `ipv4` or `ipv6`.
    pub family: Family,
    /// BIRD's static protocol that holds its VIPs.
    pub protocol: String,
    /// The routes file fastpath writes for it.
    pub routes_file: String,
    /// Routes fastpath wants announced: its VIPs with a healthy backend
    /// while the datapath beats, else 0.
    pub wanted_routes: u64,
    /// The protocol's state as BIRD says: `up`, `down` (disabled or
    /// failed), `start`, `stop`, or `missing` (BIRD has no such protocol,
    /// or did not answer).
    pub state: String,
    /// Routes BIRD holds in the protocol.
    pub routes: u64,
    /// Established BGP sessions that carry the family.
    pub sessions: u64,
    /// Routes those sessions export.
    pub exported: u64,
    /// Whether the router is told what fastpath wants: the protocol is up
    /// holding every wanted VIP (compared route by route), and each
    /// established session of the family exports them.
    pub announced: bool,
    /// Wanted VIP prefixes BIRD's protocol does not hold (empty in
    /// documents from versions without it).
    #[serde(default)]
    pub missing: Vec<String>,
    /// Prefixes BIRD's protocol holds that fastpath does not want
    /// announced (empty in documents from versions without it).
    #[serde(default)]
    pub unwanted: Vec<String>,
}

/// BGP in `/status`: what fastpath wants and what BIRD says, read when the
/// document was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BgpStatus {
    /// Whether fastpath wants VIPs announced: its datapath beats and some
    /// VIP has a healthy backend.
    pub wanted: bool,
    /// Whether BIRD announces VIPs to the router now (some family is
    /// announced), as BIRD says.
    pub announced: bool,
    /// What differs between what fastpath wants and what BIRD does, in
    /// words; none when they agree. The controller puts BIRD back at its
    /// next poll where it can.
    pub mismatch: Option<String>,
    /// Times the controller found BIRD changed behind its back and put it
    /// back (re-enabled after someone disabled the protocol, say).
    pub repairs: u64,
    /// How long before this document BIRD was read, milliseconds: the BGP
    /// task reads it at every poll and right after it changes something,
    /// and the document shows that reading (it never asks BIRD itself).
    pub read_ms_ago: u64,
    /// The configuration generation the controller's last step worked
    /// from: a change is reflected once this reaches the generation the
    /// change made and the reading is younger than the change (0 in
    /// documents from versions without it).
    #[serde(default)]
    pub generation: u64,
    /// The last error talking to BIRD, or BIRD's missing protocols.
    pub error: Option<String>,
    /// Each family fastpath manages.
    pub families: Vec<BgpFamilyStatus>,
}

/// What fastpath wants (`plan`) beside what BIRD says (`reading`).
pub fn status(plan: &Plan, reading: &Reading) -> BgpStatus {
    let mut mismatches = Vec::new();
    let mut families = Vec::new();
    for f in &plan.families {
        let t = &f.target;
        let v = match &reading.view {
            Ok(view) => view.family(t),
            Err(_) => FamilyView::default(),
        };
        let wanted_routes = if plan.forwarding { f.routes } else { 0 };
        let p = &t.protocol;
        // Route by route where BIRD was asked: the VIPs fastpath wants
        // that its static protocol does not hold, and those it holds that
        // fastpath does not want.
        let held = reading.view.as_ref().ok().and_then(|view| view.held.get(p));
        let (missing, unwanted): (Vec<String>, Vec<String>) = match held {
            Some(h) if wanted_routes > 0 => (
                f.prefixes.difference(h).cloned().collect(),
                h.difference(&f.prefixes).cloned().collect(),
            ),
            _ => (Vec::new(), Vec::new()),
        };
        // Each established session of the family exports every wanted
        // route (its export filter takes the static protocol's routes).
        let exported_short =
            wanted_routes > 0 && v.sessions > 0 && v.exported < v.sessions * wanted_routes;
        let announced = v.announced() && missing.is_empty() && !exported_short;
        let state = v.state.clone().unwrap_or_else(|| "missing".into());
        let why = if wanted_routes > 0 && !announced {
            Some(match &v.state {
                None if reading.view.is_err() => "BIRD did not answer".to_string(),
                None => format!("BIRD has no protocol {p}"),
                Some(s) if s != "up" => format!("{p} is {s} in BIRD"),
                Some(_) if !missing.is_empty() => format!(
                    "{p} announces {} of {wanted_routes} VIPs; missing {}",
                    wanted_routes.saturating_sub(missing.len() as u64),
                    missing.join(", ")
                ),
                Some(_) if v.routes == 0 => format!("{p} holds no routes in BIRD"),
                Some(_) if v.sessions == 0 => {
                    format!("no established BGP session carries {}", t.family)
                }
                Some(_) if v.exported == 0 => {
                    "the established BGP sessions export none of them".to_string()
                }
                Some(_) => format!(
                    "the {} established BGP sessions export {} {} routes, fewer than the {wanted_routes} each should",
                    v.sessions, v.exported, t.family
                ),
            })
        } else if wanted_routes == 0 && announced {
            Some(format!(
                "{p} still announces {} routes though fastpath withdrew them",
                v.routes
            ))
        } else if !unwanted.is_empty() {
            Some(format!(
                "{p} also announces {}, which fastpath does not (does BIRD include {}?)",
                unwanted.join(", "),
                t.routes_file.display()
            ))
        } else if wanted_routes > 0 && held.is_none() && v.routes != wanted_routes {
            Some(format!(
                "BIRD holds {} routes in {p}, fastpath wrote {wanted_routes} (does it include {}?)",
                v.routes,
                t.routes_file.display()
            ))
        } else {
            None
        };
        if let Some(w) = why {
            mismatches.push(format!(
                "{}: {} wanted, {w}",
                t.family,
                if wanted_routes > 0 {
                    "announcement"
                } else {
                    "withdrawal"
                }
            ));
        }
        families.push(BgpFamilyStatus {
            family: t.family,
            protocol: t.protocol.clone(),
            routes_file: t.routes_file.display().to_string(),
            wanted_routes,
            state,
            routes: v.routes,
            sessions: v.sessions,
            exported: v.exported,
            announced,
            missing,
            unwanted,
        });
    }
    let error = match (&plan.error, &reading.view) {
        (_, Err(e)) => Some(e.to_string()),
        (e, Ok(_)) => e.as_ref().map(ToString::to_string),
    };
    BgpStatus {
        wanted: plan.wanted(),
        announced: families.iter().any(|f| f.announced),
        mismatch: (!mismatches.is_empty()).then(|| mismatches.join("; ")),
        repairs: plan.repairs,
        read_ms_ago: reading.started.elapsed().as_millis() as u64,
        generation: plan.generation,
        error,
        families,
    }
}

impl BgpStatus {
    /// The `BGP:` line of `fastpath lb status`.
    pub fn to_text(&self) -> String {
        let families: Vec<String> = self
            .families
            .iter()
            .map(|f| {
                format!(
                    "{} {} {} ({} of {} routes, exported {} on {} sessions)",
                    f.family,
                    f.protocol,
                    f.state,
                    f.routes,
                    f.wanted_routes,
                    f.exported,
                    f.sessions
                )
            })
            .collect();
        let mut out = format!(
            "BGP: VIPs {} (fastpath {} them), as BIRD said when read {:.1} s ago: {}; {} repairs\n",
            if self.announced {
                "announced"
            } else {
                "not announced"
            },
            if self.wanted {
                "announces"
            } else {
                "withdraws"
            },
            self.read_ms_ago as f64 / 1000.0,
            families.join(", "),
            self.repairs
        );
        if let Some(m) = &self.mismatch {
            let _ = writeln!(out, "BGP MISMATCH: {m}");
        }
        if let Some(e) = &self.error {
            let _ = writeln!(out, "BGP error: {e}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn routes_per_family_deduplicated() {
        let cfg = Config::parse(
            r#"
[encap]
source = "10.0.0.1"
source6 = "fd00::1"
[[pools]]
name = "p"
backends = [{ address = "10.1.0.1" }]
[[vips]]
name = "a"
address = "192.0.2.80"
port = 80
protocol = "tcp"
pool = "p"
[[vips]]
name = "b"
address = "192.0.2.80"
port = 443
protocol = "tcp"
pool = "p"
[[vips]]
name = "c"
address = "2001:db8::80"
protocol = "udp"
pool = "p"
"#,
            "t",
        )
        .unwrap();
        let v4 = routes(&cfg, false, &|_| true);
        assert_eq!(v4.matches("route").count(), 1);
        assert!(v4.contains("route 192.0.2.80/32 blackhole;"));
        assert!(routes(&cfg, true, &|_| true).contains("route 2001:db8::80/128 blackhole;"));
        // A VIP with no healthy backend is not announced; an address stays
        // announced while any VIP on it serves.
        assert!(!routes(&cfg, true, &|i| i != 2).contains("2001:db8::80"));
        assert!(routes(&cfg, false, &|i| i == 1).contains("192.0.2.80"));
        assert!(!routes(&cfg, false, &|i| i == 2).contains("192.0.2.80"));
    }

    /// What [`decide`] does, case by case: BIRD's protocols as `show
    /// protocols all` lists them (name, state, routes held), what the
    /// announcer remembers, and the actions it is to take.
    #[test]
    fn decisions_follow_what_bird_shows() {
        let v4 = Target {
            family: Family::Ipv4,
            protocol: "v4".into(),
            routes_file: PathBuf::from("/run/v4.conf"),
        };
        let v6 = Target {
            family: Family::Ipv6,
            protocol: "v6".into(),
            routes_file: PathBuf::from("/run/v6.conf"),
        };
        let wanted = [
            Wanted {
                target: v4.clone(),
                text: "route 192.0.2.80/32 blackhole;\n".into(),
                routes: 1,
            },
            Wanted {
                target: v6.clone(),
                text: "route 2001:db8::80/128 blackhole;\n".into(),
                routes: 1,
            },
        ];
        // BIRD's answer with each protocol in a state, holding routes.
        let show = |protocols: &[(&str, &str, &str, u64)]| {
            let mut out = String::from("BIRD 2.0.12 ready.\n");
            for (name, channel, state, routes) in protocols {
                let up = if *state == "up" { "UP" } else { "DOWN" };
                let _ = writeln!(
                    out,
                    "{name} Static master {state} 00:00:00.000\n  Channel {channel}\n    \
                     State: {up}\n    Routes: {routes} imported, 0 exported, {routes} preferred"
                );
            }
            crate::bird::parse_protocols(&out)
        };
        let remembering = |enabled: &[&str], configure_owed: bool| Memory {
            configure_owed,
            stale_configured: BTreeMap::new(),
            enabled: enabled.iter().map(|p| p.to_string()).collect(),
        };
        let keep = |p: &str| Action::Keep { protocol: p.into() };
        let enable = |t: &Target, repair| Action::Enable {
            target: t.clone(),
            state: "down".into(),
            repair,
        };
        let disable = |t: &Target, why| Action::Disable {
            target: t.clone(),
            why,
        };
        let both_down = show(&[("v4", "ipv4", "down", 0), ("v6", "ipv6", "down", 0)]);
        let both_up = show(&[("v4", "ipv4", "up", 1), ("v6", "ipv6", "up", 1)]);
        let cases: Vec<(&str, bool, BirdView, Memory, Vec<Action>)> = vec![
            (
                "nothing announced yet: both enabled",
                true,
                both_down.clone(),
                Memory::default(),
                vec![enable(&v4, false), enable(&v6, false)],
            ),
            (
                "all announced: nothing to do but remember",
                true,
                both_up.clone(),
                remembering(&["v4", "v6"], false),
                vec![keep("v4"), keep("v6")],
            ),
            (
                "partly announced: the missing family enabled",
                true,
                show(&[("v4", "ipv4", "up", 1), ("v6", "ipv6", "down", 0)]),
                remembering(&["v4"], false),
                vec![keep("v4"), enable(&v6, false)],
            ),
            (
                "BIRD restarted: what fastpath had on is down, a repair",
                true,
                both_down.clone(),
                remembering(&["v4", "v6"], false),
                vec![enable(&v4, true), enable(&v6, true)],
            ),
            (
                "the datapath stalled: what was announced is withdrawn",
                false,
                both_up.clone(),
                remembering(&["v4", "v6"], false),
                vec![
                    disable(&v4, Withdrawal::Stalled),
                    disable(&v6, Withdrawal::Stalled),
                ],
            ),
            (
                "not forwarding, BIRD has a protocol up unasked: a repair",
                false,
                show(&[("v4", "ipv4", "up", 1), ("v6", "ipv6", "down", 0)]),
                Memory::default(),
                vec![disable(&v4, Withdrawal::Unasked)],
            ),
            (
                "not forwarding, protocols down: nothing to do",
                false,
                both_down.clone(),
                Memory::default(),
                vec![],
            ),
            (
                "protocols on their way up or down are left to BIRD",
                true,
                show(&[("v4", "ipv4", "start", 0), ("v6", "ipv6", "stop", 0)]),
                remembering(&["v4"], false),
                vec![],
            ),
            (
                "a protocol BIRD does not have is missing",
                true,
                show(&[("v4", "ipv4", "up", 1)]),
                remembering(&["v4"], false),
                vec![keep("v4"), Action::Missing { target: v6.clone() }],
            ),
            (
                "BIRD down entirely: every protocol missing",
                true,
                BirdView::default(),
                Memory::default(),
                vec![
                    Action::Missing { target: v4.clone() },
                    Action::Missing { target: v6.clone() },
                ],
            ),
            (
                "a routes file written since BIRD read it: configure first",
                true,
                both_down.clone(),
                remembering(&[], true),
                vec![Action::Configure, enable(&v4, false), enable(&v6, false)],
            ),
            (
                "BIRD holds other routes than the file: stale, configure",
                true,
                show(&[("v4", "ipv4", "up", 3), ("v6", "ipv6", "up", 1)]),
                remembering(&["v4", "v6"], false),
                vec![
                    Action::Stale {
                        family: Family::Ipv4,
                        text: wanted[0].text.clone(),
                    },
                    Action::Configure,
                    keep("v4"),
                    keep("v6"),
                ],
            ),
            (
                "stale again for the same text: no second configure",
                true,
                show(&[("v4", "ipv4", "up", 3), ("v6", "ipv6", "up", 1)]),
                Memory {
                    stale_configured: [(Family::Ipv4, wanted[0].text.clone())].into(),
                    ..remembering(&["v4", "v6"], false)
                },
                vec![keep("v4"), keep("v6")],
            ),
        ];
        for (case, forwarding, view, memory, expected) in cases {
            assert_eq!(
                decide(forwarding, &wanted, &view, &memory),
                expected,
                "{case}"
            );
        }
    }

    /// A stand-in for BIRD that behaves as BIRD 2 does where it matters
    /// here (nest/proto.c, `protos_commit` and `proto_reconfigure`): each
    /// static protocol is configured as dist/bird/fastpath.conf ships it,
    /// `disabled;` then the routes file included (whose `disabled` line,
    /// if any, is the last word); a configuration read (`configure`)
    /// restarts a protocol that is down, or whose configured state differs
    /// from its run-time one (`birdc enable`/`disable`), into its
    /// configured state, and reconfigures any other route by route without
    /// taking it down; an established session exports what the static
    /// protocols hold.
    struct FakeBird {
        /// Protocol name -> (family, routes file, enabled, routes held).
        protocols: RefCell<BTreeMap<String, (Family, PathBuf, bool, u64)>>,
        /// Whether it answers at all.
        running: RefCell<bool>,
        /// Per routes file, the prefixes read from it at the last
        /// configuration read.
        held: RefCell<BTreeMap<PathBuf, Vec<String>>>,
        /// Per protocol, the times a configuration read took it down
        /// while it was up (its routes withdrawn, if only for a moment).
        taken_down: RefCell<BTreeMap<String, u32>>,
        /// Every command it was given.
        log: RefCell<Vec<String>>,
        /// Per `disable`, the protocol and the state its routes file
        /// stated at that moment.
        disabled_with: RefCell<Vec<(String, Option<bool>)>>,
    }

    impl FakeBird {
        fn new(protocols: &[(&str, Family, &Path)]) -> FakeBird {
            let b = FakeBird {
                protocols: RefCell::new(
                    protocols
                        .iter()
                        .map(|(n, f, p)| (n.to_string(), (*f, p.to_path_buf(), false, 0)))
                        .collect(),
                ),
                running: RefCell::new(true),
                held: RefCell::new(BTreeMap::new()),
                taken_down: RefCell::new(BTreeMap::new()),
                log: RefCell::new(Vec::new()),
                disabled_with: RefCell::new(Vec::new()),
            };
            b.start();
            b
        }

        /// Each protocol's routes file's text as its configuration
        /// includes it (none: the pattern matched nothing).
        fn included(file: &Path) -> Option<String> {
            std::fs::read_to_string(file).ok()
        }

        /// A BIRD starting: every protocol in its configured state.
        fn start(&self) {
            for (_, (_, file, enabled, routes)) in self.protocols.borrow_mut().iter_mut() {
                let text = Self::included(file);
                *enabled = text.as_deref().and_then(stated).unwrap_or(false);
                let text = text.unwrap_or_default();
                *routes = route_count(&text);
                self.held
                    .borrow_mut()
                    .insert(file.clone(), route_prefixes(&text).into_iter().collect());
            }
        }

        /// `birdc configure`.
        fn read_configuration(&self) {
            for (name, (_, file, enabled, routes)) in self.protocols.borrow_mut().iter_mut() {
                let text = Self::included(file);
                // The shipped `disabled;`, unless the file says otherwise.
                let configured = text.as_deref().and_then(stated).unwrap_or(false);
                if *enabled && !configured {
                    *self
                        .taken_down
                        .borrow_mut()
                        .entry(name.clone())
                        .or_default() += 1;
                }
                *enabled = configured;
                let text = text.unwrap_or_default();
                *routes = route_count(&text);
                self.held
                    .borrow_mut()
                    .insert(file.clone(), route_prefixes(&text).into_iter().collect());
            }
        }

        fn taken_down(&self, name: &str) -> u32 {
            self.taken_down.borrow().get(name).copied().unwrap_or(0)
        }

        fn enabled(&self, name: &str) -> bool {
            self.protocols.borrow()[name].2
        }
    }

    impl Bird for FakeBird {
        fn run(&self, args: &[&str]) -> Result<String, BirdError> {
            self.log.borrow_mut().push(args.join(" "));
            if !*self.running.borrow() {
                return Err(BirdError::Refused {
                    command: args.join(" "),
                    output: "Unable to connect to server control socket".into(),
                });
            }
            match args {
                ["configure"] => {
                    self.read_configuration();
                    Ok("Reconfiguration in progress\n".into())
                }
                ["enable" | "disable", name] => {
                    let mut p = self.protocols.borrow_mut();
                    let Some(x) = p.get_mut(*name) else {
                        return Err(BirdError::Refused {
                            command: args.join(" "),
                            output: "syntax error".into(),
                        });
                    };
                    x.2 = args[0] == "enable";
                    if args[0] == "disable" {
                        let file = Self::included(&x.1);
                        self.disabled_with
                            .borrow_mut()
                            .push((name.to_string(), file.as_deref().and_then(stated)));
                    }
                    Ok(format!("{name}: {}d\n", args[0]))
                }
                ["show", "route", "protocol", name] => {
                    // As BIRD 2.0.12 prints it: a table heading, a line
                    // per route; nothing for a protocol that is down.
                    let p = self.protocols.borrow();
                    let Some((family, file, enabled, _)) = p.get(*name) else {
                        return Err(BirdError::Refused {
                            command: args.join(" "),
                            output: "syntax error, unexpected CF_SYM_UNDEFINED".into(),
                        });
                    };
                    let mut out = String::from("BIRD 2.0.12 ready.\n");
                    if *enabled {
                        let _ = writeln!(
                            out,
                            "Table master{}:",
                            if *family == Family::Ipv4 { 4 } else { 6 }
                        );
                        for r in self.held.borrow().get(file).into_iter().flatten() {
                            let _ =
                                writeln!(out, "{r:<20} blackhole [{name} 00:00:00.000] * (200)");
                        }
                    }
                    Ok(out)
                }
                ["show", "protocols", "all"] => {
                    let mut out =
                        String::from("BIRD 2.0.12 ready.\nName Proto Table State Since Info\n");
                    let mut exported: BTreeMap<Family, u64> = BTreeMap::new();
                    for (name, (family, _, enabled, routes)) in self.protocols.borrow().iter() {
                        let (state, up) = if *enabled {
                            ("up", "UP")
                        } else {
                            ("down", "DOWN")
                        };
                        let _ = writeln!(out, "{name} Static master {state} 00:00:00.000\n  Channel {family}\n    State: {up}");
                        if *enabled {
                            let _ = writeln!(
                                out,
                                "    Routes: {routes} imported, 0 exported, {routes} preferred"
                            );
                            *exported.entry(*family).or_default() += routes;
                        }
                    }
                    let _ = writeln!(out, "uplink BGP --- up 00:00:00.000 Established");
                    for f in [Family::Ipv4, Family::Ipv6] {
                        let n = exported.get(&f).copied().unwrap_or(0);
                        let _ = writeln!(out, "  Channel {f}\n    State: UP\n    Routes: 0 imported, {n} exported, 0 preferred");
                    }
                    Ok(out)
                }
                _ => Err(BirdError::Refused {
                    command: args.join(" "),
                    output: "unexpected".into(),
                }),
            }
        }
    }

    const DUAL: &str = r#"
[encap]
source = "10.0.0.1"
source6 = "fd00::1"
[bgp]
vips_file = "VIPS"
[[pools]]
name = "p"
backends = [{ address = "10.1.0.1" }]
[[vips]]
name = "a"
address = "192.0.2.80"
port = 80
protocol = "tcp"
pool = "p"
[[vips]]
name = "c"
address = "2001:db8::80"
port = 80
protocol = "tcp"
pool = "p"
"#;

    fn dual(dir: &Path) -> Config {
        let text = DUAL.replace("VIPS", &dir.join("vips.conf").display().to_string());
        Config::parse(&text, "t").unwrap()
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fastpath-bgp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// An operator's `birdc configure` resets nothing: the routes files
    /// say the protocols are on, so BIRD keeps them up and fastpath has
    /// nothing to do. Protocols disabled behind fastpath's back: the
    /// status says so at once (not "announced"), names the mismatch, and
    /// the next step enables them again without a configure of its own.
    /// Both families are announced, each from its own file.
    #[test]
    fn a_reconfigured_bird_is_seen_and_put_back() {
        let d = scratch("reconf");
        let cfg = dual(&d);
        let b = cfg.bgp.clone().unwrap();
        let bird = FakeBird::new(&[
            ("fastpath_vips", Family::Ipv4, &d.join("vips.conf")),
            ("fastpath_vips6", Family::Ipv6, &d.join("vips6.conf")),
        ]);
        let mut ann = Announcer::default();
        let (plan, reading) = ann.step(&bird, &b, &cfg, true, &|_| true);
        assert!(std::fs::read_to_string(d.join("vips.conf"))
            .unwrap()
            .contains("route 192.0.2.80/32 blackhole;"));
        assert!(std::fs::read_to_string(d.join("vips6.conf"))
            .unwrap()
            .contains("route 2001:db8::80/128 blackhole;"));
        assert!(bird.enabled("fastpath_vips") && bird.enabled("fastpath_vips6"));
        let s = status(&plan, &reading);
        assert!(s.wanted && s.announced && s.mismatch.is_none(), "{s:?}");
        assert!(s.families.iter().all(|f| f.announced && f.routes == 1));
        assert!(plan.announced);

        // An operator runs `birdc configure`: nothing changes.
        bird.run(&["configure"]).unwrap();
        assert_eq!(bird.taken_down("fastpath_vips"), 0);
        assert_eq!(bird.taken_down("fastpath_vips6"), 0);
        let now = status(&plan, &Reading::take(&bird));
        assert!(now.announced && now.mismatch.is_none(), "{now:?}");
        bird.log.borrow_mut().clear();
        ann.step(&bird, &b, &cfg, true, &|_| true);
        assert!(
            !bird
                .log
                .borrow()
                .iter()
                .any(|c| c == "configure" || c.starts_with("enable")),
            "{:?}",
            bird.log.borrow()
        );

        // Someone disables them by hand.
        bird.run(&["disable", "fastpath_vips"]).unwrap();
        bird.run(&["disable", "fastpath_vips6"]).unwrap();
        let now = status(&plan, &Reading::take(&bird));
        assert!(now.wanted && !now.announced, "{now:?}");
        let m = now.mismatch.unwrap();
        assert!(
            m.contains("fastpath_vips is down") && m.contains("ipv6"),
            "{m}"
        );

        // The next poll puts it back, without configuring BIRD again.
        bird.log.borrow_mut().clear();
        let (plan, reading) = ann.step(&bird, &b, &cfg, true, &|_| true);
        assert!(bird.enabled("fastpath_vips") && bird.enabled("fastpath_vips6"));
        assert!(
            !bird.log.borrow().iter().any(|c| c == "configure"),
            "{:?}",
            bird.log.borrow()
        );
        let s = status(&plan, &reading);
        assert!(s.announced && s.mismatch.is_none(), "{s:?}");
        assert_eq!(s.repairs, 2);

        // A steady state costs a question a poll and one per family's
        // routes, and changes nothing.
        bird.log.borrow_mut().clear();
        ann.step(&bird, &b, &cfg, true, &|_| true);
        assert_eq!(
            *bird.log.borrow(),
            [
                "show protocols all",
                "show route protocol fastpath_vips",
                "show route protocol fastpath_vips6"
            ]
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// "Announced" is compared route by route: a BIRD that holds as many
    /// routes as fastpath wants, but another VIP's, is not announcing
    /// what fastpath wants; the status names the VIP missing, and the
    /// next step has BIRD read the file again.
    #[test]
    fn the_same_number_of_other_routes_is_not_announced() {
        let d = scratch("byroute");
        let cfg = dual(&d);
        let b = cfg.bgp.clone().unwrap();
        let bird = FakeBird::new(&[
            ("fastpath_vips", Family::Ipv4, &d.join("vips.conf")),
            ("fastpath_vips6", Family::Ipv6, &d.join("vips6.conf")),
        ]);
        let mut ann = Announcer::default();
        let (plan, _) = ann.step(&bird, &b, &cfg, true, &|_| true);
        // BIRD read another version of the IPv4 file (one route, not
        // ours) and has both protocols up; the file is ours again.
        let file = d.join("vips.conf");
        let ours = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, ours.replace("192.0.2.80/32", "198.18.0.9/32")).unwrap();
        bird.read_configuration();
        std::fs::write(&file, &ours).unwrap();
        bird.run(&["enable", "fastpath_vips"]).unwrap();
        bird.run(&["enable", "fastpath_vips6"]).unwrap();
        let wanted: Vec<Wanted> = plan
            .families
            .iter()
            .map(|f| Wanted {
                target: f.target.clone(),
                text: std::fs::read_to_string(&f.target.routes_file).unwrap(),
                routes: f.routes,
            })
            .collect();
        let s = status(&plan, &Reading::take_with_routes(&bird, &wanted));
        let v4 = &s.families[0];
        assert!(!v4.announced, "{v4:?}");
        assert_eq!(v4.missing, ["192.0.2.80/32"]);
        assert_eq!(v4.unwanted, ["198.18.0.9/32"]);
        let m = s.mismatch.unwrap();
        assert!(
            m.contains("fastpath_vips announces 0 of 1 VIPs; missing 192.0.2.80/32"),
            "{m}"
        );
        assert!(s.families[1].announced, "{:?}", s.families);
        // The next step sees it and has BIRD read the file.
        bird.log.borrow_mut().clear();
        let (plan, reading) = ann.step(&bird, &b, &cfg, true, &|_| true);
        assert!(bird.log.borrow().iter().any(|c| c == "configure"));
        let s = status(&plan, &reading);
        assert!(s.announced && s.mismatch.is_none(), "{s:?}");
        assert!(s.families.iter().all(|f| f.missing.is_empty()));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A restarted BIRD on a machine whose /run was emptied: the routes
    /// files are written again, read, and the protocols enabled; while
    /// BIRD is away the status says it did not answer.
    #[test]
    fn a_restarted_bird_gets_its_files_and_its_protocols_back() {
        let d = scratch("restart");
        let cfg = dual(&d);
        let b = cfg.bgp.clone().unwrap();
        let bird = FakeBird::new(&[
            ("fastpath_vips", Family::Ipv4, &d.join("vips.conf")),
            ("fastpath_vips6", Family::Ipv6, &d.join("vips6.conf")),
        ]);
        let mut ann = Announcer::default();
        ann.step(&bird, &b, &cfg, true, &|_| true);
        *bird.running.borrow_mut() = false;
        std::fs::remove_file(d.join("vips.conf")).unwrap();
        let (plan, reading) = ann.step(&bird, &b, &cfg, true, &|_| true);
        let s = status(&plan, &reading);
        assert!(!s.announced && s.error.is_some(), "{s:?}");
        assert!(s.mismatch.unwrap().contains("BIRD did not answer"));
        // BIRD starts again: its configuration read, protocols disabled.
        *bird.running.borrow_mut() = true;
        bird.read_configuration();
        let (plan, reading) = ann.step(&bird, &b, &cfg, true, &|_| true);
        let s = status(&plan, &reading);
        assert!(s.announced && s.mismatch.is_none(), "{s:?}");
        assert!(std::fs::read_to_string(d.join("vips.conf"))
            .unwrap()
            .contains("192.0.2.80/32"));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A BIRD without the IPv6 protocol: IPv4 is announced all the same,
    /// and the IPv6 VIPs' non-announcement is an error and a mismatch,
    /// never silent. A configuration without IPv6 VIPs never touches the
    /// IPv6 protocol.
    #[test]
    fn ipv6_vips_without_birds_ipv6_protocol_are_reported() {
        let d = scratch("no6");
        let cfg = dual(&d);
        let b = cfg.bgp.clone().unwrap();
        let bird = FakeBird::new(&[("fastpath_vips", Family::Ipv4, &d.join("vips.conf"))]);
        let mut ann = Announcer::default();
        let (plan, reading) = ann.step(&bird, &b, &cfg, true, &|_| true);
        let s = status(&plan, &reading);
        assert!(s.announced, "{s:?}");
        assert!(s
            .error
            .as_deref()
            .unwrap()
            .contains("no protocol fastpath_vips6"));
        assert!(s.mismatch.as_deref().unwrap().contains("ipv6"), "{s:?}");

        let v4_only = Config::parse(
            &DUAL
                .replace("VIPS", &d.join("vips.conf").display().to_string())
                .replace("address = \"2001:db8::80\"", "address = \"192.0.2.81\""),
            "t",
        )
        .unwrap();
        let mut ann = Announcer::default();
        bird.log.borrow_mut().clear();
        let (plan, reading) = ann.step(
            &bird,
            v4_only.bgp.as_ref().unwrap(),
            &v4_only,
            true,
            &|_| true,
        );
        assert!(!bird
            .log
            .borrow()
            .iter()
            .any(|c| c.contains("fastpath_vips6")));
        let s = status(&plan, &reading);
        assert!(s.error.is_none() && s.mismatch.is_none(), "{s:?}");
        assert_eq!(s.families.len(), 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A stalled datapath withdraws; a BIRD that has the protocol up
    /// while fastpath withdraws is disabled again.
    #[test]
    fn withdrawal_is_kept_too() {
        let d = scratch("withdraw");
        let cfg = dual(&d);
        let b = cfg.bgp.clone().unwrap();
        let bird = FakeBird::new(&[
            ("fastpath_vips", Family::Ipv4, &d.join("vips.conf")),
            ("fastpath_vips6", Family::Ipv6, &d.join("vips6.conf")),
        ]);
        let mut ann = Announcer::default();
        ann.step(&bird, &b, &cfg, true, &|_| true);
        let (plan, reading) = ann.step(&bird, &b, &cfg, false, &|_| true);
        assert!(!bird.enabled("fastpath_vips"));
        let s = status(&plan, &reading);
        assert!(!s.wanted && !s.announced && s.mismatch.is_none(), "{s:?}");
        bird.run(&["enable", "fastpath_vips"]).unwrap();
        let s = status(&plan, &Reading::take(&bird));
        assert!(s.mismatch.unwrap().contains("withdrawal wanted"));
        ann.step(&bird, &b, &cfg, false, &|_| true);
        assert!(!bird.enabled("fastpath_vips"));
        ann.withdraw(&bird);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The routes file's text: the header, the protocol's state, the
    /// routes; a state line is replaced, never doubled, and a change of
    /// state alone is told from a change of routes.
    #[test]
    fn routes_files_state_the_protocols_wanted_state() {
        let header = lb::config::VIPS_FILE_HEADER;
        let routes = format!("{header}route 192.0.2.80/32 blackhole;\n");
        let on = with_state(&routes, true);
        assert_eq!(
            on,
            format!("{header}disabled no;\nroute 192.0.2.80/32 blackhole;\n")
        );
        let off = with_state(&on, false);
        assert_eq!(
            off,
            format!("{header}disabled yes;\nroute 192.0.2.80/32 blackhole;\n")
        );
        assert_eq!(with_state(&off, false), off);
        // No routes: the state all the same (an empty static protocol).
        assert_eq!(with_state(header, true), format!("{header}disabled no;\n"));
        assert_eq!(with_state("", false), "disabled yes;\n");
        assert_eq!(route_prefixes(&on), route_prefixes(&routes));
        assert_eq!(route_count(&off), 1);
        // What a file states; BIRD's words for it.
        assert_eq!(stated(&on), Some(true));
        assert_eq!(stated(&off), Some(false));
        assert_eq!(stated(&routes), None);
        assert_eq!(stated("disabled;\n"), Some(false));
        assert_eq!(stated("disabled yes;\ndisabled no;\n"), Some(true));
        assert_eq!(stated("disabledx no;\n"), None);
        // A state change alone owes no configure; a route change, or a
        // file not there before, does.
        assert!(only_state_differs(Some(&on), &off));
        assert!(only_state_differs(Some(&routes), &off));
        assert!(!only_state_differs(None, &off));
        assert!(!only_state_differs(
            Some(&on),
            &with_state(&format!("{header}route 192.0.2.81/32 blackhole;\n"), true)
        ));

        // A withdrawal marks the file, its routes kept; a missing file
        // stays missing (BIRD keeps the shipped `disabled;`).
        let d = scratch("mark");
        let file = d.join("vips.conf");
        std::fs::write(&file, &on).unwrap();
        mark_withdrawn(&file).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), off);
        mark_withdrawn(&file).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), off);
        let missing = d.join("none.conf");
        mark_withdrawn(&missing).unwrap();
        assert!(!missing.exists());
        let e = mark_withdrawn(&d).unwrap_err();
        assert!(e.to_string().contains(&d.display().to_string()), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A change to one family's VIPs (the IPv6 VIP moved, an IPv4 VIP
    /// added, then removed) is read by BIRD route by route: no protocol is
    /// taken down, whichever family changed.
    #[test]
    fn a_vip_set_change_takes_no_protocol_down() {
        let d = scratch("vipset");
        let cfg = dual(&d);
        let b = cfg.bgp.clone().unwrap();
        let bird = FakeBird::new(&[
            ("fastpath_vips", Family::Ipv4, &d.join("vips.conf")),
            ("fastpath_vips6", Family::Ipv6, &d.join("vips6.conf")),
        ]);
        let mut ann = Announcer::default();
        ann.step(&bird, &b, &cfg, true, &|_| true);
        let (plan, reading) = ann.step(&bird, &b, &cfg, true, &|_| true);
        assert!(status(&plan, &reading).announced);
        let text = DUAL.replace("VIPS", &d.join("vips.conf").display().to_string());
        let extra = "[[vips]]\nname = \"e\"\naddress = \"192.0.2.81\"\nport = 80\nprotocol = \"tcp\"\npool = \"p\"\n";
        let moved = text.replace("2001:db8::80", "2001:db8::81");
        for (what, text) in [
            ("IPv6 VIP moved", moved.clone()),
            ("IPv4 VIP added", format!("{moved}{extra}")),
            ("IPv4 VIP removed", moved.clone()),
        ] {
            let cfg = Config::parse(&text, "t").unwrap();
            bird.log.borrow_mut().clear();
            let (plan, reading) = ann.step(&bird, &b, &cfg, true, &|_| true);
            let log = bird.log.borrow().clone();
            assert_eq!(
                log.iter().filter(|c| *c == "configure").count(),
                1,
                "{what}: {log:?}"
            );
            assert!(
                !log.iter().any(|c| c.starts_with("enable")),
                "{what}: {log:?}"
            );
            assert_eq!(bird.taken_down("fastpath_vips"), 0, "{what}");
            assert_eq!(bird.taken_down("fastpath_vips6"), 0, "{what}");
            let s = status(&plan, &reading);
            assert!(s.announced && s.mismatch.is_none(), "{what}: {s:?}");
            assert_eq!(s.repairs, 0, "{what}");
        }
        assert!(bird.held.borrow()[&d.join("vips6.conf")] == ["2001:db8::81/128"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Announcing and withdrawing change the file's state line and the
    /// protocol, never with a configure; every disable finds the file
    /// already saying `disabled yes;`, so a BIRD that reads it again (a
    /// configure, a restart) keeps the VIPs withdrawn, also after a stop.
    #[test]
    fn a_withdrawal_is_written_before_it_is_made() {
        let d = scratch("written");
        let cfg = dual(&d);
        let b = cfg.bgp.clone().unwrap();
        let bird = FakeBird::new(&[
            ("fastpath_vips", Family::Ipv4, &d.join("vips.conf")),
            ("fastpath_vips6", Family::Ipv6, &d.join("vips6.conf")),
        ]);
        let mut ann = Announcer::default();
        ann.step(&bird, &b, &cfg, true, &|_| true);
        let file_says = |f: &str| stated(&std::fs::read_to_string(d.join(f)).unwrap_or_default());
        assert_eq!(file_says("vips.conf"), Some(true));
        // The datapath stalls.
        bird.log.borrow_mut().clear();
        ann.step(&bird, &b, &cfg, false, &|_| true);
        let log = bird.log.borrow().clone();
        assert!(
            log.contains(&"disable fastpath_vips".to_string()),
            "{log:?}"
        );
        assert!(!log.iter().any(|c| c == "configure"), "{log:?}");
        assert_eq!(
            *bird.disabled_with.borrow(),
            [
                ("fastpath_vips".to_string(), Some(false)),
                ("fastpath_vips6".to_string(), Some(false))
            ]
        );
        bird.run(&["configure"]).unwrap();
        bird.start();
        assert!(!bird.enabled("fastpath_vips") && !bird.enabled("fastpath_vips6"));
        // It beats again: enabled, the file saying so, no configure.
        bird.log.borrow_mut().clear();
        ann.step(&bird, &b, &cfg, true, &|_| true);
        let log = bird.log.borrow().clone();
        assert!(!log.iter().any(|c| c == "configure"), "{log:?}");
        assert!(bird.enabled("fastpath_vips") && bird.enabled("fastpath_vips6"));
        assert_eq!(file_says("vips6.conf"), Some(true));
        // A stop.
        bird.disabled_with.borrow_mut().clear();
        assert!(ann.withdraw(&bird).is_empty());
        assert!(bird
            .disabled_with
            .borrow()
            .iter()
            .all(|(_, s)| *s == Some(false)));
        assert_eq!(bird.disabled_with.borrow().len(), 2);
        bird.start();
        assert!(!bird.enabled("fastpath_vips") && !bird.enabled("fastpath_vips6"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn what_is_not_announced_is_said() {
        let d = scratch("said");
        let cfg = dual(&d);
        assert!(unannounced(&cfg).is_empty());
        let text = DUAL.replace("VIPS", "/run/v.conf").replace(
            "vips_file = \"/run/v.conf\"",
            "vips_file = \"/run/v.conf\"\nprotocol6 = \"\"",
        );
        let w = unannounced(&Config::parse(&text, "t").unwrap());
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("IPv6 VIPs c are not announced"), "{w:?}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
