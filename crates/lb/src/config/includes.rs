//! Pools that include pools: the include graph's checks and the walk that
//! resolves a pool into its backends.
//!
//! Every walk here keeps its path on an explicit stack (a configuration's
//! depth never becomes the thread's) and enters each pool once (a diamond of
//! pools including each other costs its size, not 2^levels). The graph
//! check goes over all pools at once, linear in pools and includes; it names
//! a cycle from the pool it returns to, and a chain deeper than
//! [`MAX_INCLUDE_DEPTH`] from its top.

use std::collections::HashMap;
use std::net::IpAddr;

use rustc_hash::{FxHashMap, FxHashSet};

use super::{BackendConf, BackendKey, IncludeCycle, PoolConf, Problem};

/// The deepest include chain: a pool including a pool including a pool...
/// at most this many times. Hierarchies written by people are a few levels
/// deep; the bound keeps every path a walk holds short and turns a
/// generator's runaway output into an error that names it.
pub const MAX_INCLUDE_DEPTH: usize = 64;

/// The work of resolving every pool that includes others into its
/// backends, counted as pools entered plus backends met, summed over those
/// pools: 2,097,152 (1,000 pools each reaching 1,000 backends is half of
/// it; resolving it all takes about a second on one core). Validation
/// does this work once, and the tables hold what it finds, so the bound
/// caps both; past it, share fewer pools through `include`.
pub const MAX_RESOLVED: usize = 1 << 21;

/// Why a walk stopped.
pub(super) enum WalkError {
    /// The pools include each other in a cycle.
    Cycle(IncludeCycle),
    /// The walk met more pools and backends than it was allowed.
    Budget,
}

/// A pool's `drained` list, for constant-time membership: by name, and by
/// address for entries that parse as one (as [`BackendConf::is_named`]).
struct Drained<'a> {
    names: FxHashSet<&'a str>,
    addrs: FxHashSet<IpAddr>,
}

impl<'a> Drained<'a> {
    fn of(p: &'a PoolConf) -> Option<Drained<'a>> {
        if p.drained.is_empty() {
            return None;
        }
        Some(Drained {
            names: p.drained.iter().map(String::as_str).collect(),
            addrs: p.drained.iter().filter_map(|d| d.parse().ok()).collect(),
        })
    }

    fn holds(&self, b: &BackendConf) -> bool {
        b.name.as_deref().is_some_and(|n| self.names.contains(n)) || self.addrs.contains(&b.address)
    }
}

/// Calls `each` with every backend `pool` reaches, each once by name (the
/// first occurrence wins, depth first in include order), and whether the
/// pool that lists it drains it. Each pool is entered once: a pool met
/// again was walked whole already (an include graph without cycles
/// finishes a pool before meeting it again), so nothing it reaches would be
/// new. Pools that do not exist are skipped (validation reports them).
/// `budget` bounds the pools entered plus the backends met; returns what
/// was spent.
pub(super) fn walk<'a>(
    index: &HashMap<&str, &'a PoolConf>,
    pool: &str,
    budget: usize,
    each: &mut dyn FnMut(&'a BackendConf, bool),
) -> Result<usize, WalkError> {
    let Some(&first) = index.get(pool) else {
        return Ok(0);
    };
    // false: on the current path; true: walked whole.
    let mut state: FxHashMap<&'a str, bool> = FxHashMap::default();
    let mut seen: FxHashSet<BackendKey<'a>> = FxHashSet::default();
    let mut stack: Vec<(&'a PoolConf, usize)> = Vec::new();
    let mut spent = 0usize;
    let mut enter = |p: &'a PoolConf,
                     stack: &mut Vec<(&'a PoolConf, usize)>,
                     state: &mut FxHashMap<&'a str, bool>|
     -> Result<(), WalkError> {
        spent += 1 + p.backends.len();
        if spent > budget {
            return Err(WalkError::Budget);
        }
        state.insert(p.name.as_str(), false);
        let drained = Drained::of(p);
        for b in &p.backends {
            if seen.insert(BackendKey::of(b)) {
                each(b, drained.as_ref().is_some_and(|d| d.holds(b)));
            }
        }
        stack.push((p, 0));
        Ok(())
    };
    enter(first, &mut stack, &mut state)?;
    while let Some(top) = stack.last_mut() {
        let (p, k) = *top;
        let Some(inc) = p.include.get(k) else {
            state.insert(p.name.as_str(), true);
            stack.pop();
            continue;
        };
        top.1 += 1;
        let Some(&q) = index.get(inc.as_str()) else {
            continue;
        };
        match state.get(q.name.as_str()) {
            Some(true) => {}
            Some(false) => {
                let from = stack
                    .iter()
                    .position(|(s, _)| s.name == q.name)
                    .unwrap_or(0);
                return Err(WalkError::Cycle(cycle(&stack[from..], &q.name)));
            }
            None => enter(q, &mut stack, &mut state)?,
        }
    }
    Ok(spent)
}

/// `a -> b -> a` from the path `a, b` and the pool that closes it.
fn cycle(path: &[(&PoolConf, usize)], back_to: &str) -> IncludeCycle {
    let mut names: Vec<&str> = path.iter().map(|(p, _)| p.name.as_str()).collect();
    names.push(back_to);
    IncludeCycle(names.join(" -> "))
}

/// A chain of pool names for a message: all of a short one, the ends of a
/// long one with the number of levels.
fn chain(names: &[&str]) -> String {
    const ENDS: usize = 4;
    if names.len() <= 2 * ENDS + 1 {
        return names.join(" -> ");
    }
    format!(
        "{} -> ... -> {} ({} levels)",
        names[..ENDS].join(" -> "),
        names[names.len() - ENDS..].join(" -> "),
        names.len() - 1
    )
}

/// The include graph over all pools, in one pass: no cycle, no chain deeper
/// than [`MAX_INCLUDE_DEPTH`]. `pools` are the configuration's pools, whose
/// names are unique and whose includes all name one of them (checked
/// before); `pos` gives a pool's position by name.
pub(super) fn check_graph(pools: &[PoolConf], pos: &HashMap<&str, usize>) -> Result<(), Problem> {
    const NEW: u8 = 0;
    const ON_PATH: u8 = 1;
    const DONE: u8 = 2;
    let n = pools.len();
    let mut state = vec![NEW; n];
    // Of a finished pool: the longest chain of includes below it, and the
    // include that starts it (to name the chain).
    let mut height = vec![0usize; n];
    let mut deepest = vec![usize::MAX; n];
    let mut stack: Vec<(usize, usize)> = Vec::new();
    let names = |path: &[(usize, usize)]| -> Vec<&str> {
        path.iter().map(|&(p, _)| pools[p].name.as_str()).collect()
    };
    let too_deep = |root: usize, mut names: Vec<&str>| Problem {
        key: format!("pools[{root}].include"),
        problem: {
            names.truncate(names.len().min(MAX_INCLUDE_DEPTH + 2));
            format!(
                "pool {:?} includes pools more than {MAX_INCLUDE_DEPTH} levels deep: {}; \
                 at most {MAX_INCLUDE_DEPTH} levels are allowed",
                pools[root].name,
                chain(&names)
            )
        },
    };
    for root in 0..n {
        if state[root] != NEW {
            continue;
        }
        state[root] = ON_PATH;
        stack.push((root, 0));
        while let Some(top) = stack.last_mut() {
            let (p, k) = *top;
            let Some(inc) = pools[p].include.get(k) else {
                state[p] = DONE;
                stack.pop();
                if let Some(&(parent, _)) = stack.last() {
                    if height[p] + 1 > height[parent] {
                        height[parent] = height[p] + 1;
                        deepest[parent] = p;
                    }
                }
                continue;
            };
            top.1 += 1;
            let Some(&c) = pos.get(inc.as_str()) else {
                continue; // reported before this check runs
            };
            // Include edges from the root down to `p`.
            let depth = stack.len() - 1;
            match state[c] {
                NEW => {
                    if depth + 1 > MAX_INCLUDE_DEPTH {
                        let mut path = names(&stack);
                        path.push(&pools[c].name);
                        return Err(too_deep(stack[0].0, path));
                    }
                    state[c] = ON_PATH;
                    stack.push((c, 0));
                }
                ON_PATH => {
                    let from = stack.iter().position(|&(s, _)| s == c).unwrap_or(0);
                    return Err(Problem {
                        key: format!("pools[{c}].include"),
                        problem: cycle_of(&names(&stack[from..]), &pools[c].name),
                    });
                }
                _ => {
                    if depth + 1 + height[c] > MAX_INCLUDE_DEPTH {
                        let mut path = names(&stack);
                        let mut q = c;
                        while q != usize::MAX && path.len() <= MAX_INCLUDE_DEPTH + 1 {
                            path.push(&pools[q].name);
                            q = deepest[q];
                        }
                        return Err(too_deep(stack[0].0, path));
                    }
                    if height[c] + 1 > height[p] {
                        height[p] = height[c] + 1;
                        deepest[p] = c;
                    }
                }
            }
        }
    }
    Ok(())
}

fn cycle_of(path: &[&str], back_to: &str) -> String {
    let mut names = path.to_vec();
    names.push(back_to);
    IncludeCycle(chain(&names)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_chains_are_named_by_their_ends() {
        assert_eq!(chain(&["a", "b", "a"]), "a -> b -> a");
        let names: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        assert_eq!(
            chain(&names),
            "p0 -> p1 -> p2 -> p3 -> ... -> p16 -> p17 -> p18 -> p19 (19 levels)"
        );
    }
}
