//! The report's goals: a row of the Goals table, its verdict, and the
//! number formatting every section's writer shares (the overall report in
//! `report.rs`, and the north-south, forwarding and scale sections).

use serde_json::Value;

/// A JSON number of the results.
pub(crate) fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// A figure with `digits` decimals, or a dash for none.
pub(crate) fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "–".into(),
    }
}

/// A number of Services as the report writes it (`10k`).
pub(crate) fn size_label(n: u64) -> String {
    match n {
        n if n >= 1000 && n % 1000 == 0 => format!("{}k", n / 1000),
        n => n.to_string(),
    }
}

/// One row of the report's Goals table.
pub(crate) struct Goal {
    pub(crate) what: String,
    pub(crate) goal: String,
    pub(crate) measured: String,
    pub(crate) met: Option<bool>,
}

/// A goal's verdict as the table writes it.
pub(crate) fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "**met**",
        Some(false) => "**not met**",
        None => "not measured",
    }
}
