//! Parsing a large configuration in pieces, and re-parsing only the pieces
//! that changed.
//!
//! A configuration of 1,000 VIPs over 1,000 pools of 100 backends is 3.3 MB
//! of TOML; the `toml` crate parses it in ~150 ms on one core, which is more
//! than the whole budget of a reload that changes one backend. Most of such
//! a file is a sequence of `[[pools]]`, `[[vips]]` and `[[prefix_groups]]`
//! elements, and TOML gives each element exactly the lines from its header
//! to the next header of the same shape. So the text is split into a
//! *head* (everything before the first such header: `[forwarder]`,
//! `[encap]`, ...) and one *chunk* per element; each is parsed on its own
//! (chunks in parallel on a first load), and a [`ParseCache`] remembers each
//! chunk's result by its exact text, so a reload parses only the chunks
//! whose text changed.
//!
//! The pieces are only used when splitting cannot change the meaning of the
//! file; anything else falls back to parsing the whole text, which also
//! produces every error message (with its line), so errors are the same
//! either way. The fallback is taken when the text has a multi-line string
//! (a line inside one could look like a header); when a line inside an
//! element starts with `[` but is not one of that element's own sub-tables
//! (`[pools.x]`, `[[pools.x]]`: a top-level table after the elements, a
//! nested array written over lines, or a quoted header); when the head
//! itself has elements of a kind that chunks also have (`pools = [...]`
//! followed by `[[pools]]` is an error the whole parse reports); and when
//! any piece fails to parse. Whatever the path, the result equals
//! `toml::from_str::<Config>` of the whole text: a property test checks it
//! over generated files and mutations of them.

use std::collections::HashMap;

use serde::Deserialize;

use super::{Config, PoolConf, PrefixGroupConf, VipConf};

/// The arrays of tables a file is split at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pools,
    Vips,
    PrefixGroups,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Pools, Kind::Vips, Kind::PrefixGroups];

    fn key(self) -> &'static str {
        match self {
            Kind::Pools => "pools",
            Kind::Vips => "vips",
            Kind::PrefixGroups => "prefix_groups",
        }
    }

    fn of(key: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.key() == key)
    }
}

/// One parsed element.
#[derive(Debug, Clone)]
enum Item {
    Pool(PoolConf),
    Vip(VipConf),
    PrefixGroup(PrefixGroupConf),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Pools {
    pools: Vec<PoolConf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Vips {
    vips: Vec<VipConf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrefixGroups {
    prefix_groups: Vec<PrefixGroupConf>,
}

/// Exactly one element from a chunk's text, or `None` (the caller falls
/// back to the whole text for the error).
fn parse_item(kind: Kind, text: &str) -> Option<Item> {
    fn one<T>(v: Vec<T>) -> Option<T> {
        let mut it = v.into_iter();
        let first = it.next()?;
        it.next().is_none().then_some(first)
    }
    match kind {
        Kind::Pools => one(toml::from_str::<Pools>(text).ok()?.pools).map(Item::Pool),
        Kind::Vips => one(toml::from_str::<Vips>(text).ok()?.vips).map(Item::Vip),
        Kind::PrefixGroups => {
            one(toml::from_str::<PrefixGroups>(text).ok()?.prefix_groups).map(Item::PrefixGroup)
        }
    }
}

/// The key of a line that is an array-of-tables header `[[key]]` (spaces
/// inside the brackets and a comment after them allowed), if it is one.
fn array_header(line: &str) -> Option<&str> {
    let rest = line.trim().strip_prefix("[[")?;
    let end = rest.find("]]")?;
    let after = rest[end + 2..].trim_start();
    (after.is_empty() || after.starts_with('#')).then(|| rest[..end].trim())
}

/// Whether a line starting with `[` is a header of one of `key`'s own
/// sub-tables (`[key.x]`, `[[key.x.y]]`).
fn is_sub_header(line: &str, key: &str) -> bool {
    let t = line.trim_start();
    let inner = t.strip_prefix("[[").or_else(|| t.strip_prefix('['));
    inner
        .and_then(|i| i.trim_start().strip_prefix(key))
        .is_some_and(|r| r.trim_start().starts_with('.'))
}

/// A text split into its head and its elements, in file order.
struct Split<'a> {
    head: &'a str,
    items: Vec<(Kind, &'a str)>,
}

/// Splits `text`, or `None` where splitting could change its meaning.
fn split(text: &str) -> Option<Split<'_>> {
    if text.contains("\"\"\"") || text.contains("'''") {
        return None;
    }
    let mut head = text;
    let mut items = Vec::new();
    let mut current: Option<(Kind, usize)> = None;
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        let start = pos;
        pos += line.len();
        if let Some(kind) = array_header(line).and_then(Kind::of) {
            match current {
                Some((k, s)) => items.push((k, &text[s..start])),
                None => head = &text[..start],
            }
            current = Some((kind, start));
        } else if let Some((k, _)) = current {
            if line.trim_start().starts_with('[') && !is_sub_header(line, k.key()) {
                return None;
            }
        }
    }
    if let Some((k, s)) = current {
        items.push((k, &text[s..]));
    }
    Some(Split { head, items })
}

/// The byte ranges of the text's `[[pools]]` elements, in file order, when
/// the text splits safely and its head has no `pools` of its own (then the
/// i-th range is the configuration's `pools[i]`); `None` otherwise. For
/// editing one pool without parsing the others.
pub fn pool_elements(text: &str) -> Option<Vec<std::ops::Range<usize>>> {
    let split = split(text)?;
    let head: toml::Table = toml::from_str(split.head).ok()?;
    if head.contains_key(Kind::Pools.key()) {
        return None;
    }
    let base = text.as_ptr() as usize;
    Some(
        split
            .items
            .iter()
            .filter(|(k, _)| *k == Kind::Pools)
            .map(|(_, t)| {
                let start = t.as_ptr() as usize - base;
                start..start + t.len()
            })
            .collect(),
    )
}

/// What the last parse through a [`ParseCache`] did (in a reload's
/// answer, which the command line reads back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChunkStats {
    /// Elements the text was split into (0 when it was parsed whole).
    pub chunks: usize,
    /// Of those, the ones parsed (the others were remembered).
    pub parsed: usize,
    /// The text was parsed whole (it could not be split safely, or a piece
    /// had an error).
    pub whole: bool,
}

/// The parsed pieces of the last text parsed through it, by their exact
/// text. Holding one across reloads makes a reload parse only what
/// changed; a cache is a memo, never a source of truth, so any text may go
/// through any cache.
#[derive(Debug, Default)]
pub struct ParseCache {
    /// The head's text, its configuration and which element keys it has.
    head: Option<(String, Config, [bool; 3])>,
    items: HashMap<String, Item>,
    last: ChunkStats,
}

impl ParseCache {
    /// An empty cache.
    pub fn new() -> Self {
        ParseCache::default()
    }

    /// What the last parse did.
    pub fn last(&self) -> ChunkStats {
        self.last
    }

    /// Parses `text` in pieces, or `None` when it must be parsed whole
    /// (the caller does so, for the result or for the error). Validation
    /// is the caller's.
    pub(crate) fn parse(&mut self, text: &str) -> Option<Config> {
        // On failure nothing was changed: the pieces of the last good text
        // stay for the next one (a reload after a rejected edit).
        let result = self.parse_pieces(text);
        if result.is_none() {
            self.last = ChunkStats {
                whole: true,
                ..ChunkStats::default()
            };
        }
        result
    }

    fn parse_pieces(&mut self, text: &str) -> Option<Config> {
        let split = split(text)?;
        let (mut cfg, in_head) = match &self.head {
            Some((t, c, k)) if t == split.head => (c.clone(), *k),
            _ => {
                let table: toml::Table = toml::from_str(split.head).ok()?;
                let in_head = Kind::ALL.map(|k| table.contains_key(k.key()));
                (Config::deserialize(table).ok()?, in_head)
            }
        };
        let head_cfg = cfg.clone();
        // `pools = []` (or a quoted `[["pools"]]`) in the head and
        // `[[pools]]` after it: let the whole parse decide.
        if split.items.iter().any(|(k, _)| in_head[*k as usize]) {
            return None;
        }
        let missing: Vec<(Kind, &str)> = split
            .items
            .iter()
            .filter(|(_, t)| !self.items.contains_key(*t))
            .copied()
            .collect();
        let parsed = parse_all(&missing)?;
        let mut items: HashMap<String, Item> = HashMap::with_capacity(split.items.len());
        for ((_, t), item) in missing.iter().zip(parsed) {
            items.insert((*t).to_string(), item);
        }
        for (_, t) in &split.items {
            let item = match items.get(*t) {
                Some(i) => i.clone(),
                None => {
                    // Remembered from the last text: move it over.
                    let (k, v) = self.items.remove_entry(*t)?;
                    let i = v.clone();
                    items.insert(k, v);
                    i
                }
            };
            match item {
                Item::Pool(p) => cfg.pools.push(p),
                Item::Vip(v) => cfg.vips.push(v),
                Item::PrefixGroup(g) => cfg.prefix_groups.push(g),
            }
        }
        self.last = ChunkStats {
            chunks: split.items.len(),
            parsed: missing.len(),
            whole: false,
        };
        self.head = Some((split.head.to_string(), head_cfg, in_head));
        self.items = items;
        Some(cfg)
    }
}

/// Parses elements, on several threads when there are many; `None` if any
/// fails.
fn parse_all(items: &[(Kind, &str)]) -> Option<Vec<Item>> {
    const PER_THREAD_MIN: usize = 128;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len() / PER_THREAD_MIN)
        .clamp(1, 8);
    if threads == 1 {
        return items.iter().map(|&(k, t)| parse_item(k, t)).collect();
    }
    let per = items.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(per)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|&(k, t)| parse_item(k, t))
                        .collect::<Option<Vec<Item>>>()
                })
            })
            .collect();
        let mut all = Vec::with_capacity(items.len());
        for h in handles {
            all.extend(h.join().ok()??);
        }
        Some(all)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_recognised_as_toml_writes_them() {
        assert_eq!(array_header("[[pools]]\n"), Some("pools"));
        assert_eq!(array_header("  [[ vips ]]  # web\r\n"), Some("vips"));
        assert_eq!(array_header("[[pools]] x = 1"), None);
        assert_eq!(array_header("[pools]"), None);
        assert!(is_sub_header("[pools.health]", "pools"));
        assert!(is_sub_header("  [[ pools.x ]]", "pools"));
        assert!(!is_sub_header("[poolsx.a]", "pools"));
        assert!(!is_sub_header("[encap]", "pools"));
        assert!(!is_sub_header("[1, 2],", "pools"));
    }

    #[test]
    fn a_top_level_table_after_the_elements_is_not_split() {
        let text = "[[pools]]\nname = \"a\"\n[encap]\nsource = \"10.0.0.1\"\n";
        assert!(split(text).is_none());
        let text = "[[pools]]\nname = \"a\"\n[pools.x]\n[[vips]]\nname = \"v\"\n";
        let s = split(text).unwrap();
        assert_eq!(s.head, "");
        assert_eq!(s.items.len(), 2);
        assert_eq!(s.items[0].1, "[[pools]]\nname = \"a\"\n[pools.x]\n");
        assert!(split("x = \"\"\"\n[[pools]]\n\"\"\"\n").is_none());
    }

    use proptest::prelude::*;

    /// A head section, an element or a line that makes splitting unsafe or
    /// the file wrong, as text.
    fn piece() -> impl Strategy<Value = String> {
        let backends =
            prop::collection::vec((1u8..250, any::<bool>(), 0u8..4), 0..5).prop_map(|v| {
                v.iter()
                    .map(|(a, named, w)| {
                        let name = if *named {
                            format!(", name = \"b{a}\"")
                        } else {
                            String::new()
                        };
                        format!("  {{ address = \"10.0.0.{a}\"{name}, weight = {w} }},\n")
                    })
                    .collect::<String>()
            });
        prop_oneof![
            4 => (0u8..4, backends, any::<bool>()).prop_map(|(n, b, health)| {
                let h = if health {
                    "[pools.health]\nkind = \"tcp\"\nport = 80\n"
                } else {
                    ""
                };
                format!("[[pools]]\nname = \"p{n}\"\ntable_size = 251\nbackends = [\n{b}]\n{h}\n")
            }),
            4 => (0u8..4, 0u8..4, 1u8..250).prop_map(|(n, p, a)| format!(
                "[[ vips ]] # a VIP\nname = \"v{n}\"\naddress = \"198.18.0.{a}\"\nport = 80\nprotocol = \"tcp\"\npool = \"p{p}\"\n\n"
            )),
            1 => (0u8..3).prop_map(|n| format!(
                "[[prefix_groups]]\nname = \"g{n}\"\nprefixes = [\"198.18.{n}.0/24\"]\ncluster_prefix_len = 28\n"
            )),
            1 => Just("[encap]\nsource = \"10.0.0.1\"\n".to_string()),
            1 => Just("[forwarder]\nthreads = 1\n".to_string()),
            1 => Just("[fleet]\npeers = [\"10.0.0.1\"]\n".to_string()),
            1 => prop::sample::select(vec![
                "pools = []\n",
                "vips = [{ name = \"x\", address = \"198.18.0.9\", pool = \"p0\" }]\n",
                "[[\"pools\"]]\nname = \"q\"\n",
                "[pools.extra]\n",
                "[vips.health]\n",
                "x = \"\"\"\n[[pools]]\n\"\"\"\n",
                "  [1, 2],\n",
                "name = \"dup\"\n",
                "# [[pools]]\n",
                "[[pools]] # only a header\n",
                "\n",
            ])
            .prop_map(str::to_string),
        ]
    }

    fn file() -> impl Strategy<Value = String> {
        (prop::collection::vec(piece(), 0..12), any::<bool>()).prop_map(|(p, crlf)| {
            let t = p.concat();
            if crlf {
                t.replace('\n', "\r\n")
            } else {
                t
            }
        })
    }

    proptest! {
        /// Whenever the pieces give a configuration, parsing the whole
        /// text gives the same one, fresh and through a cache that last
        /// held another file (a reload).
        #[test]
        fn pieces_agree_with_the_whole_text(a in file(), b in file()) {
            let mut cache = ParseCache::new();
            for text in [&a, &b, &a] {
                let whole = toml::from_str::<Config>(text).ok();
                if let Some(cfg) = cache.parse(text) {
                    prop_assert_eq!(Some(cfg), whole, "{}", text);
                    prop_assert!(!cache.last().whole);
                } else {
                    prop_assert!(cache.last().whole);
                }
            }
        }
    }

    #[test]
    fn a_reload_parses_only_the_changed_element() {
        let mut text = String::from("[encap]\nsource = \"10.0.0.1\"\n\n");
        for i in 0..300 {
            text += &format!(
                "[[pools]]\nname = \"p{i}\"\nbackends = [{{ address = \"10.1.{}.{}\" }}]\n\n",
                i / 200,
                i % 200 + 1
            );
        }
        for i in 0..300 {
            text += &format!(
                "[[vips]]\nname = \"v{i}\"\naddress = \"198.18.{}.{}\"\nport = 80\nprotocol = \"tcp\"\npool = \"p{i}\"\n\n",
                i / 200,
                i % 200 + 1
            );
        }
        let mut cache = ParseCache::new();
        let first = Config::parse_with(&text, "t", &mut cache).unwrap();
        assert_eq!(
            cache.last(),
            ChunkStats {
                chunks: 600,
                parsed: 600,
                whole: false
            }
        );
        assert_eq!(first, Config::from_toml(&text, "t").unwrap());
        let changed = text.replace("\"10.1.0.77\"", "\"10.9.9.9\"");
        let second = Config::parse_with(&changed, "t", &mut cache).unwrap();
        assert_eq!(
            cache.last(),
            ChunkStats {
                chunks: 600,
                parsed: 1,
                whole: false
            }
        );
        assert_eq!(second, Config::from_toml(&changed, "t").unwrap());
        assert_ne!(first, second);
        // An error in one element is reported as the whole parse reports
        // it, line included.
        let broken = changed.replace("name = \"p150\"", "name = 150");
        let e = Config::parse_with(&broken, "t", &mut cache).unwrap_err();
        assert!(cache.last().whole);
        assert_eq!(
            e.to_string(),
            Config::from_toml(&broken, "t").unwrap_err().to_string()
        );
        assert!(e.key.starts_with("line "), "{e}");
        // The pieces of the last good text were kept through the error.
        assert_eq!(Config::parse_with(&text, "t", &mut cache).unwrap(), first);
        assert_eq!(cache.last().parsed, 1);
    }
}
