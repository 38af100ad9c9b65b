//! Repeats of a cell and what they allow: the policies' run order rotated per repeat, ratios
//! paired by repeat (policy run r against least-request run r), their median and range, the
//! A/A noise floor from least-request's runs against each other, and the verdict on a ratio.
//!
//! Definitions (also stated in the reports):
//! - A/A ratios of a metric: least-request's value in repeat a over its value in repeat b, for
//!   every ordered pair of distinct valid repeats (a, b).
//! - Noise floor of a metric: the largest |A/A ratio − 1|; none with fewer than two valid runs.
//! - The noise band is multiplicative, [1/(1 + floor), 1 + floor]: as every ordered pair is in
//!   the A/A set, both a/b and b/a are, so the band is exactly the range of the A/A ratios. A
//!   policy's ratio whose median over repeats lies within it is "no difference".
//!
//! Everything here is pure; undefined values are `None`, never NaN.

use serde::{Deserialize, Serialize};

/// The policies' order in repeat `r`: `items` rotated left by `r` (repeat 0 keeps the order).
pub fn rotated<T: Clone>(items: &[T], r: usize) -> Vec<T> {
    if items.is_empty() {
        return Vec::new();
    }
    let k = r % items.len();
    items[k..].iter().chain(&items[..k]).cloned().collect()
}

/// Median and range of a set of values (ratios over repeats, A/A ratios, figures of runs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// The middle value (the mean of the two middle values for an even count).
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// How many finite values it summarises.
    pub n: usize,
}

impl Spread {
    /// The spread of `values` (NaN left out; ∞ kept: a ratio against nothing).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Spread {
        let mut v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => None,
            _ if n % 2 == 1 => Some(v[n / 2]),
            _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
        };
        Spread { median, min: v.first().copied(), max: v.last().copied(), n }
    }
}

/// `value / base` when both are known, finite, and the base is positive.
pub fn ratio(value: Option<f64>, base: Option<f64>) -> Option<f64> {
    let (v, b) = (value?, base?);
    let r = v / b;
    (b > 0.0 && r.is_finite()).then_some(r)
}

/// Ratios paired by repeat: for each repeat present in both (`(repeat, value)` lists), the
/// policy's value over the baseline's. Repeats missing on either side are skipped.
pub fn paired(policy: &[(usize, Option<f64>)], base: &[(usize, Option<f64>)]) -> Vec<f64> {
    policy
        .iter()
        .filter_map(|(r, v)| {
            let b = base.iter().find(|(rb, _)| rb == r)?.1;
            ratio(*v, b)
        })
        .collect()
}

/// A/A ratios: `values[a] / values[b]` for every ordered pair of distinct indices with both
/// values known (the baseline's runs against each other).
pub fn aa_ratios(values: &[Option<f64>]) -> Vec<f64> {
    let mut out = Vec::new();
    for (a, va) in values.iter().enumerate() {
        for (b, vb) in values.iter().enumerate() {
            if a != b {
                out.extend(ratio(*va, *vb));
            }
        }
    }
    out
}

/// The noise floor: the largest |A/A ratio − 1|; `None` without any A/A ratio (one run).
pub fn noise_floor(aa: &[f64]) -> Option<f64> {
    aa.iter().filter(|r| r.is_finite()).map(|r| (r - 1.0).abs()).reduce(f64::max)
}

/// What a ratio's median says against the noise floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RepeatVerdict {
    /// Better than the baseline beyond the noise floor.
    Better,
    /// Worse than the baseline beyond the noise floor.
    Worse,
    /// The median lies within the noise band [1/(1 + floor), 1 + floor].
    NoDifference,
    /// No ratio (no baseline, or nothing to divide by).
    Unknown,
}

/// The verdict on a median ratio: within the band `[1/(1 + floor), 1 + floor]` (inclusive) is
/// no difference; without a floor (one run), only exactly 1 is. Ratios are compared on a log
/// scale: 0.5x and 2x are equally far from 1. `lower_is_better` for times, not for rates.
pub fn verdict(median: Option<f64>, floor: Option<f64>, lower_is_better: bool) -> RepeatVerdict {
    let Some(m) = median.filter(|m| !m.is_nan() && *m >= 0.0) else {
        return RepeatVerdict::Unknown;
    };
    let floor = floor.unwrap_or(0.0);
    // A hair of slack so that a median exactly on the band's edge is not lost to rounding; a
    // ratio of 0 or ∞ (e.g. no goodput at all on one side) is beyond any band.
    if m > 0.0 && m.is_finite() && m.ln().abs() <= (1.0 + floor).ln() + 1e-12 {
        return RepeatVerdict::NoDifference;
    }
    if (m < 1.0) == lower_is_better {
        RepeatVerdict::Better
    } else {
        RepeatVerdict::Worse
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_moves_the_first_policy_back() {
        let p = ["a", "b", "c"];
        assert_eq!(rotated(&p, 0), ["a", "b", "c"]);
        assert_eq!(rotated(&p, 1), ["b", "c", "a"]);
        assert_eq!(rotated(&p, 2), ["c", "a", "b"]);
        assert_eq!(rotated(&p, 3), ["a", "b", "c"]);
        assert!(rotated::<u8>(&[], 2).is_empty());
        // Over as many repeats as policies, every policy runs once in every position.
        for pos in 0..3 {
            let mut at: Vec<_> = (0..3).map(|r| rotated(&p, r)[pos]).collect();
            at.sort();
            assert_eq!(at, ["a", "b", "c"]);
        }
    }

    #[test]
    fn spread_is_median_and_range_of_finite_values() {
        let s = Spread::of([3.0, 1.0, f64::NAN, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.n), (Some(2.0), Some(1.0), Some(3.0), 3));
        let even = Spread::of([4.0, 1.0, 2.0, 3.0]);
        assert_eq!(even.median, Some(2.5));
        assert_eq!(Spread::of([]), Spread::default());
    }

    #[test]
    fn pairs_follow_repeats_and_skip_gaps() {
        let p = [(0, Some(2.0)), (1, Some(3.0)), (2, Some(5.0)), (3, None)];
        let b = [(0, Some(1.0)), (2, Some(2.0)), (3, Some(1.0))];
        assert_eq!(paired(&p, &b), vec![2.0, 2.5]);
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
    }

    #[test]
    fn aa_floor_is_the_widest_pair() {
        let aa = aa_ratios(&[Some(100.0), Some(110.0), None, Some(95.0)]);
        // 3 known values: 6 ordered pairs.
        assert_eq!(aa.len(), 6);
        let floor = noise_floor(&aa).expect("floor");
        assert!((floor - (110.0 / 95.0 - 1.0)).abs() < 1e-12);
        assert_eq!(noise_floor(&aa_ratios(&[Some(1.0)])), None);
        assert_eq!(noise_floor(&aa_ratios(&[Some(1.0), Some(1.0)])), Some(0.0));
    }

    #[test]
    fn verdicts_respect_the_floor_and_direction() {
        assert_eq!(verdict(Some(0.97), Some(0.05), true), RepeatVerdict::NoDifference);
        assert_eq!(verdict(Some(1.05), Some(0.05), true), RepeatVerdict::NoDifference);
        assert_eq!(verdict(Some(0.90), Some(0.05), true), RepeatVerdict::Better);
        assert_eq!(verdict(Some(0.90), Some(0.05), false), RepeatVerdict::Worse);
        assert_eq!(verdict(Some(1.2), Some(0.05), false), RepeatVerdict::Better);
        assert_eq!(verdict(Some(1.0), None, true), RepeatVerdict::NoDifference);
        assert_eq!(verdict(Some(1.01), None, true), RepeatVerdict::Worse);
        assert_eq!(verdict(None, Some(0.1), true), RepeatVerdict::Unknown);
        // The band is multiplicative: a floor of +250 % (A/A ratios from 0.29x to 3.5x) still
        // tells a 0.06x ratio apart, and 0.3x is inside.
        assert_eq!(verdict(Some(0.06), Some(2.5), true), RepeatVerdict::Better);
        assert_eq!(verdict(Some(0.3), Some(2.5), true), RepeatVerdict::NoDifference);
        assert_eq!(verdict(Some(0.94), Some(0.05), true), RepeatVerdict::Better);
    }
}
