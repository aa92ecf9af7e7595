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

/// Validation and flattening of deep and wide include graphs, end to end:
/// in time linear in the graph, and on a small stack.
#[cfg(test)]
mod walk_tests {
    use crate::config::tests::{err, ip};
    use crate::config::{Config, MAX_RESOLVED};

    /// Runs `f` on a thread with a 256 KiB stack: validation must not need
    /// more, whatever the configuration's depth.
    fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    /// Pools `p0` including `p1` ... including `p{n-1}`, which has the one
    /// backend; a VIP over `p0`.
    fn chain(n: usize) -> String {
        let mut t = String::from("[encap]\nsource = \"10.0.0.1\"\n");
        for i in 0..n {
            t += &format!("[[pools]]\nname = \"p{i}\"\n");
            if i + 1 < n {
                t += &format!("include = [\"p{}\"]\n", i + 1);
            } else {
                t += "backends = [{ address = \"10.1.0.1\" }]\n";
            }
        }
        t + "[[vips]]\nname = \"v\"\naddress = \"192.0.2.80\"\nprotocol = \"tcp\"\npool = \"p0\"\n"
    }

    /// Pools including each other 6,000 levels deep once overflowed the
    /// stack of the thread that validated them (the daemon died on a
    /// reload). The walks keep their path on the heap, and a chain deeper
    /// than 64 levels is an error naming it.
    #[test]
    fn deep_includes_are_an_error_not_a_stack_overflow() {
        let e = on_small_stack(|| Config::parse(&chain(6000), "t").unwrap_err());
        assert_eq!(e.key, "pools[0].include", "{e}");
        assert!(
            e.problem.contains("more than 64 levels") && e.problem.contains("p0 -> p1"),
            "{e}"
        );
        // 64 levels (65 pools) is the most.
        let c = on_small_stack(|| Config::parse(&chain(65), "t").unwrap());
        assert_eq!(c.flatten("p0").unwrap().len(), 1);
        let e = err(&chain(66));
        assert!(e.problem.contains("(65 levels)"), "{e}");
        // A chain met through a pool walked before is measured too.
        let text = chain(66).replace(
            "[[pools]]\nname = \"p0\"\n",
            "[[pools]]\nname = \"top\"\ninclude = [\"p2\"]\n[[pools]]\nname = \"p0\"\n",
        );
        let e = err(&text);
        assert!(e.problem.contains("64 levels"), "{e}");
        // Hand-built, unvalidated: flattening a deep chain walks it
        // without recursion.
        let deep = on_small_stack(|| {
            let mut c = Config::from_toml(&chain(20_000), "t").unwrap();
            c.pools.reverse();
            c.flatten("p0").unwrap().len()
        });
        assert_eq!(deep, 1);
    }

    /// Pools in `levels` levels of two, each including both of the next
    /// level: 2^levels paths from the top, 2 x levels pools.
    fn diamond(levels: usize) -> String {
        let mut t = String::from("[encap]\nsource = \"10.0.0.1\"\n");
        for l in 0..levels {
            for side in ["a", "b"] {
                t += &format!("[[pools]]\nname = \"l{l}{side}\"\n");
                if l + 1 < levels {
                    t += &format!("include = [\"l{n}a\", \"l{n}b\"]\n", n = l + 1);
                }
                t += &format!(
                    "backends = [{{ address = \"10.1.{l}.{}\" }}]\n",
                    if side == "a" { 1 } else { 2 }
                );
            }
        }
        t + "[[vips]]\nname = \"v\"\naddress = \"192.0.2.80\"\nprotocol = \"tcp\"\npool = \"l0a\"\n\
             [[pools]]\nname = \"h\"\ninclude = [\"l0a\"]\nhealth = { kind = \"tcp\", port = 80, via = \"tunnel\" }\n\
             [[vips]]\nname = \"w\"\naddress = \"192.0.2.81\"\nprotocol = \"tcp\"\npool = \"h\"\n"
    }

    /// 80 pools including each other as a diamond once made validation
    /// walk 2^levels paths (check-config never ended; a reload froze the
    /// control plane). Each walk enters a pool once.
    #[test]
    fn diamonds_are_walked_in_linear_time() {
        let started = std::time::Instant::now();
        let c = on_small_stack(|| Config::parse(&diamond(60), "t").unwrap());
        assert_eq!(c.flatten("l0a").unwrap().len(), 119);
        assert_eq!(c.tunnel_vip("l59b"), Some(ip("192.0.2.80")));
        let index = c.pool_index();
        assert_eq!(c.members_as_written(&index, "l1b").unwrap().len(), 117);
        let e = on_small_stack(|| Config::parse(&diamond(80), "t").unwrap_err());
        assert!(e.problem.contains("64 levels"), "{e}");
        // Unvalidated, 200 levels: 2^200 paths, 400 pools.
        let big = on_small_stack(|| {
            let c = Config::from_toml(&diamond(200), "t").unwrap();
            (c.flatten("l0a").unwrap().len(), c.tunnel_vip("l199a"))
        });
        assert_eq!(big, (399, Some(ip("192.0.2.80"))));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        // Many pools sharing one large pool resolve to pools x backends:
        // bounded, and the bound is an error naming the pool where it ran out.
        let mut wide = String::from(
            "[encap]\nsource = \"10.0.0.1\"\n[[pools]]\nname = \"big\"\nbackends = [\n",
        );
        for b in 0..4000 {
            wide += &format!("{{ address = \"10.1.{}.{}\" }},\n", b / 250, b % 250 + 1);
        }
        wide += "]\n";
        for p in 0..600 {
            wide += &format!("[[pools]]\nname = \"w{p}\"\ninclude = [\"big\"]\n");
        }
        let started = std::time::Instant::now();
        let e = on_small_stack(move || Config::parse(&wide, "t").unwrap_err());
        assert!(
            e.key.starts_with("pools[") && e.problem.contains(&MAX_RESOLVED.to_string()),
            "{e}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // A cycle is still named from the pool it comes back to.
        let cyclic = diamond(5).replace(
            "[[pools]]\nname = \"l4b\"\n",
            "[[pools]]\nname = \"l4b\"\ninclude = [\"l2a\"]\n",
        );
        let e = err(&cyclic);
        assert!(
            e.key == "pools[4].include" && e.problem.contains("l2a -> l3a -> l4b -> l2a"),
            "{e}"
        );
    }
}
