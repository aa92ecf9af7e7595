//! How one configuration file is laid out as etcd keys.
//!
//! The file is cut along its top-level items, each piece being the same
//! TOML the file form uses (comments kept), under keys relative to the
//! fleet's prefix:
//!
//! | key                               | holds                                   |
//! |-----------------------------------|-----------------------------------------|
//! | `config/root`                     | top-level `key = value` lines, if any   |
//! | `config/section/<name>`           | one `[name]` table (`[forwarder]`, ...)  |
//! | `config/pool/<name>`              | one `[[pools]]` element                 |
//! | `config/vip/<name>`               | one `[[vips]]` element                  |
//! | `config/quic_lb/<codepoint>`      | one `[[quic_lb]]` element               |
//! | `config/<array>/<name or #index>` | any other array-of-tables element       |
//! | `config/order`                    | the keys above, one a line, file order  |
//!
//! The order key is what makes [`join`] give back the file's order (VIPs
//! and pools are lists: their order is part of the configuration) while
//! each element keeps a key of its own, so that a push that changes one
//! backend rewrites one pool's key and the order key stays as it was.
//! Every piece begins with its own table header, so the pieces can be
//! concatenated in any order the order key names without one piece's
//! lines falling into another's table. A name is written into a key with
//! `%`, `/` and control characters percent-encoded.

use std::collections::{BTreeMap, HashSet};

use toml_edit::{ArrayOfTables, DocumentMut, Item, Table, Value};

/// The directory of configuration keys under a fleet's prefix.
pub const CONFIG_DIR: &str = "config/";
/// The key listing the pieces in the file's order.
pub const ORDER_KEY: &str = "config/order";
/// The key of the top-level `key = value` lines.
pub const ROOT_KEY: &str = "config/root";

/// What can be wrong with a file being split or keys being joined.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The text is not TOML.
    #[error("not TOML: {0}")]
    Toml(#[from] toml_edit::TomlError),
    /// The text is not TOML (read for its top-level names).
    #[error("not TOML: {0}")]
    Parse(#[source] toml::de::Error),
    /// Two elements would share one key (two pools of one name).
    #[error("two elements would both be stored under {0:?}: names must be unique")]
    Duplicate(String),
    /// The order key names a key that is not there.
    #[error("{ORDER_KEY} names {0:?}, which is not stored (a write that did not go through `config push`?)")]
    Missing(String),
    /// A configuration key that the order key does not name.
    #[error("{0:?} is stored but not named in {ORDER_KEY} (a write that did not go through `config push`?)")]
    Unlisted(String),
    /// Names that both the machine's file and the fleet's configuration
    /// hold ([`crate::merge`]).
    #[error("both the local file and the fleet's configuration in etcd hold {0:?}: each top-level name belongs to one of them")]
    Overlap(Vec<String>),
    /// Configuration keys without an order key.
    #[error("configuration keys are stored but {ORDER_KEY} is missing")]
    NoOrder,
}

/// The key piece of a name: `%`, `/` and control characters as `%XX`.
pub fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c == '%' || c == '/' || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The key of the `index`th element of the array of tables `array`.
fn element_key(array: &str, table: &Table, index: usize) -> String {
    let name = |field: &str| -> Option<String> {
        match table.get(field)?.as_value()? {
            Value::String(s) => Some(s.value().clone()),
            Value::Integer(i) => Some(i.value().to_string()),
            _ => None,
        }
    };
    let (dir, id) = match array {
        "pools" => ("pool", name("name")),
        "vips" => ("vip", name("name")),
        "quic_lb" => ("quic_lb", name("codepoint")),
        other => (other, name("name")),
    };
    match id {
        Some(id) => format!("{CONFIG_DIR}{}/{}", encode_name(dir), encode_name(&id)),
        None => format!("{CONFIG_DIR}{}/#{index}", encode_name(dir)),
    }
}

/// A section as a standard table with a header of its own (not dotted
/// keys at the top, not implicit).
fn standalone(mut table: Table) -> Table {
    table.set_dotted(false);
    table.set_implicit(false);
    table
}

/// One piece: a document holding `item` under `key`.
fn piece(key: &str, item: Item) -> String {
    let mut doc = DocumentMut::new();
    doc.insert(key, item);
    doc.to_string()
}

/// Cuts a configuration's text into `(key, value)` pairs, keys relative
/// to the fleet's prefix, the order key last. Only the TOML syntax is
/// read here: whether the configuration is valid is
/// [`lb::config::Config::parse`]'s question, asked before a push.
pub fn split(text: &str) -> Result<Vec<(String, String)>, LayoutError> {
    let doc: DocumentMut = text.parse()?;
    let mut root = DocumentMut::new();
    let mut pieces: Vec<(String, String)> = Vec::new();
    for (key, item) in doc.as_table().iter() {
        match item {
            Item::None => {}
            Item::Table(t) => pieces.push((
                format!("{CONFIG_DIR}section/{}", encode_name(key)),
                piece(key, Item::Table(standalone(t.clone()))),
            )),
            Item::Value(Value::InlineTable(t)) => pieces.push((
                format!("{CONFIG_DIR}section/{}", encode_name(key)),
                piece(key, Item::Table(standalone(t.clone().into_table()))),
            )),
            Item::ArrayOfTables(a) => {
                for (i, t) in a.iter().enumerate() {
                    pieces.push(one_element(key, t.clone(), i));
                }
            }
            Item::Value(Value::Array(a))
                if !a.is_empty() && a.iter().all(|v| v.as_inline_table().is_some()) =>
            {
                for (i, v) in a.iter().enumerate() {
                    if let Some(t) = v.as_inline_table() {
                        pieces.push(one_element(key, t.clone().into_table(), i));
                    }
                }
            }
            Item::Value(v) => {
                root.insert(key, Item::Value(v.clone()));
            }
        }
    }
    let mut out = Vec::with_capacity(pieces.len() + 2);
    if !root.as_table().is_empty() {
        out.push((ROOT_KEY.to_string(), root.to_string()));
    }
    out.extend(pieces);
    let mut seen = HashSet::new();
    for (k, _) in &out {
        if !seen.insert(k.as_str()) {
            return Err(LayoutError::Duplicate(k.clone()));
        }
    }
    let order: String = out.iter().map(|(k, _)| format!("{k}\n")).collect();
    out.push((ORDER_KEY.to_string(), order));
    Ok(out)
}

fn one_element(array: &str, table: Table, index: usize) -> (String, String) {
    let key = element_key(array, &table, index);
    let mut aot = ArrayOfTables::new();
    aot.push(standalone(table));
    (key, piece(array, Item::ArrayOfTables(aot)))
}

/// Puts the pieces back together in the order the order key names:
/// `keys` are relative to the prefix (other keys than `config/...` are
/// ignored). Every configuration key must be named by the order key and
/// every name must be there: a prefix written behind `config push`'s back
/// is refused whole rather than read in part. No keys at all is the empty
/// configuration.
pub fn join<'a>(keys: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<String, LayoutError> {
    let mut pieces: BTreeMap<&str, &str> = BTreeMap::new();
    let mut order = None;
    for (k, v) in keys {
        if k == ORDER_KEY {
            order = Some(v);
        } else if k.starts_with(CONFIG_DIR) {
            pieces.insert(k, v);
        }
    }
    let Some(order) = order else {
        return if pieces.is_empty() {
            Ok(String::new())
        } else {
            Err(LayoutError::NoOrder)
        };
    };
    let mut text = String::new();
    let mut used = HashSet::new();
    for name in order.lines().filter(|l| !l.is_empty()) {
        let Some(value) = pieces.get(name) else {
            return Err(LayoutError::Missing(name.to_string()));
        };
        if !used.insert(name) {
            return Err(LayoutError::Duplicate(name.to_string()));
        }
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(value);
    }
    if let Some(extra) = pieces.keys().find(|k| !used.contains(*k)) {
        return Err(LayoutError::Unlisted(extra.to_string()));
    }
    Ok(text)
}

/// The top-level names of a TOML text read from its lines alone (table
/// headers, and `key = value` lines before the first one), or `None` when
/// the text is not plain enough for that to be certain (multi-line
/// strings, quoted or odd keys, a value continued over lines before the
/// first header): then the text is parsed. A 1,000-VIP fleet's apply
/// spent three quarters of its time parsing 3.3 MB for these names.
pub fn top_level_names_by_lines(text: &str) -> Option<Vec<String>> {
    if text.contains("\"\"\"") || text.contains("'''") {
        return None;
    }
    let bare = |k: &str| {
        let k = k.trim();
        (!k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .then(|| k.to_string())
    };
    let mut names: Vec<String> = Vec::new();
    let mut root = true;
    for line in text.lines() {
        let l = line.trim_start();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let name = if let Some(header) = l.strip_prefix('[') {
            root = false;
            let header = header.strip_prefix('[').unwrap_or(header);
            let key = &header[..header.find(']')?];
            bare(key.split('.').next()?)?
        } else if root {
            let key = &l[..l.find('=')?];
            bare(key.split('.').next()?)?
        } else {
            continue;
        };
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Some(names)
}

/// A machine's own part (`local`: its `[api]`, `[encap]`, `[bgp]`,
/// `[fleet]`, ... as a file) and the fleet's part (from etcd) as one
/// configuration text. A top-level name is either the machine's or the
/// fleet's, never both: a local `[[pools]]` beside the fleet's would make
/// this machine's tables differ from the fleet's, and a section in both
/// would leave it unclear which one runs. Refused with the names.
pub fn merge(local: &str, fleet: &str) -> Result<String, LayoutError> {
    let names = |text: &str| -> Result<Vec<String>, LayoutError> {
        match top_level_names_by_lines(text) {
            Some(n) => Ok(n),
            None => {
                let table: toml::Table = text.parse().map_err(LayoutError::Parse)?;
                Ok(table.keys().cloned().collect())
            }
        }
    };
    let fleet_names = names(fleet)?;
    let both: Vec<String> = names(local)?
        .into_iter()
        .filter(|n| fleet_names.contains(n))
        .collect();
    if !both.is_empty() {
        return Err(LayoutError::Overlap(both));
    }
    let mut text = String::with_capacity(local.len() + fleet.len() + 1);
    text.push_str(local);
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(fleet);
    Ok(text)
}

/// How a file differs from what is stored, key by key (keys relative to
/// the prefix).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Diff {
    /// Keys the file adds.
    pub added: Vec<String>,
    /// Keys whose value the file changes.
    pub changed: Vec<String>,
    /// Keys the file no longer has.
    pub removed: Vec<String>,
}

impl Diff {
    /// Nothing differs.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

/// The key-by-key difference from `old` (stored) to `new` (a file split).
pub fn diff(old: &[(String, String)], new: &[(String, String)]) -> Diff {
    let old_map: std::collections::HashMap<&str, &str> =
        old.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let new_keys: std::collections::HashSet<&str> = new.iter().map(|(k, _)| k.as_str()).collect();
    let mut d = Diff::default();
    for (k, v) in new {
        match old_map.get(k.as_str()) {
            None => d.added.push(k.clone()),
            Some(o) if o != v => d.changed.push(k.clone()),
            Some(_) => {}
        }
    }
    for (k, _) in old {
        if !new_keys.contains(k.as_str()) {
            d.removed.push(k.clone());
        }
    }
    d
}
