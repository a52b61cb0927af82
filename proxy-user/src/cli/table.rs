//! Plain-text tables for the CLI's `-o table` output: left-aligned columns
//! two spaces apart, the last column never padded.
use std::fmt::Write as _;

/// A table under construction: a header row, then data rows.
pub struct Table {
    rows: Vec<Vec<String>>,
    /// Columns printed right-aligned (numbers).
    right: Vec<usize>,
    indent: usize,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self {
            rows: vec![header.iter().map(|h| (*h).to_owned()).collect()],
            right: Vec::new(),
            indent: 0,
        }
    }

    /// Prints column `index` right-aligned.
    pub fn right(mut self, index: usize) -> Self {
        self.right.push(index);
        self
    }

    /// Indents every line by `spaces`.
    pub fn indent(mut self, spaces: usize) -> Self {
        self.indent = spaces;
        self
    }

    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0usize; columns];
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = " ".repeat(self.indent);
            for (column, cell) in row.iter().enumerate() {
                let width = widths[column];
                if column + 1 == row.len() && !self.right.contains(&column) {
                    line.push_str(cell);
                } else if self.right.contains(&column) {
                    let _ = write!(line, "{cell:>width$}  ");
                } else {
                    let _ = write!(line, "{cell:<width$}  ");
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

/// `1h02m`, `3m05s`, `42s`, `850ms`: a duration for people.
pub fn human_duration(seconds: f64) -> String {
    if seconds > 0.0 && seconds < 1.0 {
        return format!("{:.0}ms", seconds * 1e3);
    }
    let total = seconds as u64;
    let (d, h, m, s) = (
        total / 86_400,
        total / 3600 % 24,
        total / 60 % 60,
        total % 60,
    );
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s:02}s"),
        (0, _, _) => format!("{h}h{m:02}m"),
        _ => format!("{d}d{h:02}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_the_last_is_not_padded() {
        let mut t = Table::new(&["NAME", "N", "NOTE"]).right(1);
        t.push(vec!["a".into(), "10".into(), "x".into()]);
        t.push(vec!["long-name".into(), "2".into(), "y".into()]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "NAME        N  NOTE");
        assert_eq!(lines[1], "a          10  x");
        assert_eq!(lines[2], "long-name   2  y");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human_duration(0.0123), "12ms");
        assert_eq!(human_duration(42.0), "42s");
        assert_eq!(human_duration(0.0), "0s");
        assert_eq!(human_duration(185.0), "3m05s");
        assert_eq!(human_duration(3720.0), "1h02m");
        assert_eq!(human_duration(90_000.0), "1d01h");
    }
}
