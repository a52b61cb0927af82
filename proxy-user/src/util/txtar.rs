//! Test cases as data files a reader sees whole: one txtar archive per case
//! (a comment saying what the case shows, then sections, each opened by a
//! `-- name --` line), and the runner that checks the sections a case
//! expects against what the code produced.
//!
//! The runner runs every `*.txtar` file of a directory and fails naming each
//! file whose expectation differs, with a line diff (`-` expected, `+` what
//! the code gives). `UPDATE_CASES=1` writes what the code gives into the
//! files instead: review every changed line before committing it, since an
//! expectation says what a user must see, not what the code happens to
//! print. `CASES=word` runs only the files whose name holds `word`.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One `-- name --` section and the lines under it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Section {
    pub(crate) name: String,
    pub(crate) body: String,
}

/// A case file: its comment and its sections, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Archive {
    pub(crate) comment: String,
    pub(crate) sections: Vec<Section>,
}

/// A section line: `-- name --`.
fn marker(line: &str) -> Option<&str> {
    line.strip_prefix("-- ")?.strip_suffix(" --")
}

impl Archive {
    pub(crate) fn parse(text: &str) -> Archive {
        let mut comment = String::new();
        let mut sections: Vec<Section> = Vec::new();
        for line in text.lines() {
            if let Some(name) = marker(line) {
                sections.push(Section {
                    name: name.to_string(),
                    body: String::new(),
                });
                continue;
            }
            let into = match sections.last_mut() {
                Some(section) => &mut section.body,
                None => &mut comment,
            };
            into.push_str(line);
            into.push('\n');
        }
        Archive { comment, sections }
    }

    pub(crate) fn format(&self) -> String {
        let mut out = self.comment.clone();
        for s in &self.sections {
            let _ = writeln!(out, "-- {} --", s.name);
            out.push_str(&s.body);
        }
        out
    }
}

/// Where a case's produced text goes: an expectation section of the file,
/// or a section the file may leave out when the code gives nothing for it
/// (inserted after section `after` when `UPDATE_CASES` writes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum At {
    Section(usize),
    Absent { after: usize },
}

/// What the code gave for one expectation of a case.
#[derive(Debug)]
pub(crate) struct Produced {
    pub(crate) at: At,
    pub(crate) name: String,
    /// One line per entry, no trailing newline needed.
    pub(crate) text: String,
}

/// The body as compared: trailing blanks and blank lines at the end
/// do not count.
fn normal(body: &str) -> String {
    let lines: Vec<&str> = body.lines().map(str::trim_end).collect();
    let end = lines
        .iter()
        .rposition(|l| !l.is_empty())
        .map_or(0, |i| i + 1);
    lines[..end].iter().map(|l| format!("{l}\n")).collect()
}

/// A line diff of `want` against `got`: ` ` both, `-` only expected,
/// `+` only produced.
pub(crate) fn diff(want: &str, got: &str) -> String {
    let a: Vec<&str> = want.lines().collect();
    let b: Vec<&str> = got.lines().collect();
    // Longest common subsequence, from the end.
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            let _ = writeln!(out, "  {}", a[i]);
            (i, j) = (i + 1, j + 1);
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            let _ = writeln!(out, "+ {}", b[j]);
            j += 1;
        } else {
            let _ = writeln!(out, "- {}", a[i]);
            i += 1;
        }
    }
    out
}

/// The case files of `dir` (relative to the crate), sorted.
fn case_files(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let filter = std::env::var("CASES").unwrap_or_default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "txtar"))
        .filter(|p| p.to_string_lossy().contains(&filter))
        .collect();
    files.sort();
    files
}

/// Runs `case` over every case file of `dir` and compares what it produced
/// with the file's expectations (or writes it, under `UPDATE_CASES=1`).
/// `case` returns an error for a file it cannot run (a malformed input, a
/// rule of the format broken, an internal check that failed).
pub(crate) fn run_dir(dir: &str, case: impl Fn(&Archive) -> Result<Vec<Produced>, String>) {
    let update = std::env::var_os("UPDATE_CASES").is_some_and(|v| v != "0");
    let files = case_files(dir);
    assert!(!files.is_empty(), "no case file in {dir}");
    let mut failures = Vec::new();
    for path in &files {
        let shown = path
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(path)
            .display()
            .to_string();
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{shown}: {e}"));
        let mut archive = Archive::parse(&text);
        let produced = match case(&archive) {
            Ok(produced) => produced,
            Err(problem) => {
                failures.push(format!("{shown}: {problem}"));
                continue;
            }
        };
        if produced.is_empty() {
            failures.push(format!(
                "{shown}: expects nothing (a case that cannot fail)"
            ));
            continue;
        }
        let mut inserts = Vec::new();
        for p in produced {
            let got = normal(&p.text);
            match p.at {
                At::Section(i) => {
                    let want = normal(&archive.sections[i].body);
                    if want == got {
                        continue;
                    }
                    if update {
                        archive.sections[i].body = got;
                    } else {
                        failures.push(format!(
                            "{shown}: section {} (`-- {} --`) differs:\n{}",
                            i + 1,
                            p.name,
                            diff(&want, &got)
                        ));
                    }
                }
                At::Absent { after } => {
                    if got.is_empty() {
                        continue;
                    }
                    if update {
                        inserts.push((after, p.name, got));
                    } else {
                        failures.push(format!(
                            "{shown}: no `-- {} --` after section {}, but the code gives:\n{}",
                            p.name,
                            after + 1,
                            diff("", &got)
                        ));
                    }
                }
            }
        }
        for (after, name, body) in inserts.into_iter().rev() {
            archive.sections.insert(after + 1, Section { name, body });
        }
        if update {
            let new = archive.format();
            if new != text {
                std::fs::write(path, new).unwrap_or_else(|e| panic!("{shown}: {e}"));
                eprintln!("updated {shown}");
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} case files failed (UPDATE_CASES=1 writes what the code gives; review it):\n\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archive_reads_and_writes_back_unchanged() {
        let text = "What it shows.\n\n-- input.yaml --\na: 1\n-- frontends --\n-- warnings --\nw\n";
        let a = Archive::parse(text);
        assert_eq!(a.comment, "What it shows.\n\n");
        let names: Vec<&str> = a.sections.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["input.yaml", "frontends", "warnings"]);
        assert_eq!(a.sections[1].body, "");
        assert_eq!(a.format(), text);
    }

    #[test]
    fn the_diff_marks_lines_missing_and_extra() {
        assert_eq!(diff("a\nb\nc\n", "a\nc\nd\n"), "  a\n- b\n  c\n+ d\n");
        assert_eq!(normal("x  \ny\n\n\n"), "x\ny\n");
    }
}
