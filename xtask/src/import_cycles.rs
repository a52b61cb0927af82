//! No import cycle between files, in any crate of the workspace: a file
//! that imports from another never has that other import from it, directly
//! or through others. The test suite checks every crate's `src` and the
//! two test binaries (see the test below).
//!
//! A file's imports are the module paths its code names from `crate::`,
//! `super::` or `self::`, `use` groups expanded; each path is resolved to
//! the deepest module file it reaches. Two kinds of reference are not
//! edges: a module root (`mod.rs`, `lib.rs`, `main.rs`) naming its own
//! children, which is how Rust declares and re-exports them, and a file
//! naming its own ancestors' roots, where the types a folder shares are
//! defined. Test modules (`#[cfg(test)] mod tests` and `tests.rs` files)
//! are left out: they may reach across the layers they test.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

/// The module trees checked, relative to the repository root.
pub const TREES: [&str; 9] = [
    "proxy-common/src",
    "proxy-ebpf/src",
    "proxy-object/src",
    "proxy-testkit/src",
    "proxy-user/src",
    "proxy-user/tests/kernel",
    "switchboard/src",
    "xtask/src",
    "xtask/tests/e2e",
];

/// A module's path inside its crate (`["dataplane", "conntrack"]`).
type ModPath = Vec<String>;

/// The module path of a file relative to its tree's root: `a/b.rs` and
/// `a/b/mod.rs` are `a::b`; a root file (`lib.rs`, `main.rs`) is the crate.
fn module_of(relative: &Path) -> ModPath {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.strip_suffix(".rs").unwrap_or(&last).to_owned();
        if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
            parts.push(stem);
        }
    }
    parts
}

fn is_root_file(relative: &Path) -> bool {
    matches!(
        relative.file_name().and_then(|n| n.to_str()),
        Some("mod.rs" | "lib.rs" | "main.rs")
    )
}

/// The code of a file without comments and without its test module.
fn code(text: &str) -> String {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        out.push(line);
    }
    out.join("\n")
}

/// Every path a piece of code names after `crate::`, `super::` or `self::`,
/// as absolute module paths from `here` (the file's module), `use` groups
/// expanded (`crate::a::{b::C, d}` is `a::b::C` and `a::d`).
fn named_paths(code: &str, here: &ModPath) -> Vec<ModPath> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let boundary = i == 0
            || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_' || chars[i - 1] == ':');
        if boundary {
            for (anchor, base) in [
                ("crate::", Vec::new()),
                ("super::", parent(here)),
                ("self::", here.clone()),
            ] {
                if starts_with(&chars, i, anchor) {
                    let mut base = base;
                    let mut j = i + anchor.len();
                    // `super::super::`
                    while anchor == "super::" && starts_with(&chars, j, "super::") {
                        base = parent(&base);
                        j += "super::".len();
                    }
                    let (paths, end) = tree(&chars, j);
                    for p in paths {
                        let mut full = base.clone();
                        full.extend(p);
                        out.push(full);
                    }
                    i = end.max(i + 1);
                    break;
                }
            }
        }
        i += 1;
    }
    out
}

fn parent(m: &ModPath) -> ModPath {
    m[..m.len().saturating_sub(1)].to_vec()
}

fn starts_with(chars: &[char], at: usize, word: &str) -> bool {
    word.chars()
        .enumerate()
        .all(|(k, c)| chars.get(at + k) == Some(&c))
}

/// The use-tree at `at`: a path of identifiers joined by `::`, ending in a
/// name, `*` or a `{...}` group of trees. Returns its paths and where it
/// ends.
fn tree(chars: &[char], mut at: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    if chars.get(at) == Some(&'{') {
        return group(chars, at + 1, &prefix);
    }
    loop {
        let start = at;
        while at < chars.len() && (chars[at].is_alphanumeric() || chars[at] == '_') {
            at += 1;
        }
        if at > start {
            prefix.push(chars[start..at].iter().collect::<String>());
        }
        if starts_with(chars, at, "::") {
            at += 2;
            if chars.get(at) == Some(&'{') {
                return group(chars, at + 1, &prefix);
            }
            continue;
        }
        return (vec![prefix], at);
    }
}

/// The trees of a `{...}` group whose items start at `at`, each under
/// `prefix`. Returns their paths and where the group ends.
fn group(chars: &[char], mut at: usize, prefix: &[String]) -> (Vec<Vec<String>>, usize) {
    let mut out = Vec::new();
    loop {
        while at < chars.len() && (chars[at].is_whitespace() || chars[at] == ',') {
            at += 1;
        }
        if at >= chars.len() || chars[at] == '}' {
            return (out, at + 1);
        }
        if starts_with(chars, at, "self") {
            out.push(prefix.to_vec());
            at += 4;
            continue;
        }
        let (inner, end) = tree(chars, at);
        for p in inner {
            let mut full = prefix.to_vec();
            full.extend(p);
            out.push(full);
        }
        // Skip an `as alias` and anything up to the next item.
        at = end.max(at + 1);
        while at < chars.len() && chars[at] != ',' && chars[at] != '}' {
            at += 1;
        }
    }
}

/// One tree's files: each module path with its file.
fn files(root: &Path) -> Result<BTreeMap<ModPath, PathBuf>> {
    let mut out = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
            let name = relative.to_string_lossy();
            // Single-file binaries and test-only files are crates or tests
            // of their own.
            if name == "bin" || path.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.insert(module_of(&relative), relative);
            }
        }
    }
    Ok(out)
}

/// The file-to-file imports of one tree.
type Graph = BTreeMap<PathBuf, BTreeSet<PathBuf>>;

fn graph(root: &Path) -> Result<Graph> {
    let modules = files(root)?;
    let mut graph = Graph::new();
    for (here, file) in &modules {
        let text = fs::read_to_string(root.join(file))
            .with_context(|| format!("reading {}", root.join(file).display()))?;
        let edges = graph.entry(file.clone()).or_default();
        for path in named_paths(&code(&text), here) {
            // The deepest module file the path reaches.
            let Some(target) = (1..=path.len())
                .rev()
                .find_map(|n| modules.get(&path[..n]).map(|f| (&path[..n], f)))
            else {
                continue;
            };
            let (target_mod, target_file) = target;
            let own_child = is_root_file(file) && target_mod.starts_with(here);
            let own_ancestor = here.starts_with(target_mod) && is_root_file(target_file);
            if target_file != file && !own_child && !own_ancestor {
                edges.insert(target_file.clone());
            }
        }
    }
    Ok(graph)
}

/// A cycle of a graph of imports, as `a -> b -> a` (each node written by
/// `show`), if there is one. Also what `kernel_shape` checks its modules
/// with.
pub fn cycle<N: Ord + Clone>(
    graph: &BTreeMap<N, BTreeSet<N>>,
    show: impl Fn(&N) -> String + Copy,
) -> Option<String> {
    fn visit<N: Ord + Clone>(
        graph: &BTreeMap<N, BTreeSet<N>>,
        node: &N,
        path: &mut Vec<N>,
        done: &mut BTreeSet<N>,
        show: impl Fn(&N) -> String + Copy,
    ) -> Option<String> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut shown: Vec<String> = path[at..].iter().map(show).collect();
            shown.push(show(node));
            return Some(shown.join(" -> "));
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(graph, next, path, done, show) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(graph, node, &mut Vec::new(), &mut done, show))
}

/// A file's path as a cycle shows it.
const SHOWN: fn(&PathBuf) -> String = |path| path.display().to_string();

/// The import cycles of every tree under `root` (empty when there is none),
/// one per tree at most.
pub fn findings(root: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for tree in TREES {
        if let Some(cycle) = cycle(&graph(&root.join(tree))?, SHOWN) {
            found.push(format!("{tree}: import cycle: {cycle}"));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn here(s: &str) -> ModPath {
        s.split("::")
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect()
    }

    fn joined(paths: Vec<ModPath>) -> Vec<String> {
        paths.into_iter().map(|p| p.join("::")).collect()
    }

    #[test]
    fn paths_are_read_with_their_groups_and_anchors() {
        let code = "use crate::dataplane::{maps::PinnedMaps, pins::{self, MapsError as E}};\n\
                    fn f() { super::super::report::f(x); self::a::b(); crate::util::x }\n\
                    use super::{Role, Uplink};";
        let got = joined(named_paths(code, &here("bench::scale::report")));
        assert_eq!(
            got,
            [
                "dataplane::maps::PinnedMaps",
                "dataplane::pins",
                "dataplane::pins::MapsError",
                "bench::report::f",
                "bench::scale::report::a::b",
                "util::x",
                "bench::scale::Role",
                "bench::scale::Uplink",
            ]
        );
    }

    #[test]
    fn comments_and_test_modules_are_not_code() {
        let text = "// crate::a::b\nuse crate::c;\n#[cfg(test)]\nmod tests {\n use crate::d;\n}\n";
        assert_eq!(joined(named_paths(&code(text), &here(""))), ["c"]);
    }

    #[test]
    fn a_cycle_is_found_and_shown() {
        let p = |s: &str| PathBuf::from(s);
        let mut graph = Graph::new();
        graph.insert(p("a.rs"), BTreeSet::from([p("b.rs")]));
        graph.insert(p("b.rs"), BTreeSet::from([p("c.rs")]));
        graph.insert(p("c.rs"), BTreeSet::from([p("a.rs")]));
        assert_eq!(
            cycle(&graph, SHOWN).as_deref(),
            Some("a.rs -> b.rs -> c.rs -> a.rs")
        );
        graph.insert(p("c.rs"), BTreeSet::new());
        assert_eq!(cycle(&graph, SHOWN), None);
    }

    #[test]
    fn a_cycle_between_files_of_a_tree_is_found() {
        let root = std::env::temp_dir().join(format!("sb-cycles-{}", std::process::id()));
        let write = |rel: &str, text: &str| {
            let path = root.join(rel);
            fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            fs::write(path, text).expect("write");
        };
        write("lib.rs", "pub mod dataplane;\n");
        write(
            "dataplane/mod.rs",
            "pub mod maps;\npub mod pins;\npub use pins::Pins;\n",
        );
        write(
            "dataplane/pins.rs",
            "use crate::dataplane::maps::PinnedMaps;\n",
        );
        write("dataplane/maps.rs", "use super::{pins::Pins, Other};\n");
        let found = cycle(&graph(&root).expect("graph"), SHOWN);
        write("dataplane/pins.rs", "use proxy_common::names::CONNTRACK;\n");
        let gone = cycle(&graph(&root).expect("graph"), SHOWN);
        let _ = fs::remove_dir_all(&root);
        assert_eq!(
            found.as_deref(),
            Some("dataplane/maps.rs -> dataplane/pins.rs -> dataplane/maps.rs")
        );
        assert_eq!(gone, None);
    }

    /// The workspace as committed.
    #[test]
    fn no_crate_has_an_import_cycle_between_files() {
        let found = findings(&crate::util::repo_root()).expect("survey the workspace");
        assert!(found.is_empty(), "{}", found.join("\n"));
    }
}
