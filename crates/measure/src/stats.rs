//! Small statistics helpers: the workspace's one median (and its upper
//! variant for figures that must stay one of the samples), and timing by
//! medians.

use std::cmp::Ordering;
use std::time::Instant;

/// A sample with a total order, so that sorting never depends on how a
/// comparison treats odd values: integers by value, floats by
/// [`f64::total_cmp`] (NaN after every number).
pub trait Sample: Copy {
    /// How `self` orders against `other`.
    fn order(&self, other: &Self) -> Ordering;
}

macro_rules! sample_by_ord {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            fn order(&self, other: &Self) -> Ordering {
                self.cmp(other)
            }
        }
    )*};
}
sample_by_ord!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);

impl Sample for f64 {
    fn order(&self, other: &Self) -> Ordering {
        self.total_cmp(other)
    }
}

impl Sample for f32 {
    fn order(&self, other: &Self) -> Ordering {
        self.total_cmp(other)
    }
}

/// Median of `xs` (sorts in place): the middle value, or the mean of the two
/// middle values for an even count; `NaN` for an empty slice.
pub fn median(xs: &mut [f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(Sample::order);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// Upper median of `xs` (sorts in place): the middle value, and for an even
/// count the larger of the two middle values, so the figure is always one of
/// the samples (an integer count stays an integer, of any [`Sample`] type);
/// `None` for an empty slice. For figures reported this way from the start
/// (the soak's start/middle/end, the switch benchmark's per-second rates);
/// [`median`] averages the two middle values instead.
pub fn upper_median<T: Sample>(xs: &mut [T]) -> Option<T> {
    xs.sort_by(Sample::order);
    xs.get(xs.len() / 2).copied()
}

/// Runs `f` `reps` times (at least once) and returns the median wall time of
/// one run, in seconds. Medians, not means: a shared machine's hiccups land
/// in the tail.
pub fn time_median(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut samples: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    median(&mut samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
        let mut n = 0;
        let t = time_median(5, || n += 1);
        assert_eq!(n, 5);
        assert!(t >= 0.0);
    }

    #[test]
    fn upper_medians_are_samples() {
        assert_eq!(upper_median(&mut [3u64, 1, 2]), Some(2));
        // Even count: the larger middle value, not their mean.
        assert_eq!(upper_median(&mut [4u64, 1, 2, 3]), Some(3));
        assert_eq!(upper_median(&mut [4.0, 1.0, 2.0, 3.0]), Some(3.0));
        assert_eq!(upper_median::<u64>(&mut []), None);
        assert_eq!(upper_median::<f64>(&mut []), None);
        // NaN sorts last instead of scrambling the order.
        assert_eq!(upper_median(&mut [f64::NAN, 1.0, 2.0]), Some(2.0));
    }
}
