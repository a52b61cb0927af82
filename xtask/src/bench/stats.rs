//! The statistics the benchmark takes over rounds and repetitions: the
//! median (the upper one of an even count), nearest-rank quartiles and the
//! range.

/// The median of `v` (NaN for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median of the figures `field` gives over `runs` (those it has that
/// are numbers); `None` when none has one.
pub fn median_by<T>(runs: &[T], field: impl Fn(&T) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = runs
        .iter()
        .filter_map(field)
        .filter(|x| x.is_finite())
        .collect();
    (!v.is_empty()).then(|| median(v))
}

/// The first and third quartiles (nearest rank).
pub fn quartiles(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    (at(0.25), at(0.75))
}

/// The smallest and the largest of `v` (`None` for none).
pub fn range(v: &[f64]) -> Option<(f64, f64)> {
    let lo = v.iter().copied().reduce(f64::min)?;
    let hi = v.iter().copied().reduce(f64::max)?;
    Some((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quartiles_by_nearest_rank() {
        assert_eq!(quartiles(&[4.0, 1.0, 3.0, 2.0, 5.0]), (2.0, 4.0));
        assert!(quartiles(&[]).0.is_nan());
    }

    #[test]
    fn median_takes_the_upper_middle_and_skips_the_missing() {
        assert_eq!(median(vec![3.0, 1.0, 2.0, 4.0]), 3.0);
        assert!(median(Vec::new()).is_nan());
        let runs = [Some(2.0), None, Some(1.0), Some(f64::NAN), Some(3.0)];
        assert_eq!(median_by(&runs, |r| *r), Some(2.0));
        assert_eq!(median_by(&[None::<f64>], |r| *r), None);
        assert_eq!(range(&[2.0, 1.0, 3.0]), Some((1.0, 3.0)));
        assert_eq!(range(&[]), None);
    }
}
