//! How the report writes numbers: figures with a fixed number of decimals
//! (a dash for none), Services counts (`10k`), and counts as results.json
//! holds them.

use std::fmt::Display;

/// A figure with `digits` decimals, or a dash for none.
pub fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "–".into(),
    }
}

/// A number of Services as the report writes it (`10k`).
pub fn size_label(n: u64) -> String {
    match n {
        n if n >= 1000 && n % 1000 == 0 => format!("{}k", n / 1000),
        n => n.to_string(),
    }
}

/// A count as results.json writes it, `null` when the run has none.
pub fn raw<T: Display>(v: Option<T>) -> String {
    v.map_or_else(|| "null".to_owned(), |v| v.to_string())
}

/// A figure as results.json writes it (`4.0`, not `4`), `null` for none.
pub fn raw_f64(v: Option<f64>) -> String {
    raw(v.and_then(serde_json::Number::from_f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_the_results_file_writes_them() {
        assert_eq!(fmt_opt(Some(0.9666), 2), "0.97");
        assert_eq!(fmt_opt(Some(f64::NAN), 2), "–");
        assert_eq!(fmt_opt(None, 0), "–");
        assert_eq!(size_label(10_000), "10k");
        assert_eq!(size_label(1500), "1500");
        assert_eq!(raw(Some(3u64)), "3");
        assert_eq!(raw::<u64>(None), "null");
        assert_eq!(raw_f64(Some(4.0)), "4.0");
        assert_eq!(raw_f64(Some(f64::INFINITY)), "null");
    }
}
