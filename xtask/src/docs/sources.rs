//! The docs held to the source tree: every file of the agent's library is
//! in `docs/layout.md`'s tree and every file the tree lists exists; and
//! every repository path a Rust doc comment or module doc quotes as code
//! exists (the Markdown files' quoted paths are checked by
//! [`super::check_links`]).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{code_paths, Finding};

/// The crates whose Rust files' doc comments are checked.
const CRATES: [&str; 7] = [
    "proxy-common",
    "proxy-ebpf",
    "proxy-object",
    "proxy-testkit",
    "proxy-user",
    "switchboard",
    "xtask",
];

/// The tree `docs/layout.md` draws, and the folder it draws.
pub const LAYOUT: &str = "docs/layout.md";
const TREE_ROOT: &str = "proxy-user/src/";

/// Every `.rs` file under `dir` (relative to `root`), sorted.
pub fn rust_files(root: &Path, dir: &str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut dirs = vec![PathBuf::from(dir)];
    while let Some(dir) = dirs.pop() {
        let abs = root.join(&dir);
        if !abs.is_dir() {
            continue;
        }
        for entry in fs::read_dir(&abs).with_context(|| format!("list {}", abs.display()))? {
            let entry = entry?;
            let rel = dir.join(entry.file_name());
            let name = entry.file_name();
            if entry.file_type()?.is_dir() {
                if name != "target" && name != "results" {
                    dirs.push(rel);
                }
            } else if rel.extension().is_some_and(|e| e == "rs") {
                out.push(rel);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The text of `source`'s doc comments (`//!`, `///`), line by line: the
/// rest of each line after the marker, other lines empty (so line numbers
/// hold).
fn doc_text(source: &str) -> String {
    source
        .lines()
        .map(|line| {
            let t = line.trim_start();
            t.strip_prefix("//!")
                .or_else(|| t.strip_prefix("///"))
                .unwrap_or("")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Repository paths quoted in the doc comments of every crate's Rust files
/// that do not exist.
pub fn check_doc_comments(root: &Path) -> Result<Vec<Finding>> {
    let mut findings = Vec::new();
    for krate in CRATES {
        for file in rust_files(root, krate)? {
            let text = fs::read_to_string(root.join(&file))
                .with_context(|| format!("read {}", file.display()))?;
            for (line, path) in code_paths(&doc_text(&text)) {
                if !root.join(path.trim_end_matches('/')).exists() {
                    findings.push(Finding {
                        file: file.clone(),
                        line,
                        what: format!("doc comment names `{path}`, which does not exist"),
                    });
                }
            }
        }
    }
    Ok(findings)
}

/// The files `docs/layout.md`'s tree of `proxy-user/src/` lists, relative
/// to that folder, with their line numbers. Each entry is a name after
/// `├── ` or `└── `; a name ending in `/` opens a folder for the deeper
/// entries below it, and an entry may name a file inside a folder
/// (`trace/hub.rs`).
pub fn tree_files(layout: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_tree = false;
    let mut folders: Vec<(usize, String)> = Vec::new();
    for (i, line) in layout.lines().enumerate() {
        if line.trim() == TREE_ROOT {
            in_tree = true;
            continue;
        }
        if !in_tree {
            continue;
        }
        if line.trim_start().starts_with("```") {
            break;
        }
        let Some(at) = line.find("── ") else {
            continue;
        };
        let depth = line[..at].chars().count() / 4;
        let Some(name) = line[at + "── ".len()..].split_whitespace().next() else {
            continue;
        };
        folders.retain(|(d, _)| *d < depth);
        let prefix: String = folders.iter().map(|(_, f)| f.as_str()).collect();
        if name.ends_with('/') {
            folders.push((depth, name.to_owned()));
        } else {
            out.push((i + 1, format!("{prefix}{name}")));
        }
    }
    out
}

/// `docs/layout.md`'s tree against `proxy-user/src/`: a file missing from
/// the tree, or listed and not there.
pub fn check_layout(root: &Path) -> Result<Vec<Finding>> {
    let text = fs::read_to_string(root.join(LAYOUT)).context("read docs/layout.md")?;
    let listed = tree_files(&text);
    let actual: BTreeSet<String> = rust_files(root, TREE_ROOT.trim_end_matches('/'))?
        .into_iter()
        .filter_map(|p| {
            p.strip_prefix(TREE_ROOT)
                .ok()
                .map(|p| p.to_string_lossy().into_owned())
        })
        .collect();
    let finding = |line: usize, what: String| Finding {
        file: PathBuf::from(LAYOUT),
        line,
        what,
    };
    let mut findings: Vec<Finding> = listed
        .iter()
        .filter(|(_, f)| !actual.contains(f))
        .map(|(line, f)| {
            finding(
                *line,
                format!("the tree lists `{TREE_ROOT}{f}`, which does not exist"),
            )
        })
        .collect();
    let names: BTreeSet<&str> = listed.iter().map(|(_, f)| f.as_str()).collect();
    findings.extend(
        actual
            .iter()
            .filter(|f| !names.contains(f.as_str()))
            .map(|f| finding(1, format!("`{TREE_ROOT}{f}` is missing from the tree"))),
    );
    Ok(findings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_names_files_inside_their_folders() {
        let layout = "text\n```\nproxy-user/src/\n├── lib.rs             the layers\n\
                      ├── agent/\n│   ├── preload.rs     x\n│   └── sub/\n│       └── deep.rs\n\
                      ├── node/\n│   ├── trace/mod.rs   the trace\n│   └── memory.rs\n\
                      └── util/\n    └── btree.rs\n```\n├── after.rs\n";
        let got: Vec<String> = tree_files(layout).into_iter().map(|(_, f)| f).collect();
        assert_eq!(
            got,
            [
                "lib.rs",
                "agent/preload.rs",
                "agent/sub/deep.rs",
                "node/trace/mod.rs",
                "node/memory.rs",
                "util/btree.rs"
            ]
        );
    }

    #[test]
    fn doc_comments_keep_their_line_numbers() {
        let src = "//! See `proxy-user/src/a.rs`.\nfn x() {}\n    /// and `xtask/b.rs`\n// not `docs/c.md`\n";
        assert_eq!(
            code_paths(&doc_text(src)),
            [
                (1, "proxy-user/src/a.rs".to_owned()),
                (3, "xtask/b.rs".to_owned())
            ]
        );
    }

    /// The tree as committed: the check the suite holds the docs to.
    #[test]
    fn the_layout_and_doc_comments_match_the_sources() {
        let root = crate::util::repo_root();
        let mut findings = check_layout(&root).expect("check the layout");
        findings.extend(check_doc_comments(&root).expect("check the doc comments"));
        let text: Vec<String> = findings.iter().map(ToString::to_string).collect();
        assert!(text.is_empty(), "{}", text.join("\n"));
    }
}
