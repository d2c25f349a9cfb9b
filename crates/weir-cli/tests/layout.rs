//! The source tree's shape, kept true by a test: no file over 600 lines, and no import cycle
//! between the files of a crate (`docs/architecture.md`, "Where things go").
//!
//! A file depends on another when it names it by a `crate::`, `super::` or `self::` path
//! outside comments and its unit tests (a file's own `tests.rs` or `mod tests` block). A file
//! naming its own parent or child module is not counted: a parent lists its children, and a
//! child is a part of its parent; between any two other files, one way only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most lines a source file may have.
const MAX_LINES: usize = 600;

const CRATES: [&str; 6] = [
    "weir",
    "weir-api",
    "weir-bench",
    "weir-cli",
    "weir-cluster",
    "weir-server",
];

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file's module path in its crate: `a::b` for `src/a/b.rs` or `src/a/b/mod.rs`; empty for
/// `lib.rs` or `main.rs`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file
        .strip_prefix(src)
        .unwrap()
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The file's code, without comments and unit tests.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths `code` names from `module` (its own module path), as module paths of the crate,
/// longest first as written. `self::` is the module itself and `super::` its parent, whether
/// the module is a `name.rs` or a `name/mod.rs`.
fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let here: Vec<String> = module.to_vec();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(found) = code[from..].find(start) {
            let at = from + found;
            from = at + start.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let mut base = match start {
                "crate::" => Vec::new(),
                "self::" => here.clone(),
                _ => here[..here.len().saturating_sub(1)].to_vec(),
            };
            let rest = &code[from..];
            let mut segments: Vec<&str> = Vec::new();
            let mut tail = rest;
            loop {
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                if end == 0 {
                    break;
                }
                segments.push(&tail[..end]);
                if !tail[end..].starts_with("::") {
                    break;
                }
                tail = &tail[end + 2..];
            }
            while segments.first() == Some(&"super") {
                segments.remove(0);
                base.pop();
            }
            let mut path = base;
            path.extend(segments.iter().map(|s| (*s).to_owned()));
            // `use super::{a, b}`, `crate::x::{y, z}`: each name in the braces.
            if tail.starts_with('{') {
                let inner = &tail[1..tail.find('}').unwrap_or(tail.len())];
                for name in inner.split(',') {
                    let name = name.trim().split("::").next().unwrap_or("").trim();
                    if !name.is_empty() {
                        let mut p = path.clone();
                        p.push(name.to_owned());
                        paths.push(p);
                    }
                }
            }
            paths.push(path);
        }
    }
    paths
}

#[test]
fn no_source_file_is_over_600_lines() {
    let mut long = Vec::new();
    for krate in CRATES {
        let mut files = Vec::new();
        sources(&crates_dir().join(krate).join("src"), &mut files);
        for file in files {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            if lines > MAX_LINES {
                long.push(format!("{} ({lines} lines)", file.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines — split them by job:\n{}",
        long.join("\n")
    );
}

/// The import cycles among a crate's files (module path → code): one through each file that
/// reaches itself, each set of files once.
fn cycles(files: &BTreeMap<Vec<String>, String>) -> Vec<Vec<Vec<String>>> {
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, text) in files {
        if module.last().is_some_and(|m| m == "tests") {
            continue;
        }
        let code = code_of(text);
        let targets = edges.entry(module.clone()).or_default();
        for path in named_paths(&code, module) {
            // The longest prefix of the path that is a file of the crate.
            let target = (1..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|p| files.contains_key(p));
            if let Some(target) = target
                && target != *module
                && !module.starts_with(&target)
                && !target.starts_with(module)
            {
                targets.insert(target);
            }
        }
    }
    // A cycle is a file that reaches itself.
    let mut found: Vec<Vec<Vec<String>>> = Vec::new();
    let mut sets: BTreeSet<BTreeSet<Vec<String>>> = BTreeSet::new();
    'starts: for start in edges.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(Vec<String>, Vec<Vec<String>>)> =
            vec![(start.clone(), vec![start.clone()])];
        while let Some((at, trail)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if next == start {
                    let mut cycle = trail.clone();
                    if sets.insert(cycle.iter().cloned().collect()) {
                        cycle.push(start.clone());
                        found.push(cycle);
                    }
                    continue 'starts;
                }
                if seen.insert(next.clone()) {
                    let mut longer = trail.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    found
}

#[test]
fn no_import_cycle_between_files() {
    let mut found = Vec::new();
    for krate in CRATES {
        let src = crates_dir().join(krate).join("src");
        let mut paths = Vec::new();
        sources(&src, &mut paths);
        let files: BTreeMap<Vec<String>, String> = paths
            .iter()
            .map(|file| {
                (
                    module_of(&src, file),
                    std::fs::read_to_string(file).unwrap(),
                )
            })
            .collect();
        for cycle in cycles(&files) {
            let names: Vec<String> = cycle
                .iter()
                .map(|m| format!("`{}`", m.join("::")))
                .collect();
            found.push(format!("{krate}: {}", names.join(" → ")));
        }
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

/// The guard itself, on small trees: each way of naming another file is read as the compiler
/// reads it, from a `name.rs` as from a `name/mod.rs`.
mod guard {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> BTreeMap<Vec<String>, String> {
        files
            .iter()
            .map(|(module, code)| {
                let path = if module.is_empty() {
                    Vec::new()
                } else {
                    module.split("::").map(str::to_owned).collect()
                };
                (path, (*code).to_owned())
            })
            .collect()
    }

    #[test]
    fn a_sibling_named_through_super_from_a_plain_file_is_an_edge() {
        // `a/b.rs` and `a/c.rs` naming each other through their parent `a`.
        let files = tree(&[
            ("", "mod a;"),
            ("a", "mod b; mod c;"),
            ("a::b", "use super::c::C;\npub struct B;"),
            ("a::c", "use super::b::B;\npub struct C;"),
        ]);
        let cycle = cycles(&files).pop().expect("b and c name each other");
        assert!(cycle.contains(&vec!["a".to_owned(), "b".to_owned()]));
        assert!(cycle.contains(&vec!["a".to_owned(), "c".to_owned()]));
    }

    #[test]
    fn one_way_only_is_no_cycle() {
        let files = tree(&[
            ("", "mod a;"),
            ("a", "mod b; mod c;"),
            ("a::b", "use super::c::C;"),
            ("a::c", "pub struct C;"),
        ]);
        assert!(cycles(&files).is_empty());
    }

    #[test]
    fn braces_self_and_crate_paths_are_read() {
        // `x.rs` names `y::z` inside braces; `z` names `x` through `super::super::`.
        let files = tree(&[
            ("", "mod x; mod y;"),
            ("x", "use crate::y::{z::Z, Y};"),
            ("y", "mod z; pub use self::z::Z; pub struct Y;"),
            ("y::z", "use super::super::x::X; pub struct Z;"),
        ]);
        let cycle = cycles(&files).pop().expect("x → y::z → x");
        assert_eq!(cycle.first(), cycle.last());
        // Without `z`'s edge back there is none.
        let mut fixed = files.clone();
        fixed.insert(
            vec!["y".to_owned(), "z".to_owned()],
            "pub struct Z;".to_owned(),
        );
        assert!(cycles(&fixed).is_empty());
    }

    #[test]
    fn comments_and_unit_tests_are_not_edges() {
        let files = tree(&[
            ("", "mod a; mod b;"),
            (
                "a",
                "// crate::b::B is mentioned only here\npub struct A;\n#[cfg(test)]\nmod tests {\n    use crate::b::B;\n}",
            ),
            ("b", "use crate::a::A;\npub struct B;"),
        ]);
        assert!(cycles(&files).is_empty());
    }
}
