//! The import rule of `docs/layout.md`, checked: every module of the crate
//! imports (`crate::…`) only from its own layer or the layers below it.
use std::path::{Path, PathBuf};

/// The layers, bottom first: a module may use its own and any earlier one.
const LAYERS: [(&str, u8); 10] = [
    ("util", 0),
    ("model", 1),
    ("source", 2),
    ("sync", 3),
    ("dataplane", 4),
    ("observe", 5),
    ("cli", 6),
    ("agent", 7),
    ("args", 7),
    ("main", 7),
];

/// Test code that runs several layers together on purpose (see
/// `docs/layout.md`).
const EXCEPTIONS: [&str; 1] = ["model/tests.rs"];

fn layer(module: &str) -> Option<u8> {
    LAYERS
        .iter()
        .find(|(name, _)| *name == module)
        .map(|(_, layer)| *layer)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The first path segment of every `crate::` path in `code` (comments
/// dropped), group imports (`crate::{a::X, b}`) included.
fn crate_roots(code: &str) -> Vec<String> {
    let code: String = code
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut roots = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => item_start = true,
                    c if depth == 1 && item_start && c.is_ascii_lowercase() => {
                        roots.push(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
            }
        } else {
            roots.push(ident(rest));
        }
    }
    roots
}

fn ident(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn each_layer_imports_only_from_the_layers_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 50, "found only {} files", files.len());
    let mut wrong = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap_or(file);
        let relative = relative.to_string_lossy().replace('\\', "/");
        let own = relative
            .split('/')
            .next()
            .unwrap_or("")
            .trim_end_matches(".rs");
        let Some(own_layer) = layer(own) else {
            continue;
        };
        if EXCEPTIONS.contains(&relative.as_str()) {
            continue;
        }
        let code = std::fs::read_to_string(file).unwrap_or_default();
        for root in crate_roots(&code) {
            if let Some(used) = layer(&root).filter(|used| *used > own_layer) {
                wrong.push(format!(
                    "{relative} (layer {own_layer}) uses crate::{root} (layer {used})"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layer order:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn group_imports_are_read() {
    let roots = crate_roots("use crate::{\n    model::{self, X},\n    sync, // crate::node\n};");
    assert_eq!(roots, ["model", "sync"]);
}
