//! `docs/architecture.md` held to the tree: every source file of every crate is named in its
//! crate's table exactly once, and every file or folder the tables name exists.
//!
//! How a table names a file: a row's first cell names files or folders by their path in the
//! crate (`src/app/mod.rs`, `src/front_door/http/`); its second cell may name more files by a
//! path relative to a folder of the first cell (`body.rs` under `src/front_door/http/`), to the
//! crate's `src/`, or to the folder of a file in the first cell. Files of a crate's `tests/`,
//! `benches/` and `examples/` may instead be covered by a folder a first cell names whole.
//! Unit tests (`tests.rs`, anything under a `tests/` folder inside `src/`) are part of the module
//! they test and need no row.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_owned()
}

/// Every `.rs` file under `dir`, relative to `root`.
fn sources(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).unwrap();
            out.push(relative.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The backticked spans of a table cell.
fn spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// A span that names a path: a `.rs` file or a folder, with no placeholder in it.
fn is_path(span: &str) -> bool {
    !span.contains(['<', ' ', ':', '*']) && (span.ends_with(".rs") || span.ends_with('/'))
}

/// One crate's table: each file it names, with how many times.
#[derive(Default)]
struct Table {
    named: BTreeMap<String, usize>,
    folders: Vec<String>,
    missing: Vec<String>,
}

impl Table {
    fn read_row(&mut self, crate_dir: &Path, row: &str) {
        let cells: Vec<&str> = row.trim().trim_matches('|').split(" | ").collect();
        let [first, rest @ ..] = cells.as_slice() else {
            return;
        };
        let exists = |path: &str| crate_dir.join(path).exists();
        let mut bases = vec!["src/".to_owned()];
        for span in spans(first).into_iter().filter(|s| is_path(s)) {
            if !exists(span) {
                self.missing.push(span.to_owned());
                continue;
            }
            if span.ends_with('/') {
                bases.insert(0, span.to_owned());
                self.folders.push(span.to_owned());
            } else {
                *self.named.entry(span.to_owned()).or_default() += 1;
                if let Some(parent) = Path::new(span).parent() {
                    bases.push(format!("{}/", parent.to_string_lossy()));
                }
            }
        }
        for span in rest
            .iter()
            .flat_map(|cell| spans(cell))
            .filter(|s| is_path(s) && s.ends_with(".rs"))
        {
            match bases
                .iter()
                .map(|b| format!("{b}{span}"))
                .find(|p| exists(p))
            {
                Some(path) => *self.named.entry(path).or_default() += 1,
                None => self.missing.push(span.to_owned()),
            }
        }
    }

    fn covers(&self, file: &str) -> bool {
        self.named.contains_key(file)
            || (!file.starts_with("src/") && self.folders.iter().any(|f| file.starts_with(f)))
    }
}

/// Each crate's section of the map: `## \`crates/NAME\` — …` up to the next heading.
fn tables(map: &str) -> BTreeMap<String, Table> {
    let root = workspace();
    let mut tables = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in map.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            current = heading
                .strip_prefix("`crates/")
                .and_then(|rest| rest.split('`').next())
                .map(str::to_owned);
            continue;
        }
        let Some(name) = &current else { continue };
        if line.starts_with('|') && !line.starts_with("|---") && !line.starts_with("| file ") {
            let table: &mut Table = tables.entry(name.clone()).or_default();
            table.read_row(&root.join("crates").join(name), line);
        }
    }
    tables
}

fn is_unit_test(file: &str) -> bool {
    file.starts_with("src/") && (file.ends_with("/tests.rs") || file.contains("/tests/"))
}

#[test]
fn every_source_file_is_on_the_map_once() {
    let root = workspace();
    let map = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let tables = tables(&map);
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let crate_dir = entry.unwrap().path();
        let name = crate_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let Some(table) = tables.get(&name) else {
            problems.push(format!("crates/{name} has no section in the map"));
            continue;
        };
        let mut files = Vec::new();
        for dir in ["src", "tests", "benches", "examples"] {
            sources(&crate_dir, &crate_dir.join(dir), &mut files);
        }
        files.retain(|f| !is_unit_test(f));
        for file in files.iter().filter(|f| !table.covers(f)) {
            problems.push(format!("crates/{name}/{file} is not on the map"));
        }
        for (file, times) in table.named.iter().filter(|(_, n)| **n > 1) {
            problems.push(format!("crates/{name}/{file} is named {times} times"));
        }
        for span in &table.missing {
            problems.push(format!(
                "crates/{name}: the map names `{span}`, which is not there"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/architecture.md and the tree differ:\n{}",
        problems.join("\n")
    );
}

/// The reader itself, on a small table: names resolved against the row's folder, `src/` and a
/// first-cell file's folder; a name twice and a name of nothing both caught.
#[test]
fn the_map_reader_resolves_names_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    for file in [
        "src/lib.rs",
        "src/a/mod.rs",
        "src/a/b.rs",
        "src/c.rs",
        "src/c/d.rs",
    ] {
        let path = dir.path().join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "").unwrap();
    }
    let mut table = Table::default();
    table.read_row(dir.path(), "| `src/a/` | `mod.rs` and `b.rs` |");
    table.read_row(
        dir.path(),
        "| `src/c.rs` | with `c/d.rs` and `lib.rs` and `gone.rs` |",
    );
    table.read_row(
        dir.path(),
        "| `src/lib.rs` | again; `a/<name>.rs` is a placeholder |",
    );
    let named: Vec<_> = table.named.iter().map(|(f, n)| (f.as_str(), *n)).collect();
    assert_eq!(
        named,
        [
            ("src/a/b.rs", 1),
            ("src/a/mod.rs", 1),
            ("src/c.rs", 1),
            ("src/c/d.rs", 1),
            ("src/lib.rs", 2),
        ]
    );
    assert_eq!(table.missing, ["gone.rs"]);
    assert!(!table.covers("src/e.rs"));
}
