//! The service's house of layers, read from its sources: each folder of `envoy/src` names
//! only the folders before it in the flow (config, redis, telemetry, decision, transport), and
//! no two files name each other, directly or round a longer circle. A name counts wherever
//! code says `crate::…` (a `use`, a path in an expression); comments do not count.

#![cfg(test)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The folders in the order a request flows through them; each may name those before it.
const FLOW: [&str; 5] = ["config", "redis", "telemetry", "decision", "transport"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, as its path relative to `src` without `.rs`
/// (`config/settings/xds`), `mod.rs` named by its folder.
fn files(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src()).unwrap().with_extension("");
            let rel = rel.to_str().unwrap().to_string();
            out.push(rel.strip_suffix("/mod").unwrap_or(&rel).to_string());
        }
    }
}

/// The code of a file with its comments removed (line comments and doc comments; the
/// sources hold no block comments), string literals kept.
fn code(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| match l.find(" // ") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The files `text` names through `crate::`: the longest path of each `crate::a::b::c` (or
/// `crate::a::{b, c::d}`) that is a file of `known`.
fn named(text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || "_:{}, \n".contains(c)))
            .unwrap_or(rest.len());
        let path = &rest[..end];
        // `a::b::{c, d::e}`: the prefix, then each branch (one level of braces is enough).
        let (prefix, branches) = match path.find('{') {
            Some(b) => {
                let inner = &path[b + 1..path.find('}').unwrap_or(path.len())];
                (&path[..b], inner.split(',').map(str::trim).collect())
            }
            None => (path.trim(), vec![""]),
        };
        for branch in branches {
            let full = format!("{prefix}{branch}");
            let parts: Vec<&str> = full
                .split("::")
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .collect();
            for n in (1..=parts.len()).rev() {
                let candidate = parts[..n].join("/");
                if known.contains(&candidate) {
                    out.insert(candidate);
                    break;
                }
            }
        }
    }
    out
}

/// Each file (outside `bin/` and `main.rs`, which wires them) and the files it names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let known: BTreeSet<String> = all.iter().cloned().collect();
    all.iter()
        .filter(|f| *f != "main" && !f.starts_with("bin/"))
        .map(|f| {
            let path = if src().join(format!("{f}.rs")).exists() {
                src().join(format!("{f}.rs"))
            } else {
                src().join(f).join("mod.rs")
            };
            let text = std::fs::read_to_string(path).unwrap();
            let mut names = named(&code(&text), &known);
            names.remove(f);
            (f.clone(), names)
        })
        .collect()
}

fn floor(file: &str) -> usize {
    let folder = file.split('/').next().unwrap_or(file);
    FLOW.iter()
        .position(|f| *f == folder)
        .unwrap_or_else(|| panic!("{file} is in no folder of the flow {FLOW:?}"))
}

#[test]
fn no_file_names_a_folder_after_its_own() {
    let graph = graph();
    assert!(graph.len() > 20, "read too few files: {graph:?}");
    let mut climbs = Vec::new();
    for (file, names) in &graph {
        for name in names {
            if floor(name) > floor(file) {
                climbs.push(format!("{file} -> {name}"));
            }
        }
    }
    assert!(climbs.is_empty(), "imports that climb back up: {climbs:#?}");
}

#[test]
fn no_circle_between_files() {
    let graph = graph();
    // Depth-first search; a name met while still on the path closes a circle.
    fn visit(
        file: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        circles: &mut Vec<String>,
    ) {
        if done.contains(file) {
            return;
        }
        if let Some(at) = path.iter().position(|p| p == file) {
            let mut circle = path[at..].to_vec();
            circle.push(file.to_string());
            circles.push(circle.join(" -> "));
            return;
        }
        path.push(file.to_string());
        for name in graph.get(file).into_iter().flatten() {
            visit(name, graph, path, done, circles);
        }
        path.pop();
        done.insert(file.to_string());
    }
    let mut done = BTreeSet::new();
    let mut circles = Vec::new();
    for file in graph.keys() {
        visit(file, &graph, &mut Vec::new(), &mut done, &mut circles);
    }
    assert!(
        circles.is_empty(),
        "files that import each other: {circles:#?}"
    );
}

#[test]
fn the_settings_are_leaves_every_part_reads() {
    // The settings (config/settings.rs and each part's in config/settings/) name nothing of
    // the crate but the environment readers and one another.
    let graph = graph();
    let mut reaching = Vec::new();
    for (file, names) in &graph {
        if file == "config/settings" || file.starts_with("config/settings/") {
            for name in names {
                if name != "config/env" && !name.starts_with("config/settings") {
                    reaching.push(format!("{file} -> {name}"));
                }
            }
        }
    }
    assert!(graph.contains_key("config/settings"), "{graph:?}");
    assert!(
        reaching.is_empty(),
        "settings that are not leaves: {reaching:#?}"
    );
}

#[test]
fn a_file_and_its_folder_are_told_apart() {
    // A file and a folder of one name (`config/settings.rs`, `config/settings/`): a name of
    // the folder's file is that file, not the one above it.
    let known: BTreeSet<String> = ["config/settings", "config/settings/xds", "config/env"]
        .map(String::from)
        .into();
    let names = named(
        "use crate::config::settings::xds::XdsSettings;\nuse crate::config::{env::go, settings};",
        &known,
    );
    let want: BTreeSet<String> = ["config/settings/xds", "config/env", "config/settings"]
        .map(String::from)
        .into();
    assert_eq!(names, want);
}
