//! The withdrawal that works when the daemon cannot: `fastpath lb
//! withdraw --config FILE`, which the shipped service unit runs as
//! `ExecStopPost=` after the load balancer has stopped however it stopped
//! (killed, frozen and killed by the watchdog, crashed, or stopped
//! gracefully, when it is already done and this changes nothing). It
//! disables BIRD's static protocol(s) that hold the VIP routes, so the
//! router stops sending this machine traffic it can no longer forward,
//! and first has each routes file (`vips_file`, the IPv6 one) say
//! `disabled yes;` ([`crate::announce::mark_withdrawn`]): the files state
//! the protocols' wanted state, and a BIRD that reads them again (a
//! `birdc configure`, a restart) must not announce a load balancer that
//! is not running.
//!
//! It reads only `[bgp]` of the configuration, and leniently: the file may
//! have been edited into something the daemon would refuse since it
//! started, and the routes must be withdrawn all the same. Every key of
//! `[bgp]` whose name starts with `protocol` names protocols (a string or a
//! list: `protocol` for IPv4, and the IPv6 one beside it). Without such
//! keys it tries the names `dist/bird/fastpath.conf` ships
//! (`fastpath_vips`, `fastpath_vips6`), where a name BIRD does not know is
//! no error; `birdc` defaults as the daemon's.

use std::path::{Path, PathBuf};

use serde::Deserialize as _;

use crate::bird::{BirdError, Birdc};

/// What to withdraw, as the configuration's `[bgp]` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The command that talks to BIRD (`[bgp] birdc`).
    pub birdc: Vec<String>,
    /// BIRD's static protocols that hold the VIP routes.
    pub protocols: Vec<Protocol>,
    /// The routes files that state those protocols' wanted state
    /// (`vips_file` and the IPv6 one; none when `vips_file` is absent or
    /// not a string: the daemon cannot have written any).
    pub routes_files: Vec<PathBuf>,
}

/// A protocol to disable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protocol {
    /// Its name in BIRD.
    pub name: String,
    /// Whether the configuration names it (else it is a shipped default,
    /// which this BIRD may not have).
    pub named: bool,
}

/// What happened to one protocol.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Outcome {
    /// BIRD disabled it: its routes are withdrawn.
    Disabled,
    /// It was disabled already (a graceful stop withdraws by itself).
    AlreadyDisabled,
    /// BIRD is not running (its control socket is missing or refuses):
    /// its sessions are down, so it announces nothing.
    BirdNotRunning,
    /// A shipped default name this BIRD has no protocol of.
    NotInBird,
}

/// Why the routes could not be withdrawn.
#[derive(Debug, thiserror::Error)]
pub enum WithdrawError {
    /// The configuration file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The file is not TOML, or `[bgp]` is not a table.
    #[error("{path}: {problem}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// `[bgp] birdc` is empty.
    #[error("{path}: bgp.birdc is empty: it needs a command, e.g. [\"birdc\"]")]
    NoBirdc {
        /// The file.
        path: PathBuf,
    },
    /// birdc could not be run.
    #[error(transparent)]
    Bird(#[from] BirdError),
    /// A routes file could not be made to say `disabled yes;`.
    #[error(
        "{path}: could not mark it withdrawn ({source}): a BIRD that reads it again would announce \
         its VIPs"
    )]
    RoutesFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: crate::announce::AnnounceError,
    },
    /// BIRD runs and refused to disable a protocol (or birdc failed).
    #[error("birdc disable {protocol}: {output}")]
    Refused {
        /// The protocol.
        protocol: String,
        /// What birdc printed.
        output: String,
    },
}

/// The protocols and birdc command of a configuration's text; `None`
/// without `[bgp]` (nothing is ever announced).
pub fn target(text: &str, path: &Path) -> Result<Option<Target>, WithdrawError> {
    let parse = |problem: String| WithdrawError::Parse {
        path: path.to_path_buf(),
        problem,
    };
    let doc: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| parse(e.to_string()))?;
    let Some(bgp) = doc.get("bgp") else {
        return Ok(None);
    };
    let bgp = bgp
        .as_table()
        .ok_or_else(|| parse("[bgp] is not a table".into()))?;
    let strings = |key: &str, v: &toml::Value| -> Result<Vec<String>, WithdrawError> {
        let bad = || parse(format!("bgp.{key}: expected a string or a list of strings"));
        match v {
            toml::Value::String(s) => Ok(vec![s.clone()]),
            toml::Value::Array(a) => a
                .iter()
                .map(|x| x.as_str().map(str::to_string).ok_or_else(bad))
                .collect(),
            _ => Err(bad()),
        }
    };
    let mut protocols: Vec<Protocol> = Vec::new();
    for (key, v) in bgp.iter().filter(|(k, _)| k.starts_with("protocol")) {
        for name in strings(key, v)? {
            // Empty: this BIRD has no such protocol (`protocol6 = ""`: no
            // IPv6), so there is nothing to disable.
            if name.is_empty() {
                continue;
            }
            // The daemon's own check: never `all` or another keyword.
            lb::config::bird_protocol_name(&name)
                .map_err(|why| parse(format!("bgp.{key}: {why}")))?;
            if !protocols.iter().any(|p| p.name == name) {
                protocols.push(Protocol { name, named: true });
            }
        }
    }
    // The shipped names, for what the file leaves to the defaults: the
    // IPv4 one when `protocol` is absent, the IPv6 one when no other key
    // names protocols.
    let mut defaults = Vec::new();
    if !bgp.contains_key("protocol") {
        defaults.push(DEFAULT_PROTOCOLS[0]);
    }
    if !bgp
        .keys()
        .any(|k| k.starts_with("protocol") && k != "protocol")
    {
        defaults.push(DEFAULT_PROTOCOLS[1]);
    }
    for name in defaults {
        if !protocols.iter().any(|p| p.name == name) {
            protocols.push(Protocol {
                name: name.to_string(),
                named: false,
            });
        }
    }
    let birdc = match bgp.get("birdc") {
        Some(v) => strings("birdc", v)?,
        None => vec!["birdc".to_string()],
    };
    if birdc.is_empty() {
        return Err(WithdrawError::NoBirdc {
            path: path.to_path_buf(),
        });
    }
    Ok(Some(Target {
        birdc,
        protocols,
        routes_files: routes_files(bgp),
    }))
}

/// The routes files `[bgp]` names, found as the daemon finds them
/// ([`lb::config::Bgp::routes_file6`]): `vips_file`, and `vips_file6` or
/// the name derived from `vips_file`. Lenient: the other keys are not
/// looked at.
fn routes_files(bgp: &toml::Table) -> Vec<PathBuf> {
    let mut only = toml::Table::new();
    for key in ["vips_file", "vips_file6"] {
        if let Some(v @ toml::Value::String(_)) = bgp.get(key) {
            only.insert(key.to_string(), v.clone());
        }
    }
    match lb::config::Bgp::deserialize(only) {
        Ok(b) => {
            let six = b.routes_file6();
            let mut files = vec![b.vips_file];
            if six != files[0] {
                files.push(six);
            }
            files
        }
        Err(_) => Vec::new(),
    }
}

/// The protocols `dist/bird/fastpath.conf` ships, IPv4 then IPv6 (the
/// first is the daemon's default `[bgp] protocol`).
pub const DEFAULT_PROTOCOLS: [&str; 2] = ["fastpath_vips", "fastpath_vips6"];

/// One protocol's name and what happened to it, or why it was not
/// withdrawn.
pub type Done = (String, Result<Outcome, WithdrawError>);

/// Reads `config` and disables each of its protocols, all at once; per
/// protocol what happened or why it could not be withdrawn. An empty list:
/// the configuration has no `[bgp]`.
///
/// Bounded whatever BIRD does: each `birdc disable` runs in a thread of
/// its own within [`crate::bird::DEADLINE`] and [`crate::bird::OUTPUT_LIMIT`],
/// so a BIRD that hangs, trickles or floods costs [`crate::bird::DEADLINE`]
/// in all, not once per protocol.
pub fn withdraw(config: &Path) -> Result<Vec<Done>, WithdrawError> {
    let text = std::fs::read_to_string(config).map_err(|source| WithdrawError::Read {
        path: config.to_path_buf(),
        source,
    })?;
    let Some(t) = target(&text, config)? else {
        return Ok(Vec::new());
    };
    // The files first: a BIRD that reads them after this (a configure, a
    // restart) keeps the protocols off whatever the disables below do.
    let mut done: Vec<Done> = t
        .routes_files
        .iter()
        .filter_map(|f| {
            crate::announce::mark_withdrawn(f).err().map(|source| {
                (
                    f.display().to_string(),
                    Err(WithdrawError::RoutesFile {
                        path: f.clone(),
                        source,
                    }),
                )
            })
        })
        .collect();
    let disabled: Vec<Done> = std::thread::scope(|scope| {
        let running: Vec<_> = t
            .protocols
            .iter()
            .map(|p| {
                let birdc = &t.birdc;
                (p, scope.spawn(move || disable(birdc, p)))
            })
            .collect();
        running
            .into_iter()
            .map(|(p, h)| {
                let r = h.join().unwrap_or_else(|_| {
                    Err(WithdrawError::Refused {
                        protocol: p.name.clone(),
                        output: "the thread asking BIRD panicked".into(),
                    })
                });
                (p.name.clone(), r)
            })
            .collect()
    });
    done.extend(disabled);
    Ok(done)
}

/// `birdc disable PROTOCOL`, its answer classified.
fn disable(birdc: &[String], protocol: &Protocol) -> Result<Outcome, WithdrawError> {
    let a = Birdc(birdc).answer(&["disable", &protocol.name])?;
    classify(protocol, a.success, &a.stdout, &a.stderr)
}

/// What birdc's answer to `disable` means. birdc says "NAME: disabled" or
/// "NAME: already disabled"; it exits 1 when it cannot reach BIRD's
/// control socket ("Unable to connect to server control socket (...): No
/// such file or directory" or "Connection refused": BIRD is not running),
/// and answers a name it has no protocol of with a syntax error about an
/// undefined symbol.
fn classify(
    protocol: &Protocol,
    success: bool,
    stdout: &str,
    stderr: &str,
) -> Result<Outcome, WithdrawError> {
    let all = format!("{stdout}{stderr}");
    if all.contains("Unable to connect to server control socket")
        && (all.contains("No such file or directory") || all.contains("Connection refused"))
    {
        return Ok(Outcome::BirdNotRunning);
    }
    if !protocol.named && all.contains("CF_SYM_UNDEFINED") {
        return Ok(Outcome::NotInBird);
    }
    let protocol = &protocol.name;
    if success {
        for line in stdout.lines().map(str::trim) {
            if line == format!("{protocol}: already disabled") {
                return Ok(Outcome::AlreadyDisabled);
            }
            if line == format!("{protocol}: disabled") {
                return Ok(Outcome::Disabled);
            }
        }
    }
    Err(WithdrawError::Refused {
        protocol: protocol.to_string(),
        // Cut: it is printed, and a BIRD may answer megabytes of garbage.
        output: crate::bird::excerpt(
            &all.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("BIRD ") && !l.ends_with(" ready."))
                .collect::<Vec<_>>()
                .join("; "),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(text: &str) -> Option<Target> {
        target(text, Path::new("t.toml")).unwrap()
    }

    fn names(t: &Target) -> Vec<(&str, bool)> {
        t.protocols
            .iter()
            .map(|p| (p.name.as_str(), p.named))
            .collect()
    }

    fn named(name: &str) -> Protocol {
        Protocol {
            name: name.into(),
            named: true,
        }
    }

    #[test]
    fn protocols_and_birdc_from_bgp_only() {
        assert_eq!(t("[encap]\nsource = \"10.0.0.1\"\n"), None);
        // The shipped names and birdc by default; the rest of the file is
        // not checked (it may have been broken since the daemon started).
        let d = t("[bgp]\nvips_file = \"/run/fastpath/vips.conf\"\n[[pools]]\nname = 3\n").unwrap();
        assert_eq!(d.birdc, ["birdc"]);
        assert_eq!(
            names(&d),
            [("fastpath_vips", false), ("fastpath_vips6", false)]
        );
        // Named: the IPv4 protocol, and the shipped IPv6 one tried beside it.
        let one = t("[bgp]\nprotocol = \"v4\"\n").unwrap();
        assert_eq!(names(&one), [("v4", true), ("fastpath_vips6", false)]);
        // The IPv6 protocol beside the IPv4 one, or a list.
        let two = t("[bgp]\nprotocol = \"v4\"\nprotocol6 = \"v6\"\nbirdc = [\"birdc\", \"-s\", \"/x.ctl\"]\n")
            .unwrap();
        assert_eq!(two.birdc, ["birdc", "-s", "/x.ctl"]);
        assert_eq!(names(&two), [("v4", true), ("v6", true)]);
        let list = t("[bgp]\nprotocols = [\"a\", \"b\", \"a\"]\nprotocol = \"a\"\n").unwrap();
        assert_eq!(names(&list), [("a", true), ("b", true)]);
        let e = target("[bgp]\nbirdc = []\n", Path::new("t.toml")).unwrap_err();
        assert!(e.to_string().contains("bgp.birdc"), "{e}");
        let e = target("[bgp]\nprotocol = 1\n", Path::new("t.toml")).unwrap_err();
        assert!(e.to_string().contains("bgp.protocol"), "{e}");
        let e = target("[bgp\n", Path::new("t.toml")).unwrap_err();
        assert!(e.to_string().starts_with("t.toml: "), "{e}");
    }

    #[test]
    fn routes_files_as_the_daemon_finds_them() {
        let files = |text: &str| t(text).unwrap().routes_files;
        assert_eq!(
            files("[bgp]\nvips_file = \"/run/fastpath/vips.conf\"\n"),
            [
                PathBuf::from("/run/fastpath/vips.conf"),
                PathBuf::from("/run/fastpath/vips6.conf")
            ]
        );
        assert_eq!(
            files("[bgp]\nvips_file = \"/a/v4\"\nvips_file6 = \"/b/v6\"\npoll_ms = \"x\"\n"),
            [PathBuf::from("/a/v4"), PathBuf::from("/b/v6")]
        );
        // None named: the daemon cannot have written any.
        assert!(files("[bgp]\nprotocol = \"v4\"\n").is_empty());
        assert!(files("[bgp]\nvips_file = 3\n").is_empty());
    }

    /// `lb withdraw` has each routes file say `disabled yes;` (its routes
    /// kept) whatever BIRD answers: a BIRD that reads the files again
    /// keeps the protocols off.
    #[test]
    fn routes_files_are_marked_withdrawn_whatever_bird_does() {
        let d = std::env::temp_dir().join(format!("fastpath-withdraw-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let v4 = d.join("vips.conf");
        let on = format!(
            "{}disabled no;\nroute 192.0.2.80/32 blackhole;\n",
            lb::config::VIPS_FILE_HEADER
        );
        std::fs::write(&v4, &on).unwrap();
        let config = d.join("lb.toml");
        // `true` as birdc: it answers nothing, so no protocol is withdrawn.
        std::fs::write(
            &config,
            format!(
                "[bgp]\nvips_file = \"{}\"\nbirdc = [\"true\"]\n",
                v4.display()
            ),
        )
        .unwrap();
        let done = withdraw(&config).unwrap();
        assert_eq!(done.len(), 2, "{done:?}");
        assert!(done.iter().all(|(_, r)| r.is_err()), "{done:?}");
        assert_eq!(
            std::fs::read_to_string(&v4).unwrap(),
            on.replace("disabled no;", "disabled yes;")
        );
        // The IPv6 file was never written: left so.
        assert!(!d.join("vips6.conf").exists());
        // A file that cannot be marked is said.
        std::fs::remove_file(&v4).unwrap();
        std::fs::create_dir(&v4).unwrap();
        let done = withdraw(&config).unwrap();
        let (name, r) = &done[0];
        assert_eq!(name, &v4.display().to_string());
        let e = r.as_ref().unwrap_err().to_string();
        assert!(e.contains("could not mark it withdrawn"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn names_the_daemon_would_refuse_are_refused_and_empty_means_none() {
        // `disable all` would take down every BGP session of the router.
        for bad in ["all", "ALL", "protocol", "bgp", "1v4", "a-b", "a b"] {
            let e =
                target(&format!("[bgp]\nprotocol = {bad:?}\n"), Path::new("t.toml")).unwrap_err();
            assert!(e.to_string().contains("bgp.protocol"), "{bad}: {e}");
        }
        let e = target("[bgp]\nprotocol6 = \"all\"\n", Path::new("t.toml")).unwrap_err();
        assert!(e.to_string().contains("keyword"), "{e}");
        // The documented `protocol6 = ""`: no IPv6 protocol to disable.
        let v4 = t("[bgp]\nprotocol = \"v4\"\nprotocol6 = \"\"\n").unwrap();
        assert_eq!(names(&v4), [("v4", true)]);
    }

    #[test]
    fn birdc_answers_classified() {
        let ready = "BIRD 2.0.12 ready.\n";
        let p = named("p");
        assert_eq!(
            classify(&p, true, &format!("{ready}p: disabled\n"), "").unwrap(),
            Outcome::Disabled
        );
        assert_eq!(
            classify(&p, true, &format!("{ready}p: already disabled\n"), "").unwrap(),
            Outcome::AlreadyDisabled
        );
        let gone = "Unable to connect to server control socket (/run/bird/bird.ctl): No such file or directory\n";
        assert_eq!(
            classify(&p, false, "", gone).unwrap(),
            Outcome::BirdNotRunning
        );
        // A protocol BIRD does not know: a refusal when the file names it,
        // nothing to do for a shipped default.
        let unknown = format!(
            "{ready}syntax error, unexpected CF_SYM_UNDEFINED, expecting CF_SYM_KNOWN or TEXT or ALL\n"
        );
        let e = classify(&named("nosuch"), false, &unknown, "").unwrap_err();
        assert_eq!(
            e.to_string(),
            "birdc disable nosuch: syntax error, unexpected CF_SYM_UNDEFINED, expecting CF_SYM_KNOWN or TEXT or ALL"
        );
        let default = Protocol {
            name: "fastpath_vips6".into(),
            named: false,
        };
        assert_eq!(
            classify(&default, false, &unknown, "").unwrap(),
            Outcome::NotInBird
        );
        // Permission denied is not "not running".
        let denied =
            "Unable to connect to server control socket (/run/bird/bird.ctl): Permission denied\n";
        assert!(classify(&p, false, "", denied).is_err());
    }
}
