//! The shape the kernel crate (`proxy-ebpf/src`) keeps: its top-level
//! modules import each other without a cycle, and no source file passes
//! [`MAX_LINES`] lines. The test suite checks both (see the test below).
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

use anyhow::{Context, Result};

/// The most lines a kernel source file has.
pub const MAX_LINES: usize = 500;

/// The top-level module a source file belongs to (`ct/track.rs` → `ct`),
/// or `None` for the crate roots and the helper binaries.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    match name {
        "main" | "lib" | "bin" => None,
        _ => Some(name.to_owned()),
    }
}

/// The top-level modules a file's code (not its comments) names through
/// `crate::`, directly or in a `use crate::{...}` group.
fn imports(text: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find("};").unwrap_or(group.len());
            let mut depth = 0usize;
            let mut word = String::new();
            // Only the first path segment of each item at depth 0 names a
            // module.
            let mut at_item_start = true;
            for c in group[..end].chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth = depth.saturating_sub(1),
                    _ => {}
                }
                if c.is_ascii_alphanumeric() || c == '_' {
                    word.push(c);
                    continue;
                }
                if at_item_start && depth == 0 && !word.is_empty() {
                    found.insert(std::mem::take(&mut word));
                    at_item_start = false;
                }
                word.clear();
                if depth == 0 && c == ',' {
                    at_item_start = true;
                }
            }
            if at_item_start && !word.is_empty() {
                found.insert(word);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

/// Each top-level module's imports of the others.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The kernel crate's files: each top-level module's imports of the
/// others, and the files over [`MAX_LINES`] lines.
fn survey(src: &Path) -> Result<(Graph, Vec<String>)> {
    let mut graph = Graph::new();
    let mut long = Vec::new();
    let mut pending = vec![src.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let text =
                fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            let relative = path.strip_prefix(src).unwrap_or(&path);
            let lines = text.lines().count();
            if lines > MAX_LINES {
                long.push(format!("{} has {lines} lines", relative.display()));
            }
            if let Some(module) = module_of(relative) {
                let deps: Vec<String> = imports(&text)
                    .into_iter()
                    .filter(|d| *d != module)
                    .collect();
                graph.entry(module).or_default().extend(deps);
            }
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| modules.contains(d));
    }
    Ok((graph, long))
}

/// What is wrong with the kernel crate's shape under `root` (empty when
/// nothing is).
pub fn findings(root: &Path) -> Result<Vec<String>> {
    let (graph, mut found) = survey(&root.join("proxy-ebpf/src"))?;
    if let Some(cycle) = crate::import_cycles::cycle(&graph, String::clone) {
        found.push(format!("import cycle: {cycle}"));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_crate_has_no_import_cycle_and_no_file_over_500_lines() {
        let found = findings(&crate::util::repo_root()).expect("survey proxy-ebpf/src");
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn imports_are_read_from_paths_and_groups_not_comments() {
        let text =
            "use crate::{\n    ct::track::{a, b},\n    maps::{count, SB_X},\n    packet,\n};\n\
                    // crate::programs is only named in a comment\n\
                    fn f() { crate::skb::pass(x) }\n";
        let found: Vec<String> = imports(text).into_iter().collect();
        assert_eq!(found, ["ct", "maps", "packet", "skb"]);
    }

    #[test]
    fn a_cycle_is_found_and_shown() {
        let mut graph = Graph::new();
        graph.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
        graph.insert("b".to_owned(), BTreeSet::from(["c".to_owned()]));
        graph.insert("c".to_owned(), BTreeSet::from(["a".to_owned()]));
        let cycle = |g: &Graph| crate::import_cycles::cycle(g, String::clone);
        assert_eq!(cycle(&graph).as_deref(), Some("a -> b -> c -> a"));
        graph.insert("c".to_owned(), BTreeSet::new());
        assert_eq!(cycle(&graph), None);
    }
}
