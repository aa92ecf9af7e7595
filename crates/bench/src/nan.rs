//! Reading back figures that were not finite: serde_json writes NaN and the
//! infinities as `null` (JSON has no such numbers), so a saved report reads
//! them back as NaN rather than failing on the first one.

use serde::{Deserialize, Deserializer};

/// An `f64` that may be `null` in the document (NaN then).
pub fn f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Option::<f64>::deserialize(d).map(|x| x.unwrap_or(f64::NAN))
}

/// A list of `f64`s of which any may be `null` (NaN then).
pub fn vec<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    Vec::<Option<f64>>::deserialize(d)
        .map(|v| v.into_iter().map(|x| x.unwrap_or(f64::NAN)).collect())
}

/// `x` with `digits` decimals, or `-` when there is none or it is not
/// finite.
pub fn cell(x: Option<f64>, digits: usize) -> String {
    x.filter(|x| x.is_finite())
        .map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "-".into())
}
