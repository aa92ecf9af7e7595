//! Maglev consistent hashing (Eisenbud et al., NSDI'16, section 3.4), plus
//! Karger-style ring hashing and rendezvous hashing for comparison.
//!
//! This crate is pure: no I/O, no threads, no global state. Everything a
//! load balancer needs to agree with its peers is a function of the backend
//! names, their weights and the table size `M`.
//!
//! # The algorithm
//!
//! Each backend gets a preference list over the `M` table slots, derived from
//! its name with two independent hash functions:
//!
//! ```text
//! offset = h1(name) mod M
//! skip   = h2(name) mod (M - 1) + 1
//! permutation[j] = (offset + j * skip) mod M
//! ```
//!
//! `M` must be prime so that every `skip` is coprime with it and each
//! preference list visits every slot. Backends then take turns claiming their
//! most preferred free slot (Pseudocode 1) until the table is full.
//!
//! # Weights
//!
//! The paper says weights change "the relative frequency of the backends'
//! turns" without saying how. Ours: every round, each backend `i` adds its
//! weight `w_i` to a credit; whenever the credit reaches the largest weight
//! `w_max`, the backend takes one turn (claims one slot) and the credit drops
//! by `w_max`. After `r` full rounds backend `i` has taken exactly
//! `floor(r * w_i / w_max)` turns, so its share tracks `w_i / W` (with
//! `W = sum of weights`). With equal weights every backend takes a turn every
//! round and the procedure *is* Pseudocode 1, entry for entry.
//!
//! The bound, proved in [`weighted_share_bound`]: if the table fills during
//! round `R`, backend `i` holds `e_i` slots with
//!
//! ```text
//! -2 < e_i - M * w_i / W < 2 * N * w_i / W
//! ```
//!
//! where `N` is the number of backends with non-zero weight. For equal
//! weights this is within ±2 of `M/N`, and the stronger floor/ceil property of
//! the paper holds (tested). Weight 0 means *drained*: the backend holds no
//! slots at all (existing connections are the connection tracker's business).
//!
//! # Agreement between load balancers
//!
//! Pseudocode 1 depends on the order in which backends take turns. Two load
//! balancers given the same backends in a different order must build the same
//! table, so [`Maglev::populate`] orders turns by backend name (names must be
//! unique). [`Maglev::populate_ordered`] keeps the caller's order, for callers
//! that supply permutations directly (the paper's Table 1).
//!
//! # Example
//!
//! ```
//! use maglev::{mix64, Backend, Maglev};
//!
//! let backends = [Backend::new("10.1.0.1:80"), Backend::weighted("10.1.0.2:80", 2)];
//! let mut table = Maglev::new(65_537)?;
//! table.populate(&backends)?;
//! // A flow's hash picks a slot; the slot names a backend by its index.
//! let backend = table.lookup(mix64(0xc633_6407_9c40)).expect("a backend has weight");
//! println!("flow -> {}", backends[backend as usize].name);
//! // The heavier backend holds two thirds of the slots, give or take two.
//! assert!(table.counts(2)[1].abs_diff(65_537 * 2 / 3) <= 2);
//! # Ok::<(), maglev::Error>(())
//! ```
//!
//! `cargo run -p maglev --example table` goes further: named backends with
//! weights, a drained one, lookups, and what removing a backend moves.

pub mod eval;
mod hash;
pub mod karger;
pub mod reference;
pub mod rendezvous;

pub use hash::{flow_slot, mix64, name_hash, HashKey};

/// The paper's default lookup table size ("small").
pub const DEFAULT_TABLE_SIZE: u32 = 65_537;
/// The paper's "large" lookup table size.
pub const LARGE_TABLE_SIZE: u32 = 655_373;

/// Marker for an unfilled slot (only seen when no backend has weight).
const EMPTY: u32 = u32::MAX;

/// Errors from building a Maglev table. Each names the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// M is 0 or 1.
    #[error("lookup table size M = {0} is too small: it must be a prime of at least 2 (the paper uses 65537)")]
    TooSmall(u64),
    /// M is too large for 32-bit slot arithmetic.
    #[error("lookup table size M = {0} is too large: it must be below 2^31 (the table alone would need 8 GiB)")]
    TooLarge(u64),
    /// M is not prime.
    #[error("lookup table size M = {m} is not prime (divisible by {divisor}); Maglev needs a prime M so every skip visits all slots; nearest primes: {below} and {above}")]
    NotPrime {
        /// The rejected size.
        m: u64,
        /// Its smallest divisor above 1.
        divisor: u64,
        /// The largest prime below `m`.
        below: u64,
        /// The smallest prime above `m`.
        above: u64,
    },
    /// More backends than table slots.
    #[error("{backends} backends cannot share a table of M = {m} slots; choose M well above the number of backends (the paper advises M > 100 x N)")]
    TooManyBackends {
        /// Number of backends offered.
        backends: usize,
        /// Table size.
        m: u32,
    },
    /// Two backends share a name (names seed the permutations).
    #[error(
        "backend name {0:?} appears more than once; names seed the permutations and must be unique"
    )]
    DuplicateName(String),
    /// A caller-supplied permutation is out of range.
    #[error("backend {index}: permutation (offset {offset}, skip {skip}) is invalid for M = {m}: need offset < M and 1 <= skip < M")]
    BadPermutation {
        /// Position of the backend in the caller's slice.
        index: usize,
        /// Offending offset.
        offset: u32,
        /// Offending skip.
        skip: u32,
        /// Table size.
        m: u32,
    },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Checks that `m` is a usable table size and returns it as `u32`.
pub fn check_table_size(m: u64) -> Result<u32> {
    if m < 2 {
        return Err(Error::TooSmall(m));
    }
    // Below 2^31 so that `slot + skip < 2M` never overflows a u32.
    if m >= 1 << 31 {
        return Err(Error::TooLarge(m));
    }
    if let Some(divisor) = smallest_divisor(m) {
        return Err(Error::NotPrime {
            m,
            divisor,
            below: (2..m).rev().find(|&x| is_prime(x)).unwrap_or(2),
            above: (m + 1..).find(|&x| is_prime(x)).unwrap_or(m),
        });
    }
    Ok(m as u32)
}

/// Smallest divisor of `n` above 1 and below `n`, if any (trial division by
/// 6k±1; `n < 2^32` so at most ~11k candidates).
fn smallest_divisor(n: u64) -> Option<u64> {
    if n < 4 {
        return None;
    }
    for p in [2, 3] {
        if n.is_multiple_of(p) {
            return Some(p);
        }
    }
    let mut d = 5;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return Some(d);
        }
        if n.is_multiple_of(d + 2) {
            return Some(d + 2);
        }
        d += 6;
    }
    None
}

/// Whether `n` is prime.
pub fn is_prime(n: u64) -> bool {
    n >= 2 && smallest_divisor(n).is_none()
}

/// A backend's preference list over the table, in the paper's compact form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Permutation {
    /// First preferred slot.
    pub offset: u32,
    /// Distance between consecutive preferred slots (coprime with M).
    pub skip: u32,
}

impl Permutation {
    /// The permutation of a backend named `name` for a table of `m` slots,
    /// with the two independent hash functions `h1`, `h2` of this crate.
    /// `m` must already have passed [`check_table_size`].
    pub fn from_name(name: &str, m: u32) -> Self {
        let h1 = name_hash(HashKey::Offset, name.as_bytes());
        let h2 = name_hash(HashKey::Skip, name.as_bytes());
        let m64 = u64::from(m);
        Permutation {
            offset: (h1 % m64) as u32,
            // m >= 2, so m - 1 >= 1 and the modulus is defined.
            skip: (h2 % (m64 - 1) + 1) as u32,
        }
    }

    /// The `j`-th preferred slot, computed as the paper writes it.
    pub fn nth(&self, j: u64, m: u32) -> u32 {
        ((u64::from(self.offset) + j * u64::from(self.skip)) % u64::from(m)) as u32
    }
}

/// A backend as the hashing sees it: a unique name and a weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// Unique name (seeds the permutation).
    pub name: String,
    /// Relative weight; 0 means drained.
    pub weight: u32,
}

impl Backend {
    /// A backend of weight 1.
    pub fn new(name: impl Into<String>) -> Self {
        Backend {
            name: name.into(),
            weight: 1,
        }
    }

    /// A backend with the given weight.
    pub fn weighted(name: impl Into<String>, weight: u32) -> Self {
        Backend {
            name: name.into(),
            weight,
        }
    }
}

/// One backend's turn state during population.
#[derive(Debug, Clone, Copy)]
struct Turn {
    /// The caller's index, stored in the table.
    id: u32,
    /// Next candidate slot (`offset + next * skip mod M`, kept incrementally).
    pos: u32,
    skip: u32,
    weight: u32,
    credit: u64,
}

impl Turn {
    /// This round's turn: adds the weight to the credit and says whether
    /// the backend claims a slot now (the credit reached `w_max`).
    #[inline(always)]
    fn due(&mut self, w_max: u64) -> bool {
        self.credit += u64::from(self.weight);
        if self.credit < w_max {
            return false;
        }
        self.credit -= w_max;
        true
    }

    /// Having claimed slot `c`, the next candidate is the one after it.
    #[inline(always)]
    fn advance_past(&mut self, c: u32, m: u32) {
        self.pos = step(c, self.skip, m);
    }
}

/// `c + skip mod m` for `c, skip < m < 2^31` (no overflow, no division).
#[inline(always)]
fn step(c: u32, skip: u32, m: u32) -> u32 {
    let x = c + skip;
    if x >= m {
        x - m
    } else {
        x
    }
}

/// A Maglev lookup table of `M` slots, each naming a backend by the index the
/// caller gave it. Regenerating reuses every buffer.
#[derive(Debug, Clone)]
pub struct Maglev {
    m: u32,
    entry: Vec<u32>,
    /// One bit per slot: set once the slot is claimed. The probe loop reads
    /// only this (M/8 bytes: 8 KiB for M = 65537, 80 KiB for 655373), which
    /// stays in cache where the 4-byte entries would not.
    filled: Vec<u64>,
    turns: Vec<Turn>,
    order: Vec<u32>,
    /// Free slots during the tail phase.
    free: Vec<u32>,
    /// Their ranks in the current backend's permutation.
    ranks: Vec<u32>,
    backends: usize,
}

impl Maglev {
    /// An empty table of `m` slots; `m` must be prime.
    pub fn new(m: u64) -> Result<Self> {
        let m = check_table_size(m)?;
        Ok(Maglev {
            m,
            entry: vec![EMPTY; m as usize],
            filled: vec![0; (m as usize).div_ceil(64)],
            turns: Vec::new(),
            order: Vec::new(),
            free: Vec::new(),
            ranks: Vec::new(),
            backends: 0,
        })
    }

    /// Table size M.
    pub fn size(&self) -> u32 {
        self.m
    }

    /// Number of backends the table was last populated with (including
    /// drained ones).
    pub fn backends(&self) -> usize {
        self.backends
    }

    /// The slots: backend index per slot, `None` only if every backend was
    /// drained.
    pub fn slot(&self, i: usize) -> Option<u32> {
        match self.entry.get(i) {
            Some(&e) if e != EMPTY => Some(e),
            _ => None,
        }
    }

    /// The raw slots (backend index, or `u32::MAX` for empty).
    pub fn entries(&self) -> &[u32] {
        &self.entry
    }

    /// Bytes this table holds on the heap: the slots (4 bytes each), the
    /// claimed-slot bitmap and the population scratch, by capacity.
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.entry.capacity() * size_of::<u32>()
            + self.filled.capacity() * size_of::<u64>()
            + self.turns.capacity() * size_of::<Turn>()
            + (self.order.capacity() + self.free.capacity() + self.ranks.capacity())
                * size_of::<u32>()
    }

    /// Populates from named backends, taking turns in name order so that any
    /// input order gives the same table. Slots name the index into
    /// `backends`.
    pub fn populate(&mut self, backends: &[Backend]) -> Result<()> {
        self.check_count(backends.len())?;
        self.order.clear();
        self.order.extend(0..backends.len() as u32);
        self.order
            .sort_unstable_by(|&a, &b| backends[a as usize].name.cmp(&backends[b as usize].name));
        if let Some(w) = self
            .order
            .windows(2)
            .find(|w| backends[w[0] as usize].name == backends[w[1] as usize].name)
        {
            return Err(Error::DuplicateName(backends[w[0] as usize].name.clone()));
        }
        let m = self.m;
        self.turns.clear();
        for &id in &self.order {
            let b = &backends[id as usize];
            let p = Permutation::from_name(&b.name, m);
            self.turns.push(Turn {
                id,
                pos: p.offset,
                skip: p.skip,
                weight: b.weight,
                credit: 0,
            });
        }
        self.backends = backends.len();
        self.fill();
        Ok(())
    }

    /// Populates from explicit permutations and weights, taking turns in the
    /// order given (Pseudocode 1 exactly when all weights are equal). Slots
    /// name the index into `backends`.
    pub fn populate_ordered(&mut self, backends: &[(Permutation, u32)]) -> Result<()> {
        self.check_count(backends.len())?;
        let m = self.m;
        self.turns.clear();
        for (index, &(p, weight)) in backends.iter().enumerate() {
            if p.offset >= m || p.skip == 0 || p.skip >= m {
                return Err(Error::BadPermutation {
                    index,
                    offset: p.offset,
                    skip: p.skip,
                    m,
                });
            }
            self.turns.push(Turn {
                id: index as u32,
                pos: p.offset,
                skip: p.skip,
                weight,
                credit: 0,
            });
        }
        self.backends = backends.len();
        self.fill();
        Ok(())
    }

    fn check_count(&self, n: usize) -> Result<()> {
        if n > self.m as usize || n >= EMPTY as usize {
            return Err(Error::TooManyBackends {
                backends: n,
                m: self.m,
            });
        }
        Ok(())
    }

    /// Pseudocode 1 with weighted turns (see the crate documentation).
    ///
    /// Two phases give the same table as the literal algorithm, faster:
    ///
    /// 1. Probing: a backend walks its permutation (kept as an incremental
    ///    position, no division) testing a bitmap of claimed slots.
    /// 2. The tail: once only `E <= sqrt(M)` slots are free, probing costs
    ///    about `M/E` steps per fill, and these last fills would take about
    ///    half of all probes. Every free slot has a rank at or after the
    ///    backend's position in its permutation (all earlier ranks were seen
    ///    claimed, and slots never free up), so the backend's choice is the
    ///    free slot of lowest rank, where the rank of slot `c` is
    ///    `(c - pos) * skip^-1 mod M`. That costs `E` steps per fill.
    fn fill(&mut self) {
        self.filled.fill(0);
        let w_max = self.turns.iter().map(|t| t.weight).max().unwrap_or(0);
        if w_max == 0 || self.turns.is_empty() {
            self.entry.fill(EMPTY);
            return; // nothing to serve: every backend drained (or none)
        }
        // Otherwise the two phases below write every slot: no need to
        // clear the entries first (a whole pass over 4M bytes).
        let m = self.m;
        // Probing costs ~M/E per fill and a rank ~1 per free slot, so the
        // crossover is near E = sqrt(M) (measured: 0.5x to 2x sqrt(M) within
        // noise of each other, 3x clearly worse).
        let tail_at = (f64::from(m).sqrt() as u32).clamp(1, m);
        // While more than a tenth of the table is free a probe usually ends
        // within two steps, and whether the first one does is a coin toss
        // the branch predictor loses; deciding it with a select instead
        // measured 25-30% faster there and slower beyond (the walk is long
        // and its exit is the only misprediction). Testing two or more
        // candidates per step, or two backends' walks interleaved, branch
        // free, measured 1.4-2.5x slower: the plain walk's next position
        // does not wait for the load, so it already runs ahead. Equal
        // weights skip the turn credits (every backend is due every
        // round): 4% in all.
        let select_until = (m / 10).max(tail_at);
        let mut p = Probe {
            m,
            w_max: u64::from(w_max),
            turns: &mut self.turns,
            filled: &mut self.filled,
            entry: &mut self.entry,
            n: 0,
            i: 0,
        };
        // Phase 1: probing, until only `tail_at` slots are free.
        if p.turns.iter().all(|t| t.weight == w_max) {
            p.until::<true, false>(select_until);
            p.until::<false, false>(tail_at);
        } else {
            p.until::<true, true>(select_until);
            p.until::<false, true>(tail_at);
        }
        let mut i = p.i;
        let (entry, filled, turns, free, ranks) = (
            &mut self.entry,
            &self.filled,
            &mut self.turns,
            &mut self.free,
            &mut self.ranks,
        );
        let k = turns.len();
        let w_max = u64::from(w_max);
        // Phase 2: the lowest-ranked free slot, continuing the same round.
        free.clear();
        // Word by word: a bit test per slot cost as much as all the ranks.
        for (w, &word) in (0u32..).zip(filled.iter()) {
            let mut f = !word;
            while f != 0 {
                let c = w * 64 + f.trailing_zeros();
                if c >= m {
                    break; // the last word's bits past M
                }
                free.push(c);
                f &= f - 1;
            }
        }
        while !free.is_empty() {
            let t = &mut turns[i];
            i += 1;
            if i == k {
                i = 0;
            }
            if !t.due(w_max) {
                continue;
            }
            // rank(c) = (c - pos) * inv mod M, by Shoup's multiplication
            // with a precomputed quotient: no division in the loop, so the
            // compiler can vectorize it. Ranks are distinct (the map is a
            // bijection), so the minimum names exactly one slot.
            let inv = mod_inverse(t.skip, m);
            let inv_q = ((u64::from(inv) << 32) / u64::from(m)) as u32;
            let pos = t.pos;
            ranks.clear();
            ranks.extend(free.iter().map(|&c| {
                let d = if c >= pos { c - pos } else { c + (m - pos) };
                let q = ((u64::from(d) * u64::from(inv_q)) >> 32) as u32;
                // d*inv - q*M lies in [0, 2M) (Shoup, valid for M < 2^31).
                let r = d.wrapping_mul(inv).wrapping_sub(q.wrapping_mul(m));
                if r >= m {
                    r - m
                } else {
                    r
                }
            }));
            let min = ranks.iter().copied().min().unwrap_or(0);
            let at = ranks.iter().position(|&r| r == min).unwrap_or(0);
            let c = free.swap_remove(at);
            entry[c as usize] = t.id;
            // Keep the position exact for anyone reading it later.
            t.advance_past(c, m);
        }
    }

    /// The backend for a flow hash, or `None` if every backend is drained.
    /// The slot is `hash * M / 2^64` (a multiply, not a division), which is
    /// uniform when the hash is.
    #[inline]
    pub fn lookup(&self, hash: u64) -> Option<u32> {
        let e = self.entry[flow_slot(hash, self.m)];
        (e != EMPTY).then_some(e)
    }

    /// Number of slots held by each of `n` backends (indices `0..n`).
    pub fn counts(&self, n: usize) -> Vec<u32> {
        eval::slot_counts(&self.entry, n)
    }
}

/// Phase 1 of [`Maglev::fill`]: the table being filled and whose turn it is.
struct Probe<'a> {
    m: u32,
    w_max: u64,
    turns: &'a mut [Turn],
    filled: &'a mut [u64],
    entry: &'a mut [u32],
    /// Slots claimed so far.
    n: u32,
    /// The turn due next.
    i: usize,
}

impl Probe<'_> {
    /// Takes turns until only `free` slots are free. `SELECT` decides the
    /// first step with a select; `WEIGHTED` keeps the turn credits (without
    /// it every backend is due every round, which is right only when all
    /// weights are equal).
    #[inline(always)]
    fn until<const SELECT: bool, const WEIGHTED: bool>(&mut self, free: u32) {
        let (m, w_max) = (self.m, self.w_max);
        let (mut n, mut i) = (self.n, self.i);
        let (turns, filled, entry) = (&mut *self.turns, &mut *self.filled, &mut *self.entry);
        let k = turns.len();
        let claimed = |filled: &[u64], c: u32| filled[(c >> 6) as usize] & (1 << (c & 63)) != 0;
        while m - n > free {
            let t = &mut turns[i];
            i += 1;
            if i == k {
                i = 0;
            }
            if WEIGHTED && !t.due(w_max) {
                continue;
            }
            // This backend's permutation visits every slot (skip is coprime
            // with the prime M) and a slot is free, so this ends.
            let mut c = t.pos;
            if SELECT {
                let next = step(c, t.skip, m);
                c = if claimed(filled, c) { next } else { c };
            }
            while claimed(filled, c) {
                c = step(c, t.skip, m);
            }
            filled[(c >> 6) as usize] |= 1 << (c & 63);
            entry[c as usize] = t.id;
            t.advance_past(c, m);
            n += 1;
        }
        (self.n, self.i) = (n, i);
    }
}

/// `a^-1 mod m` for prime `m` and `0 < a < m` (extended Euclid).
fn mod_inverse(a: u32, m: u32) -> u32 {
    let (mut r0, mut r1) = (i64::from(m), i64::from(a));
    let (mut t0, mut t1) = (0i64, 1i64);
    while r1 != 0 {
        let q = r0 / r1;
        (r0, r1) = (r1, r0 - q * r1);
        (t0, t1) = (t1, t0 - q * t1);
    }
    t0.rem_euclid(i64::from(m)) as u32
}

/// The bound on a weighted share, as documented in the crate root: returns
/// `(low, high)` such that `low < e_i - M * w_i / W < high` for a backend of
/// weight `w_i` among `active` backends with non-zero weight summing to `W`.
///
/// Proof sketch: with `R` the round in which the table fills and
/// `x = R / w_max`, backend `i` took `floor(R w_i / w_max) - l_i` turns where
/// `l_i` is 1 if it was due a turn in round `R` after the table filled.
/// So `e_i = x w_i - f_i - l_i` with `f_i` in `[0, 1)`. Summing over backends,
/// `M = x W - S` with `S = sum(f_i + l_i)` in `[0, 2 active)`, hence
/// `e_i - M w_i / W = S w_i / W - (f_i + l_i)`, which lies in
/// `(-2, 2 active w_i / W)`.
pub fn weighted_share_bound(w_i: u32, total_weight: u64, active: usize) -> (f64, f64) {
    (
        -2.0,
        2.0 * active as f64 * f64::from(w_i) / total_weight as f64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes_and_rejections() {
        assert!(is_prime(65_537) && is_prime(655_373) && is_prime(2) && is_prime(7));
        assert!(!is_prime(1) && !is_prime(65_536) && !is_prime(9));
        assert_eq!(check_table_size(0), Err(Error::TooSmall(0)));
        assert_eq!(check_table_size(1), Err(Error::TooSmall(1)));
        assert_eq!(check_table_size(1 << 32), Err(Error::TooLarge(1 << 32)));
        assert_eq!(
            check_table_size(4_294_967_291),
            Err(Error::TooLarge(4_294_967_291))
        );
        match check_table_size(65_536) {
            Err(Error::NotPrime {
                m,
                divisor,
                below,
                above,
            }) => {
                assert_eq!((m, divisor, below, above), (65_536, 2, 65_521, 65_537));
            }
            other => panic!("expected NotPrime, got {other:?}"),
        }
        let msg = Maglev::new(100).unwrap_err().to_string();
        assert!(msg.contains("100") && msg.contains("not prime"), "{msg}");
        // 2^31 - 1 is prime and the largest size accepted (no allocation here).
        assert_eq!(check_table_size(2_147_483_647), Ok(2_147_483_647));
    }

    #[test]
    fn inverses() {
        for m in [2u32, 7, 65_537, 655_373] {
            for a in [1u32, 2, 3, m / 2, m - 1] {
                if a == 0 || a >= m {
                    continue;
                }
                assert_eq!(
                    u64::from(a) * u64::from(mod_inverse(a, m)) % u64::from(m),
                    1,
                    "a={a} m={m}"
                );
            }
        }
    }

    #[test]
    fn skip_and_offset_in_range() {
        for m in [2u32, 3, 7, 65_537] {
            for i in 0..200 {
                let p = Permutation::from_name(&format!("backend-{i}"), m);
                assert!(p.offset < m);
                assert!(p.skip >= 1 && p.skip < m.max(2), "{p:?} for m={m}");
            }
        }
    }

    #[test]
    fn rejects_bad_input() {
        let mut t = Maglev::new(7).unwrap();
        let dup = [Backend::new("a"), Backend::new("b"), Backend::new("a")];
        assert_eq!(t.populate(&dup), Err(Error::DuplicateName("a".into())));
        let many: Vec<_> = (0..8).map(|i| Backend::new(format!("b{i}"))).collect();
        assert!(matches!(
            t.populate(&many),
            Err(Error::TooManyBackends { backends: 8, m: 7 })
        ));
        let bad = [(Permutation { offset: 7, skip: 1 }, 1)];
        assert!(matches!(
            t.populate_ordered(&bad),
            Err(Error::BadPermutation { index: 0, .. })
        ));
        let bad = [(Permutation { offset: 0, skip: 0 }, 1)];
        assert!(t.populate_ordered(&bad).is_err());
    }

    #[test]
    fn heap_bytes_counts_the_slots_and_the_bitmap() {
        let mut t = Maglev::new(65_537).unwrap();
        let empty = t.heap_bytes();
        assert!(empty >= 65_537 * 4 + 65_537 / 8, "{empty}");
        let b: Vec<_> = (0..100).map(|i| Backend::new(format!("b{i}"))).collect();
        t.populate(&b).unwrap();
        // The scratch of a population: turns, order, the tail's free slots.
        assert!(t.heap_bytes() > empty + 100 * 4);
        assert!(t.heap_bytes() < empty + 64 * 1024);
    }

    #[test]
    fn drained_and_empty() {
        let mut t = Maglev::new(13).unwrap();
        t.populate(&[]).unwrap();
        assert_eq!(t.lookup(12345), None);
        t.populate(&[Backend::weighted("a", 0), Backend::weighted("b", 0)])
            .unwrap();
        assert_eq!(t.lookup(12345), None);
        t.populate(&[Backend::weighted("a", 0), Backend::weighted("b", 3)])
            .unwrap();
        assert_eq!(t.counts(2), vec![0, 13]);
        assert!((0..1000u64).all(|h| t.lookup(h.wrapping_mul(0x9e37_79b9_7f4a_7c15)) == Some(1)));
    }
}
