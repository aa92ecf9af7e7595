//! Runtime control without editing files by hand: `fastpath lb drain`,
//! `undrain` and `weight` change one backend through the API, and the
//! daemon writes the change back into the configuration file so that a
//! restart keeps it.
//!
//! The file is edited with `toml_edit`, which keeps its comments, order and
//! layout: only the backend's `weight` and its pool's `drained` list change.
//! A drained backend keeps its `weight` (what an undrain restores) and is
//! listed in its pool's `drained`; the tables give it no share while it is
//! there ([`lb::config::PoolConf::drained`]). A backend named in several
//! pools changes in all of them.
//!
//! The file is replaced in one step (a temporary file in the same directory,
//! then a rename), so a crash leaves the old file or the new one, never half
//! of one. A configuration that is a symbolic link is followed: the real
//! file is replaced and the link stays. The temporary file has a random
//! name and is created exclusively, never through a link, so a link
//! planted beside the configuration cannot make the daemon write elsewhere.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml_edit::{DocumentMut, Item, TableLike, Value};

/// A change to one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Listed in its pools' `drained`: no new connections, weight kept.
    Drain,
    /// Out of its pools' `drained`: its weight applies again.
    Undrain,
    /// A new weight (a drained backend stays drained).
    Weight(u32),
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Drain => f.write_str("drain"),
            Change::Undrain => f.write_str("undrain"),
            Change::Weight(w) => write!(f, "weight {w}"),
        }
    }
}

/// Why a change could not be made to the file's text.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// The file is not TOML.
    #[error("the configuration file is not TOML: {0}")]
    Parse(#[source] toml_edit::TomlError),
    /// No pool lists the backend.
    #[error("no backend {0:?} in any pool (give its name, or its address if it has no name)")]
    UnknownBackend(String),
    /// A pool or backend is written in a form this editor does not change
    /// (for instance `drained` that is not a list of strings).
    #[error("pool {pool:?}: {problem}; edit the file by hand")]
    Layout {
        /// The pool.
        pool: String,
        /// What is unexpected.
        problem: String,
    },
}

/// The file's text after a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edited {
    /// The new text.
    pub text: String,
    /// The pools that list the backend (all of them changed, or already
    /// were as asked).
    pub pools: Vec<String>,
    /// Whether the text differs from the old one.
    pub changed: bool,
}

fn as_str(t: &dyn TableLike, key: &str) -> Option<String> {
    t.get(key)
        .and_then(Item::as_value)
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// Whether `s` names a backend written with `name` and `address`: the
/// name, or the address (any spelling that parses to it), as
/// [`lb::config::BackendConf::is_named`].
fn names(s: &str, name: Option<&str>, address: Option<&str>) -> bool {
    if name == Some(s) {
        return true;
    }
    let addr = address.and_then(|a| a.parse::<IpAddr>().ok());
    matches!((s.parse::<IpAddr>(), addr), (Ok(a), Some(b)) if a == b)
}

/// Calls `f` with each pool of the document, as a table whichever way
/// it is written (`[[pools]]` or an inline `pools = [{...}]`).
fn each_pool(doc: &mut DocumentMut, mut f: impl FnMut(&mut dyn TableLike)) {
    each_table(doc.get_mut("pools"), &mut f);
}

/// Calls `f` with each backend of a pool, as a table.
fn each_backend(pool: &mut dyn TableLike, mut f: impl FnMut(&mut dyn TableLike)) {
    each_table(pool.get_mut("backends"), &mut f);
}

/// Calls `f` with each table of an array of tables (`[[name]]`) or of an
/// inline array of inline tables (`name = [{...}]`); anything else has none.
fn each_table(item: Option<&mut Item>, f: &mut dyn FnMut(&mut dyn TableLike)) {
    match item {
        Some(Item::ArrayOfTables(a)) => {
            for t in a.iter_mut() {
                f(t);
            }
        }
        Some(Item::Value(Value::Array(a))) => {
            for v in a.iter_mut() {
                if let Some(t) = v.as_inline_table_mut() {
                    f(t);
                }
            }
        }
        _ => {}
    }
}

/// Sets `key` to `v`, keeping the spaces and comment around an old value.
fn set_value(t: &mut dyn TableLike, key: &str, v: Value) {
    match t.get_mut(key).and_then(Item::as_value_mut) {
        Some(old) => {
            let decor = old.decor().clone();
            *old = v;
            *old.decor_mut() = decor;
        }
        None => {
            t.insert(key, Item::Value(v));
        }
    }
}

/// Whether a comment is attached to `key` of `t`: on the lines before
/// it, after its value, or inside its (array) value.
fn has_comment(t: &dyn TableLike, key: &str) -> bool {
    let Some((k, v)) = t.get_key_value(key) else {
        return false;
    };
    let commented = |r: Option<&toml_edit::RawString>| {
        r.and_then(toml_edit::RawString::as_str)
            .is_some_and(|s| s.contains('#'))
    };
    let d = k.leaf_decor();
    let mut any = commented(d.prefix()) || commented(d.suffix());
    if let Some(v) = v.as_value() {
        any |= commented(v.decor().prefix()) || commented(v.decor().suffix());
        if let Some(a) = v.as_array() {
            any |= commented(Some(a.trailing()));
        }
    }
    any
}

/// Applies `change` to `backend` (a name, or an address) in the
/// configuration text `text`, in every pool that lists it among its own
/// backends. Comments, order and layout stay; an unknown backend is an
/// error and nothing changes.
pub fn edit(text: &str, backend: &str, change: Change) -> Result<Edited, EditError> {
    let mut doc: DocumentMut = text.parse().map_err(EditError::Parse)?;
    let pools = edit_doc(&mut doc, backend, change)?;
    if pools.is_empty() {
        return Err(EditError::UnknownBackend(backend.to_string()));
    }
    let new = doc.to_string();
    Ok(Edited {
        changed: new != text,
        text: new,
        pools,
    })
}

/// [`edit`] for a text whose configuration is `cfg` (the daemon's running
/// one, parsed from exactly this text): only the `[[pools]]` elements that
/// list the backend are parsed and edited, the rest of the text is kept
/// byte for byte (a runtime change of a 3.3 MB file in milliseconds, not
/// the ~0.4 s of editing it whole). Falls back to [`edit`] where the text
/// does not split into one element per pool of `cfg`. Same result as
/// [`edit`].
pub fn edit_with(
    text: &str,
    cfg: &lb::Config,
    backend: &str,
    change: Change,
) -> Result<Edited, EditError> {
    let Some(ranges) = lb::config_chunks::pool_elements(text)
        .filter(|r| r.len() == cfg.pools.len() && !r.is_empty())
    else {
        return edit(text, backend, change);
    };
    let mut out = String::with_capacity(text.len() + 64);
    let mut last = 0;
    let mut pools = Vec::new();
    for (range, pool) in ranges.into_iter().zip(&cfg.pools) {
        if !pool.backends.iter().any(|b| b.is_named(backend)) {
            continue;
        }
        let mut doc: DocumentMut = text[range.clone()].parse().map_err(EditError::Parse)?;
        let here = edit_doc(&mut doc, backend, change)?;
        if here.len() != 1 {
            // Not the element `cfg` says it is: edit the whole text.
            return edit(text, backend, change);
        }
        pools.extend(here);
        out.push_str(&text[last..range.start]);
        out.push_str(&doc.to_string());
        last = range.end;
    }
    if pools.is_empty() {
        return Err(EditError::UnknownBackend(backend.to_string()));
    }
    out.push_str(&text[last..]);
    Ok(Edited {
        changed: out != text,
        text: out,
        pools,
    })
}

/// Applies `change` to `backend` in every pool of `doc` that lists it;
/// the names of those pools.
fn edit_doc(
    doc: &mut DocumentMut,
    backend: &str,
    change: Change,
) -> Result<Vec<String>, EditError> {
    let mut pools = Vec::new();
    let mut problem = None;
    each_pool(doc, |pool| {
        let pool_name = as_str(pool, "name").unwrap_or_default();
        // The backend as this pool writes it: its name (else its address),
        // and its address.
        let mut found: Option<(String, String)> = None;
        each_backend(pool, |b| {
            let (name, address) = (as_str(b, "name"), as_str(b, "address"));
            if names(backend, name.as_deref(), address.as_deref()) {
                if let Change::Weight(w) = change {
                    set_value(b, "weight", Value::from(i64::from(w)));
                }
                let address = address.unwrap_or_default();
                found = Some((name.unwrap_or_else(|| address.clone()), address));
            }
        });
        let Some((label, address)) = found else {
            return;
        };
        pools.push(pool_name.clone());
        if matches!(change, Change::Weight(_)) {
            return;
        }
        let is_this = |s: &str| names(s, Some(label.as_str()), Some(address.as_str()));
        match pool.get_mut("drained") {
            None if change == Change::Undrain => {}
            None => {
                let mut a = toml_edit::Array::new();
                a.push(label.as_str());
                pool.insert("drained", Item::Value(Value::Array(a)));
            }
            Some(item) => {
                let Some(a) = item.as_array_mut() else {
                    problem = Some(EditError::Layout {
                        pool: pool_name,
                        problem: "`drained` is not a list".into(),
                    });
                    return;
                };
                if a.iter().any(|v| v.as_str().is_none()) {
                    problem = Some(EditError::Layout {
                        pool: pool_name,
                        problem: "`drained` holds something other than names".into(),
                    });
                    return;
                }
                let listed = a.iter().any(|v| v.as_str().is_some_and(is_this));
                match change {
                    Change::Drain if !listed => a.push(label.as_str()),
                    Change::Undrain => {
                        a.retain(|v| !v.as_str().is_some_and(is_this));
                        // An empty list goes, unless a comment is
                        // attached to it (kept: `drained = [] # ...`).
                        if a.is_empty() && !has_comment(pool, "drained") {
                            pool.remove("drained");
                        }
                    }
                    _ => {}
                }
            }
        }
    });
    match problem {
        Some(p) => Err(p),
        None => Ok(pools),
    }
}

/// Each backend of a pool's members (its own and its included pools'), by
/// name: the weight written in the configuration and whether its pool
/// drains it. The tables hold the weight that applies (0 when drained);
/// this is what `/status` shows beside it.
pub fn configured(cfg: &lb::Config, pool: &str) -> HashMap<String, (u32, bool)> {
    // A validated configuration has no include cycle.
    cfg.members_as_written(&cfg.pool_index(), pool)
        .unwrap_or_default()
        .into_iter()
        .map(|(b, drained)| (b.display_name(), (b.weight, drained)))
        .collect()
}

/// Why the file could not be replaced.
#[derive(Debug, thiserror::Error)]
#[error("writing {path}: {source}")]
pub struct WriteError {
    /// The file, or its temporary neighbour.
    pub path: PathBuf,
    /// The system's answer.
    #[source]
    pub source: std::io::Error,
}

/// Tries for a temporary file's name before giving up (each name is
/// random; a name that exists is never opened, only skipped).
const TEMP_TRIES: usize = 16;

/// A random name for a temporary file beside `file`: nobody can plant a
/// link under it in advance. (The standard library's hasher keys are drawn
/// from the system's randomness.)
fn temp_name(file: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!(".{file}.fastpath-{:016x}.tmp", h.finish())
}

/// The file `path` names, through any symbolic links: what is replaced,
/// so that a link stays a link to the file that changed.
fn real_path(path: &Path) -> Result<PathBuf, WriteError> {
    std::fs::canonicalize(path).map_err(|source| WriteError {
        path: path.to_path_buf(),
        source,
    })
}

/// Creates a new file in `dir` under the first of `names` that does not
/// exist: exclusively (`O_CREAT | O_EXCL`), never through a symbolic link
/// (`O_NOFOLLOW`; with `O_EXCL` a link in the way is an error, not a
/// path), readable by the owner only until its permissions are copied.
fn create_temp(
    dir: &Path,
    names: impl IntoIterator<Item = String>,
) -> Result<(std::fs::File, PathBuf), WriteError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut last = None;
    for name in names {
        let tmp = dir.join(name);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)
        {
            Ok(f) => return Ok((f, tmp)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some((tmp, e)),
            Err(source) => return Err(WriteError { path: tmp, source }),
        }
    }
    let (path, source) = last.unwrap_or_else(|| {
        (
            dir.to_path_buf(),
            std::io::Error::other("no name left for a temporary file"),
        )
    });
    Err(WriteError { path, source })
}

/// Replaces the file `path` names with `text` in one step. A symbolic link
/// is followed to the real file, which is replaced (the link stays a link,
/// and later edits of the real file are read). The new text goes into a
/// temporary file beside the real one (same file system), created
/// exclusively under a random name and never through a link, given the
/// old file's permissions and owner, flushed to disk, then renamed over it.
pub fn write_atomically(path: &Path, text: &str) -> Result<(), WriteError> {
    let real = real_path(path)?;
    let file = real
        .file_name()
        .map_or_else(|| "config".into(), |n| n.to_string_lossy().into_owned());
    let names = std::iter::repeat_with(|| temp_name(&file)).take(TEMP_TRIES);
    write_via(&real, text, names)
}

/// [`write_atomically`] to the real file `real`, the temporary file under
/// the first free name of `names`.
fn write_via(
    real: &Path,
    text: &str,
    names: impl IntoIterator<Item = String>,
) -> Result<(), WriteError> {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let dir = real
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let err = |p: &Path| {
        let p = p.to_path_buf();
        move |source| WriteError { path: p, source }
    };
    let (mut f, tmp) = create_temp(dir, names)?;
    let result = (|| {
        if let Ok(m) = std::fs::metadata(real) {
            f.set_permissions(m.permissions()).map_err(err(&tmp))?;
            // The owner too, where this process may give it (as root); a
            // file the daemon may write but not chown keeps the daemon's.
            let _ = std::os::unix::fs::fchown(&f, Some(m.uid()), Some(m.gid()));
        }
        f.write_all(text.as_bytes()).map_err(err(&tmp))?;
        f.sync_all().map_err(err(&tmp))?;
        std::fs::rename(&tmp, real).map_err(err(real))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    } else if let Ok(d) = std::fs::File::open(dir) {
        // The rename itself, on disk (best effort).
        let _ = d.sync_all();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SplitMix64: the inputs of the property tests below, reproducible
    /// from the seed in a failure's message.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn chance(&mut self, one_in: u64) -> bool {
            self.below(one_in) == 0
        }
    }

    /// A random valid configuration with comments everywhere: 1 to 4
    /// pools (`[[pools]]` tables, sometimes inline backends, sometimes
    /// `[[pools.backends]]`), backends named or not, weights written or
    /// not, some backends in two pools, some pools including others, some
    /// backends drained already; a VIP per pool. Returns the text and the
    /// backends' names.
    fn config(r: &mut Rng) -> (String, Vec<String>) {
        let mut t = String::from(
            "# fastpath load balancer\n[encap]\nsource = \"10.0.0.1\" # outer source\n\n",
        );
        let pools = 1 + r.below(4) as usize;
        let mut all = Vec::new();
        for p in 0..pools {
            t += &format!("# pool {p}: what it serves\n[[pools]]\nname = \"p{p}\"\n");
            let n = 1 + r.below(4) as usize;
            let mut own: Vec<(String, String, Option<u32>)> = Vec::new();
            for b in 0..n {
                // Backends 100 to 103 appear in several pools (under
                // one name everywhere).
                let octet = if p > 0 && r.chance(3) {
                    100 + b
                } else {
                    10 * p + b + 1
                };
                let addr = format!("10.1.0.{octet}");
                let name = if octet % 2 == 0 {
                    format!("be-{octet}")
                } else {
                    addr.clone()
                };
                if own.iter().any(|(n, _, _)| *n == name) {
                    continue;
                }
                let weight = (!r.chance(3)).then(|| 1 + r.below(5) as u32);
                own.push((name.clone(), addr, weight));
                if !all.contains(&name) {
                    all.push(name);
                }
            }
            let named = |(name, addr, _): &(String, String, Option<u32>)| {
                if name == addr {
                    String::new()
                } else {
                    format!(", name = \"{name}\"")
                }
            };
            let weight = |w: &Option<u32>| w.map(|w| format!(", weight = {w}")).unwrap_or_default();
            if r.chance(3) && p > 0 {
                t += &format!(
                    "include = [\"p{}\"] # shares p{}'s backends\n",
                    p - 1,
                    p - 1
                );
            }
            let drained: Vec<&String> = own.iter().map(|b| &b.0).filter(|_| r.chance(4)).collect();
            if !drained.is_empty() {
                t += &format!(
                    "drained = [{}] # out for maintenance\n",
                    drained
                        .iter()
                        .map(|d| format!("\"{d}\""))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            if r.chance(2) {
                t += "backends = [\n";
                for b in &own {
                    t += &format!(
                        "  {{ address = \"{}\"{}{} }}, # backend {}\n",
                        b.1,
                        named(b),
                        weight(&b.2),
                        b.0
                    );
                }
                t += "]\n";
            } else {
                for b in &own {
                    t += &format!(
                        "# backend {}\n[[pools.backends]]\naddress = \"{}\"\n",
                        b.0, b.1
                    );
                    if b.0 != b.1 {
                        t += &format!("name = \"{}\"\n", b.0);
                    }
                    if let Some(w) = b.2 {
                        t += &format!("weight = {w} # its share\n");
                    }
                }
            }
            t += "\n";
        }
        for p in 0..pools {
            t += &format!(
                "# VIP {p}\n[[vips]]\nname = \"v{p}\"\naddress = \"198.18.0.{}\"\nprotocol = \"tcp\"\npool = \"p{p}\"\n",
                p + 1
            );
        }
        (t, all)
    }

    fn comments(text: &str) -> Vec<&str> {
        text.lines()
            .filter_map(|l| l.find('#').map(|i| l[i..].trim_end()))
            .collect()
    }

    /// The configuration with `backend`'s drain state or weight set in every
    /// pool that lists it, as the edit should leave it.
    fn expected(cfg: &lb::Config, backend: &str, change: Change) -> lb::Config {
        let mut want = cfg.clone();
        for p in &mut want.pools {
            let Some(b) = p.backends.iter_mut().find(|b| b.is_named(backend)) else {
                continue;
            };
            let label = b.display_name();
            let b = b.clone();
            match change {
                Change::Weight(w) => {
                    if let Some(x) = p.backends.iter_mut().find(|x| x.is_named(backend)) {
                        x.weight = w;
                    }
                }
                Change::Drain => {
                    if !p.drained.iter().any(|d| b.is_named(d)) {
                        p.drained.push(label);
                    }
                }
                Change::Undrain => p.drained.retain(|d| !b.is_named(d)),
            }
        }
        want
    }

    /// Random configurations with comments: after a drain, an undrain or a
    /// weight change of a random backend, the file parses to the expected
    /// configuration, every comment line is still there, and a drain then
    /// an undrain gives back every backend's weight and the pools' drain
    /// lists as they were.
    #[test]
    fn edits_change_only_what_they_say_and_keep_comments() {
        for seed in 0..300u64 {
            let mut r = Rng(seed);
            let (text, names) = config(&mut r);
            let cfg = lb::Config::parse(&text, "random.toml")
                .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
            let backend = &names[r.below(names.len() as u64) as usize];
            let change = match r.below(3) {
                0 => Change::Drain,
                1 => Change::Undrain,
                _ => Change::Weight(r.below(10) as u32),
            };
            let e = edit(&text, backend, change).unwrap();
            // Editing only the pools that list it gives the same text.
            assert_eq!(
                edit_with(&text, &cfg, backend, change).unwrap(),
                e,
                "seed {seed} {change} {backend}:\n{text}"
            );
            let got = lb::Config::parse(&e.text, "edited.toml")
                .unwrap_or_else(|err| panic!("seed {seed} {change} {backend}: {err}\n{}", e.text));
            assert_eq!(
                got,
                expected(&cfg, backend, change),
                "seed {seed} {change} {backend}:\n{}",
                e.text
            );
            assert_eq!(
                comments(&text),
                comments(&e.text),
                "seed {seed}:\n{}",
                e.text
            );
            let in_pools = cfg
                .pools
                .iter()
                .filter(|p| p.backends.iter().any(|b| b.is_named(backend)))
                .count();
            assert_eq!(
                e.pools.len(),
                in_pools,
                "seed {seed}: every pool that lists it"
            );

            // Drain then undrain: the weights and the other drains as before.
            let undrained = |c: &lb::Config| {
                let mut c = c.clone();
                for p in &mut c.pools {
                    let own: Vec<_> = p
                        .backends
                        .iter()
                        .filter(|b| b.is_named(backend))
                        .cloned()
                        .collect();
                    p.drained.retain(|d| !own.iter().any(|b| b.is_named(d)));
                }
                c
            };
            let drained = edit(&text, backend, Change::Drain).unwrap();
            let back = edit(&drained.text, backend, Change::Undrain).unwrap();
            let back_cfg = lb::Config::parse(&back.text, "back.toml").unwrap();
            assert_eq!(back_cfg, undrained(&cfg), "seed {seed}:\n{}", back.text);
            for p in &back_cfg.pools {
                for b in &p.backends {
                    let before = cfg.pools.iter().find(|q| q.name == p.name).unwrap();
                    let was = before
                        .backends
                        .iter()
                        .find(|x| x.address == b.address)
                        .unwrap();
                    assert_eq!(b.weight, was.weight, "seed {seed}: weight restored");
                }
            }
            // The drained backend takes no share; its weight is kept.
            let d = lb::Config::parse(&drained.text, "d.toml").unwrap();
            for p in &d.pools {
                for m in d.flatten(&p.name).unwrap() {
                    if m.is_named(backend) {
                        assert_eq!(m.weight, 0, "seed {seed}: drained in {}", p.name);
                    }
                }
                if let Some(b) = p.backends.iter().find(|b| b.is_named(backend)) {
                    let before = cfg.pools.iter().find(|q| q.name == p.name).unwrap();
                    let was = before
                        .backends
                        .iter()
                        .find(|x| x.is_named(backend))
                        .unwrap();
                    assert_eq!(
                        b.weight, was.weight,
                        "seed {seed}: weight kept while drained"
                    );
                    assert_eq!(
                        configured(&d, &p.name)[&b.display_name()],
                        (was.weight, true)
                    );
                }
            }
        }
    }

    #[test]
    fn unknown_backends_and_odd_layouts_are_refused_whole() {
        let text = "[encap]\nsource = \"10.0.0.1\"\n[[pools]]\nname = \"web\"\nbackends = [{ address = \"10.1.0.1\", name = \"a\" }]\n";
        assert!(matches!(
            edit(text, "nope", Change::Drain),
            Err(EditError::UnknownBackend(n)) if n == "nope"
        ));
        // By address, although it has a name; written back by its name.
        let e = edit(text, "10.1.0.1", Change::Drain).unwrap();
        assert!(e.text.contains("drained = [\"a\"]"), "{}", e.text);
        assert_eq!(e.pools, ["web"]);
        // Twice: nothing more to do.
        let again = edit(&e.text, "a", Change::Drain).unwrap();
        assert!(!again.changed);
        // Undraining what is not drained changes nothing either.
        assert!(!edit(text, "a", Change::Undrain).unwrap().changed);
        let odd = text.replace("name = \"web\"", "name = \"web\"\ndrained = \"a\"");
        assert!(matches!(
            edit(&odd, "a", Change::Drain),
            Err(EditError::Layout { .. })
        ));
        assert!(matches!(
            edit("[[pools", "a", Change::Drain),
            Err(EditError::Parse(_))
        ));
    }

    /// `drained` names one of the pool's own backends, once; otherwise the
    /// file is rejected with the key, as a runtime change's result would be.
    #[test]
    fn drained_lists_are_validated() {
        let base = "[encap]\nsource = \"10.0.0.1\"\n[[pools]]\nname = \"a\"\nbackends = [{ address = \"10.1.0.1\", name = \"x\" }]\nDRAIN\n[[pools]]\nname = \"b\"\ninclude = [\"a\"]\nINCL\n";
        let parse = |drain: &str, incl: &str| {
            lb::Config::parse(
                &base.replace("DRAIN", drain).replace("INCL", incl),
                "t.toml",
            )
        };
        assert!(parse("drained = [\"x\"]", "").is_ok());
        assert!(parse("drained = [\"10.1.0.1\"]", "").is_ok());
        let e = parse("drained = [\"y\"]", "").unwrap_err();
        assert_eq!(e.key, "pools[0].drained[0]", "{e}");
        let e = parse("drained = [\"x\", \"10.1.0.1\"]", "").unwrap_err();
        assert_eq!(e.key, "pools[0].drained[1]", "{e}");
        // Drained where it is listed, not through an include.
        let e = parse("", "drained = [\"x\"]").unwrap_err();
        assert_eq!(e.key, "pools[1].drained[0]", "{e}");
        // Through the include it is drained in b too.
        let c = parse("drained = [\"x\"]", "").unwrap();
        assert_eq!(c.flatten("b").unwrap()[0].weight, 0);
        assert_eq!(configured(&c, "b")["x"], (1, true));
    }

    #[test]
    fn the_file_is_replaced_whole_with_its_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("fastpath-ops-write-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("lb.toml");
        std::fs::write(&f, "old\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomically(&f, "new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "new\n");
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o640
        );
        // Nothing left beside it.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        let e = write_atomically(&dir.join("missing-dir/lb.toml"), "x").unwrap_err();
        assert!(e.to_string().contains("missing-dir"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A configuration that is a symbolic link (to a file in another
    /// directory, through a relative link) stays a link, and the file it
    /// points to gets the new text: later edits of that file are what the
    /// daemon reads. Nothing is left in either directory.
    #[test]
    fn a_symlinked_configuration_stays_a_link_and_its_target_changes() {
        let dir = std::env::temp_dir().join(format!("fastpath-ops-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        std::fs::create_dir_all(dir.join("real")).unwrap();
        let target = dir.join("real/lb.toml");
        std::fs::write(&target, "old\n").unwrap();
        let link = dir.join("etc/lb.toml");
        std::os::unix::fs::symlink("../real/lb.toml", &link).unwrap();
        write_atomically(&link, "new\n").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            Path::new("../real/lb.toml")
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new\n");
        assert_eq!(std::fs::read_dir(dir.join("etc")).unwrap().count(), 1);
        assert_eq!(std::fs::read_dir(dir.join("real")).unwrap().count(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A link planted where the temporary file would go is not followed:
    /// the file it points to is untouched, the link stays, and the write
    /// takes the next name. The names are random, so none can be planted
    /// in advance.
    #[test]
    fn a_planted_link_at_the_temporary_name_is_not_followed() {
        let dir = std::env::temp_dir().join(format!("fastpath-ops-plant-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("lb.toml");
        std::fs::write(&f, "old\n").unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        let planted = ".lb.toml.fastpath-planted.tmp".to_string();
        std::os::unix::fs::symlink(&victim, dir.join(&planted)).unwrap();
        // A dangling link too: O_CREAT alone would create its target.
        let dangling = ".lb.toml.fastpath-dangling.tmp".to_string();
        std::os::unix::fs::symlink(dir.join("created-through-link"), dir.join(&dangling)).unwrap();
        write_via(
            &f,
            "new\n",
            [planted.clone(), dangling.clone(), temp_name("lb.toml")],
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "new\n");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        assert!(!dir.join("created-through-link").exists());
        for l in [&planted, &dangling] {
            assert!(std::fs::symlink_metadata(dir.join(l))
                .unwrap()
                .file_type()
                .is_symlink());
        }
        // With every name taken, nothing is written anywhere.
        let e = write_via(&f, "newer\n", [planted]).unwrap_err();
        assert_eq!(e.source.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "new\n");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        // A link at the name earlier versions always used (the process id)
        // is not used either.
        let predictable = dir.join(format!(".lb.toml.fastpath-{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &predictable).unwrap();
        write_atomically(&f, "newest\n").unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "newest\n");
        assert!(std::fs::symlink_metadata(&f).unwrap().file_type().is_file());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        // Two names in a row differ.
        assert_ne!(temp_name("lb.toml"), temp_name("lb.toml"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
