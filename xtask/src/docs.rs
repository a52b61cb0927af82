//! The documentation check (`cargo xtask docs`, and unit tests that run
//! under `cargo xtask test`):
//!
//! - every relative link in `README.md` and `docs/**/*.md` reaches an
//!   existing file, and its `#anchor` a heading of that file (GitHub's
//!   slugs); so does every repository path quoted as inline code
//!   (`proxy-user/src/…`), so a moved file is not left behind in the docs;
//! - every benchmark figure quoted in a marked block
//!   (`<!-- bench-figures: goals -->` … `<!-- /bench-figures -->`) matches
//!   `docs/benchmarks/latest.json`, the figures of the latest full run that
//!   `cargo xtask bench` writes; and that file matches the committed report
//!   of that run (`xtask/results/latest/report.md`).

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

pub mod headline;
pub mod sources;

/// Where `cargo xtask bench` writes the figures of its latest full run,
/// relative to the repository root.
pub const FIGURES_PATH: &str = "docs/benchmarks/latest.json";

/// The committed report of the latest full run, relative to the root.
pub const LATEST_REPORT: &str = "xtask/results/latest/report.md";

const BLOCK_OPEN: &str = "<!-- bench-figures:";
const BLOCK_CLOSE: &str = "<!-- /bench-figures -->";

/// The figures of one benchmark run that the docs may quote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchFigures {
    /// The run's timestamp (its folder under `xtask/results/`).
    pub run: String,
    /// `full` or `quick`.
    pub mode: String,
    /// The commit the run measured (as `git rev-parse --short=12` gave it).
    pub commit: String,
    /// CPUs, CPU model and memory, as the report's header gives them.
    pub machine: String,
    pub kernel: String,
    /// The report's Goals table, row by row.
    pub goals: Vec<GoalFigure>,
}

/// One row of the Goals table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoalFigure {
    pub goal: String,
    pub target: String,
    pub measured: String,
    /// `met`, `not met` or `not measured`.
    pub verdict: String,
}

impl BenchFigures {
    /// The commit as the docs quote it (7 hex digits).
    pub fn short_commit(&self) -> &str {
        self.commit.get(..7).unwrap_or(&self.commit)
    }
}

/// One problem found, with where it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub file: PathBuf,
    pub line: usize,
    pub what: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.what)
    }
}

/// GitHub's anchor for a heading's text: lower case; every character that
/// is not a letter, a digit, a space, `-` or `_` dropped; spaces become `-`.
/// Inline code marks go, a link keeps its text.
pub fn slug(heading: &str) -> String {
    strip_links(heading)
        .chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// `[text](target)` → `text`, everything else as it is.
fn strip_links(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let Some(close) = after.find("](") else {
            break;
        };
        let Some(end) = after[close + 2..].find(')') else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&after[..close]);
        rest = &after[close + 2 + end + 1..];
    }
    out.push_str(rest);
    out
}

/// The lines of a Markdown file outside fenced code blocks, numbered from 1.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// The anchors of a Markdown file's headings (ATX `#` headings), with
/// GitHub's `-1`, `-2` suffixes for repeated ones.
pub fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let title = line[hashes..].trim().trim_end_matches('#').trim_end();
        let base = slug(title);
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 { base } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// A line with its inline code spans blanked out (they hold no links).
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// The link targets of a Markdown file: inline links and images
/// (`[text](target "title")`) and reference definitions (`[x]: target`),
/// outside code, with their line numbers.
pub fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, raw) in prose_lines(text) {
        let line = without_code_spans(raw);
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            if let Some(close) = trimmed.find("]:") {
                if let Some(target) = trimmed[close + 2..].split_whitespace().next() {
                    out.push((n, target.trim_matches(['<', '>']).to_string()));
                    continue;
                }
            }
        }
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else {
                break;
            };
            let inner = after[..end].trim();
            let target = inner.split_whitespace().next().unwrap_or("");
            out.push((n, target.trim_matches(['<', '>']).to_string()));
            rest = &after[end + 1..];
        }
    }
    out
}

/// The top-level folders whose paths, quoted as inline code in prose, must
/// exist.
const TREE_ROOTS: [&str; 10] = [
    "proxy-common/",
    "proxy-ebpf/",
    "proxy-object/",
    "proxy-testkit/",
    "proxy-user/",
    "switchboard/",
    "xtask/",
    "manifests/",
    "docs/",
    ".ci/",
];

/// Repository paths quoted as inline code outside fenced blocks
/// (`` `xtask/src/docs.rs` ``), with their line numbers. A span with a
/// placeholder (`<run>`, `*`, `…`) or a space is not a path.
pub fn code_paths(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        for (i, span) in line.split('`').enumerate() {
            let is_path = i % 2 == 1
                && TREE_ROOTS.iter().any(|r| span.starts_with(r))
                && !span.contains(|c: char| c.is_whitespace() || "<>*…{}".contains(c));
            if is_path {
                out.push((n, span.to_string()));
            }
        }
    }
    out
}

/// Whether a link leaves the repository (a scheme such as `https:`,
/// `mailto:`), so it is not checked.
fn is_external(target: &str) -> bool {
    match target.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        }
        None => false,
    }
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The Markdown files the check reads, relative to `root`: `README.md` and
/// every `.md` under `docs/`, sorted.
pub fn doc_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = vec![PathBuf::from("README.md")];
    let mut dirs = vec![PathBuf::from("docs")];
    let mut found = Vec::new();
    while let Some(dir) = dirs.pop() {
        let abs = root.join(&dir);
        if !abs.exists() {
            continue;
        }
        for entry in fs::read_dir(&abs).with_context(|| format!("list {}", abs.display()))? {
            let entry = entry?;
            let rel = dir.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                dirs.push(rel);
            } else if rel.extension().is_some_and(|e| e == "md") {
                found.push(rel);
            }
        }
    }
    found.sort();
    out.extend(found);
    Ok(out)
}

/// Every relative link of `files` (relative to `root`) that reaches no file,
/// or whose anchor names no heading of the Markdown file it reaches.
pub fn check_links(root: &Path, files: &[PathBuf]) -> Result<Vec<Finding>> {
    let mut anchor_cache: HashMap<PathBuf, Vec<String>> = HashMap::new();
    let mut findings = Vec::new();
    for file in files {
        let text = fs::read_to_string(root.join(file))
            .with_context(|| format!("read {}", file.display()))?;
        for (line, path) in code_paths(&text) {
            if !root.join(path.trim_end_matches('/')).exists() {
                findings.push(Finding {
                    file: file.clone(),
                    line,
                    what: format!("path `{path}` does not exist"),
                });
            }
        }
        for (line, target) in links(&text) {
            if target.is_empty() || is_external(&target) {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else if let Some(from_root) = path.strip_prefix('/') {
                normalize(Path::new(from_root))
            } else {
                normalize(&file.parent().unwrap_or(Path::new("")).join(path))
            };
            let finding = |what: String| Finding {
                file: file.clone(),
                line,
                what,
            };
            if !root.join(&resolved).exists() {
                findings.push(finding(format!(
                    "link `{target}`: {} does not exist",
                    resolved.display()
                )));
                continue;
            }
            let Some(anchor) = anchor else {
                continue;
            };
            if resolved.extension().is_none_or(|e| e != "md") {
                continue;
            }
            if !anchor_cache.contains_key(&resolved) {
                let text = fs::read_to_string(root.join(&resolved))
                    .with_context(|| format!("read {}", resolved.display()))?;
                anchor_cache.insert(resolved.clone(), anchors(&text));
            }
            let known = anchor_cache
                .get(&resolved)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            if !known.iter().any(|a| a == anchor) {
                findings.push(finding(format!(
                    "link `{target}`: {} has no heading with the anchor #{anchor}",
                    resolved.display()
                )));
            }
        }
    }
    Ok(findings)
}

/// The cells of a Markdown table row (`| a | b |` → `["a", "b"]`), or None
/// for a line that is not one. `\|` stays inside its cell.
fn table_cells(line: &str) -> Option<Vec<String>> {
    let line = line.trim();
    let inner = line.strip_prefix('|')?.strip_suffix('|')?;
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push_str("\\|");
                chars.next();
            }
            '|' => cells.push(std::mem::take(&mut cell).trim().to_string()),
            c => cell.push(c),
        }
    }
    cells.push(cell.trim().to_string());
    Some(cells)
}

fn is_separator(cells: &[String]) -> bool {
    cells
        .iter()
        .all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':')))
}

/// A Goals table's rows (header and separator skipped) from the lines of a
/// block or a report: `(line number, row)`.
fn goal_rows<'a>(lines: impl Iterator<Item = (usize, &'a str)>) -> Vec<(usize, GoalFigure)> {
    let mut out = Vec::new();
    for (n, line) in lines {
        let Some(cells) = table_cells(line) else {
            continue;
        };
        if is_separator(&cells) || cells.first().is_some_and(|c| c == "goal") {
            continue;
        }
        let cell = |i: usize| cells.get(i).cloned().unwrap_or_default();
        out.push((
            n,
            GoalFigure {
                goal: cell(0),
                target: cell(1),
                measured: cell(2),
                verdict: cell(3).trim_matches('*').to_string(),
            },
        ));
    }
    out
}

/// One marked block of a file: where it opens, whether it must show every
/// goal, and its lines.
struct Block<'a> {
    open_line: usize,
    all: bool,
    lines: Vec<(usize, &'a str)>,
}

fn blocks<'a>(file: &Path, text: &'a str) -> Result<Vec<Block<'a>>> {
    let mut out = Vec::new();
    let mut current: Option<Block<'a>> = None;
    for (n, line) in prose_lines(text) {
        let trimmed = line.trim();
        if let Some(spec) = trimmed.strip_prefix(BLOCK_OPEN) {
            if current.is_some() {
                bail!(
                    "{}:{n}: a bench-figures block opens inside another",
                    file.display()
                );
            }
            let spec = spec.trim_end_matches("-->");
            let kinds: Vec<&str> = spec.split(',').map(str::trim).collect();
            if kinds.first() != Some(&"goals") {
                bail!(
                    "{}:{n}: unknown bench-figures block `{}` (known: goals, goals, all)",
                    file.display(),
                    spec.trim()
                );
            }
            current = Some(Block {
                open_line: n,
                all: kinds.contains(&"all"),
                lines: Vec::new(),
            });
        } else if trimmed == BLOCK_CLOSE {
            match current.take() {
                Some(b) => out.push(b),
                None => bail!(
                    "{}:{n}: a bench-figures block closes that never opened",
                    file.display()
                ),
            }
        } else if let Some(b) = current.as_mut() {
            b.lines.push((n, line));
        }
    }
    if let Some(b) = current {
        bail!(
            "{}:{}: a bench-figures block is never closed",
            file.display(),
            b.open_line
        );
    }
    Ok(out)
}

/// Every figure in the marked blocks of `text` that `figures` does not
/// hold: a goal row that differs or is unknown, a block that does not name
/// the run's commit, or (`goals, all`) a goal the block leaves out. Also
/// returns how many blocks there were.
pub fn check_figures(
    file: &Path,
    text: &str,
    figures: &BenchFigures,
) -> Result<(usize, Vec<Finding>)> {
    let blocks = blocks(file, text)?;
    let mut findings = Vec::new();
    let finding = |line: usize, what: String| Finding {
        file: file.to_path_buf(),
        line,
        what,
    };
    for block in &blocks {
        let commit = figures.short_commit();
        if !block.lines.iter().any(|(_, l)| l.contains(commit)) {
            findings.push(finding(
                block.open_line,
                format!(
                    "bench-figures block does not name the run's commit {commit} ({FIGURES_PATH})"
                ),
            ));
        }
        let rows = goal_rows(block.lines.iter().copied());
        if rows.is_empty() {
            findings.push(finding(
                block.open_line,
                "bench-figures block holds no goal row".into(),
            ));
        }
        for (line, row) in &rows {
            match figures.goals.iter().find(|g| g.goal == row.goal) {
                None => findings.push(finding(
                    *line,
                    format!("goal `{}` is not in {FIGURES_PATH}", row.goal),
                )),
                Some(want) if want != row => findings.push(finding(
                    *line,
                    format!(
                        "goal `{}`: the docs say `{} | {} | {}`, {FIGURES_PATH} says `{} | {} | {}`",
                        row.goal,
                        row.target,
                        row.measured,
                        row.verdict,
                        want.target,
                        want.measured,
                        want.verdict
                    ),
                )),
                Some(_) => {}
            }
        }
        if block.all {
            for g in &figures.goals {
                if !rows.iter().any(|(_, r)| r.goal == g.goal) {
                    findings.push(finding(
                        block.open_line,
                        format!(
                            "goal `{}` of {FIGURES_PATH} is missing from the block",
                            g.goal
                        ),
                    ));
                }
            }
        }
    }
    Ok((blocks.len(), findings))
}

/// The commit and Goals table of a report written by `cargo xtask bench`.
pub fn report_goals(report: &str) -> (Option<String>, Vec<GoalFigure>) {
    let commit = report
        .lines()
        .find_map(|l| l.strip_prefix("- commit: "))
        .map(|c| c.split_whitespace().next().unwrap_or("").to_string());
    let mut in_goals = false;
    let mut lines = Vec::new();
    for (i, line) in report.lines().enumerate() {
        if line.starts_with("## ") {
            in_goals = line.trim() == "## Goals";
            continue;
        }
        if in_goals {
            lines.push((i + 1, line));
        }
    }
    let goals = goal_rows(lines.into_iter())
        .into_iter()
        .map(|(_, g)| g)
        .collect();
    (commit, goals)
}

/// The committed figures file against the committed report of the same run.
pub fn check_figures_file(figures: &BenchFigures, report: &str) -> Vec<Finding> {
    let (commit, goals) = report_goals(report);
    let finding = |what: String| Finding {
        file: PathBuf::from(FIGURES_PATH),
        line: 1,
        what,
    };
    let mut out = Vec::new();
    if commit.as_deref() != Some(figures.commit.as_str()) {
        out.push(finding(format!(
            "commit {} but {LATEST_REPORT} is of commit {}",
            figures.commit,
            commit.as_deref().unwrap_or("(none)")
        )));
    }
    if goals != figures.goals {
        out.push(finding(format!(
            "its goals differ from the Goals table of {LATEST_REPORT}: `cargo xtask bench --report-only xtask/results/latest` writes both again from that run's results.json"
        )));
    }
    out
}

pub fn load_figures(root: &Path) -> Result<BenchFigures> {
    let path = root.join(FIGURES_PATH);
    let text = fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
}

/// The whole check on the tree at `root`: every finding, sorted by file.
/// The README must hold the generated headline figures ([`headline`]), and
/// `docs/benchmarks.md` a marked block that shows every goal.
pub fn check_tree(root: &Path) -> Result<Vec<Finding>> {
    let files = doc_files(root)?;
    let mut findings = check_links(root, &files)?;
    findings.extend(sources::check_layout(root)?);
    findings.extend(sources::check_doc_comments(root)?);
    let figures = load_figures(root)?;
    if let Ok(report) = fs::read_to_string(root.join(LATEST_REPORT)) {
        findings.extend(check_figures_file(&figures, &report));
    }
    for file in &files {
        let text = fs::read_to_string(root.join(file))?;
        let (count, found) = check_figures(file, &text, &figures)?;
        findings.extend(found);
        match file.to_str() {
            Some("README.md") => findings.extend(headline::check(file, &text, &figures)),
            Some("docs/benchmarks.md") => {
                let has = count > 0 && blocks(file, &text)?.iter().any(|b| b.all);
                if !has {
                    findings.push(Finding {
                        file: file.clone(),
                        line: 1,
                        what: format!(
                            "no `{BLOCK_OPEN} goals, all -->` block: the quoted figures would go unchecked"
                        ),
                    });
                }
            }
            _ => {}
        }
    }
    Ok(findings)
}

/// `cargo xtask docs`: prints every finding and fails when there is one;
/// with `write`, first writes the README's headline figures again from
/// the latest run.
pub fn run(write: bool) -> Result<()> {
    let root = crate::util::repo_root();
    if write {
        let readme = root.join("README.md");
        let text = fs::read_to_string(&readme).context("read README.md")?;
        let figures = load_figures(&root)?;
        fs::write(&readme, headline::write(&text, &figures)?).context("write README.md")?;
    }
    let findings = check_tree(&root)?;
    for f in &findings {
        println!("{f}");
    }
    if !findings.is_empty() {
        bail!("docs: {} problem(s)", findings.len());
    }
    println!("docs: links and benchmark figures check out");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_as_github_makes_them() {
        assert_eq!(slug("Two commands"), "two-commands");
        assert_eq!(
            slug("Troubleshooting: status, explain, verify, conntrack, doctor, cleanup"),
            "troubleshooting-status-explain-verify-conntrack-doctor-cleanup"
        );
        assert_eq!(
            slug("The uplink layer (traffic from outside the node)"),
            "the-uplink-layer-traffic-from-outside-the-node"
        );
        assert_eq!(slug("`cargo xtask soak`"), "cargo-xtask-soak");
        assert_eq!(
            slug("What `cargo xtask test` runs"),
            "what-cargo-xtask-test-runs"
        );
        assert_eq!(
            slug("Other runs, each with its commit"),
            "other-runs-each-with-its-commit"
        );
        assert_eq!(slug("snake_case and a-b"), "snake_case-and-a-b");
        assert_eq!(slug("See [the maps](x.md#maps) too"), "see-the-maps-too");
        assert_eq!(slug("Überblick ÷ 3 ×"), "überblick--3-");
    }

    #[test]
    fn anchors_skip_code_and_number_repeats() {
        let text =
            "# Top\n\n```sh\n# not a heading\n```\n\n## Usage\n### Usage\n#no space\n## Usage ##\n";
        assert_eq!(anchors(text), ["top", "usage", "usage-1", "usage-2"]);
    }

    #[test]
    fn links_found_outside_code() {
        let text = "See [a](a.md) and ![img](b/c.svg \"title\").\n\
                    `[not](code.md)` and [x](<y.md#z>)\n\
                    ```\n[fenced](no.md)\n```\n\
                    [ref]: docs/r.md\n\
                    | [cell](t.md#row) | [ext](https://example.org/x) |\n";
        let got: Vec<(usize, String)> = links(text);
        let want: Vec<(usize, String)> = vec![
            (1, "a.md".into()),
            (1, "b/c.svg".into()),
            (2, "y.md#z".into()),
            (6, "docs/r.md".into()),
            (7, "t.md#row".into()),
            (7, "https://example.org/x".into()),
        ];
        assert_eq!(got, want);
        assert!(is_external("https://example.org/x"));
        assert!(is_external("mailto:a@b"));
        assert!(!is_external("docs/a.md#x"));
        assert!(!is_external("#anchor"));
    }

    #[test]
    fn code_paths_are_repository_paths() {
        let text = "In `proxy-user/src/sync.rs` and `xtask/results/<run>/report.md`,\n\
                    not `switchboard agent`, `docs/` ok, `xtask/src/a.rs b`\n\
                    ```\n`proxy-ebpf/src/gone.rs`\n```\n";
        assert_eq!(
            code_paths(text),
            [
                (1, "proxy-user/src/sync.rs".to_string()),
                (2, "docs/".to_string())
            ]
        );
    }

    fn temp_tree(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("sb-docs-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for (path, text) in files {
            let p = root.join(path);
            fs::create_dir_all(p.parent().expect("a parent")).expect("mkdir");
            fs::write(p, text).expect("write");
        }
        root
    }

    #[test]
    fn broken_links_named_by_file_and_line() {
        let root = temp_tree(
            "links",
            &[
                (
                    "README.md",
                    "# Top\n[ok](docs/a.md#part-one)\n[here](#top)\n[gone](docs/b.md)\n",
                ),
                (
                    "docs/a.md",
                    "# A\n## Part one\n[up](../README.md#nowhere)\n[dir](.)\n`docs/a.md`, `docs/moved.rs`\n",
                ),
            ],
        );
        let files = doc_files(&root).expect("files");
        assert_eq!(
            files,
            [PathBuf::from("README.md"), PathBuf::from("docs/a.md")]
        );
        let got: Vec<String> = check_links(&root, &files)
            .expect("check")
            .iter()
            .map(ToString::to_string)
            .collect();
        let _ = fs::remove_dir_all(&root);
        assert_eq!(
            got,
            [
                "README.md:4: link `docs/b.md`: docs/b.md does not exist",
                "docs/a.md:5: path `docs/moved.rs` does not exist",
                "docs/a.md:3: link `../README.md#nowhere`: README.md has no heading with the anchor #nowhere",
            ]
        );
    }

    fn figures() -> BenchFigures {
        BenchFigures {
            run: "20260101T000000Z".into(),
            mode: "full".into(),
            commit: "abcdef012345".into(),
            machine: "2 × CPU, 1.0 GiB".into(),
            kernel: "6.18".into(),
            goals: vec![
                GoalFigure {
                    goal: "a ÷ b".into(),
                    target: "≤ 3".into(),
                    measured: "2.00 (2 ns ÷ 1 ns)".into(),
                    verdict: "met".into(),
                },
                GoalFigure {
                    goal: "c".into(),
                    target: "< 5 s".into(),
                    measured: "9 s".into(),
                    verdict: "not met".into(),
                },
            ],
        }
    }

    #[test]
    fn figures_in_marked_blocks_must_match() {
        let f = figures();
        let good = "text 2.50 outside is free\n<!-- bench-figures: goals -->\nRun abcdef0:\n\n| goal | target | measured | |\n|---|---|---|---|\n| a ÷ b | ≤ 3 | 2.00 (2 ns ÷ 1 ns) | **met** |\n<!-- /bench-figures -->\n";
        let (n, found) = check_figures(Path::new("R.md"), good, &f).expect("parse");
        assert_eq!((n, found), (1, vec![]));

        let stale = good
            .replace("2.00 (2", "2.10 (2")
            .replace("abcdef0", "0000000");
        let (_, found) = check_figures(Path::new("R.md"), &stale, &f).expect("parse");
        let got: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0]
            .starts_with("R.md:2: bench-figures block does not name the run's commit abcdef0"));
        assert!(got[1]
            .starts_with("R.md:7: goal `a ÷ b`: the docs say `≤ 3 | 2.10 (2 ns ÷ 1 ns) | met`"));

        let all = good.replace("goals -->", "goals, all -->");
        let (_, found) = check_figures(Path::new("R.md"), &all, &f).expect("parse");
        assert_eq!(found.len(), 1);
        assert!(found[0].what.contains("goal `c`"), "{found:?}");

        let unknown = good.replace("| a ÷ b |", "| a ÷ z |");
        let (_, found) = check_figures(Path::new("R.md"), &unknown, &f).expect("parse");
        assert!(found[0].what.contains("is not in"), "{found:?}");

        assert!(check_figures(Path::new("R.md"), "<!-- bench-figures: goals -->\n", &f).is_err());
        assert!(check_figures(
            Path::new("R.md"),
            "<!-- bench-figures: plots -->\n<!-- /bench-figures -->\n",
            &f
        )
        .is_err());
    }

    #[test]
    fn report_goals_read_back() {
        let report = "# switchboard benchmark\n\n- mode: full\n- commit: abcdef012345\n\n## Goals\n\n| goal | target | measured | |\n|---|---|---|---|\n| a ÷ b | ≤ 3 | 2.00 (2 ns ÷ 1 ns) | **met** |\n| c | < 5 s | 9 s | **not met** |\n\nWhat limits them:\n\n## End to end\n\n| path | x |\n|---|---|\n| d | e |\n";
        let f = figures();
        assert_eq!(
            report_goals(report),
            (Some(f.commit.clone()), f.goals.clone())
        );
        assert!(check_figures_file(&f, report).is_empty());
        let other = report.replace("9 s", "8 s");
        assert_eq!(check_figures_file(&f, &other).len(), 1);
    }

    /// The real tree: README.md and docs/.
    #[test]
    fn the_docs_links_and_figures_check_out() {
        let root = crate::util::repo_root();
        let findings = check_tree(&root).expect("the check runs");
        let list: Vec<String> = findings.iter().map(ToString::to_string).collect();
        assert!(list.is_empty(), "docs problems:\n{}", list.join("\n"));
    }
}
