//! The workspace's layout rules, read from the sources (no build needed):
//! - no module circles: among kvroute-core's homes (`wire`, `decision`, `shared`, `flow`,
//!   `conformance`), among their children (`decision::router`, `shared::load`, ...), and among
//!   the updater's top-level modules. Edges are `crate::...` and `super::...` paths in non-test
//!   code (comments, strings, `#[cfg(test)]` items and test files left out);
//! - one meaning per name: no two `pub struct|enum|trait|type` of the workspace's crates share
//!   a name (tests and the fuzz crate left out; a `pub use` is not a definition);
//! - no `.rs` file over 1 000 lines (generated seeds excepted).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`, sorted, skipping build outputs and hidden folders.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "node_modules") {
                    stack.push(p);
                }
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The source with comments and string/char literals blanked (newlines kept).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'"' | b'#')) && !ident_before(b, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: Vec<u8> =
                std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let end = find(b, j + 1, &close).map_or(b.len(), |e| e + close.len());
            for &x in &b[i..end] {
                blank(&mut out, x);
            }
            i = end;
        } else if c == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(b.len());
            for &x in &b[i..end] {
                blank(&mut out, x);
            }
            i = end;
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): blank only the former.
            let end = if b.get(i + 1) == Some(&b'\\') {
                find(b, i + 2, b"'").map(|e| e + 1)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 3)
            } else {
                // A multi-byte char: its closing quote within 5 bytes.
                (i + 2..(i + 6).min(b.len()))
                    .find(|&k| b[k] == b'\'' && b[i + 1] >= 0x80)
                    .map(|k| k + 1)
            };
            match end {
                Some(end) => {
                    for &x in &b[i..end] {
                        blank(&mut out, x);
                    }
                    i = end;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn ident_before(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

fn find(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    (from..b.len().saturating_sub(needle.len() - 1)).find(|&k| b[k..].starts_with(needle))
}

/// The stripped source without `#[cfg(test)]` items.
fn without_tests(stripped: &str) -> String {
    let b = stripped.as_bytes();
    let mut out = b.to_vec();
    let mut from = 0;
    while let Some(at) = stripped[from..].find("#[cfg(test)]").map(|k| k + from) {
        // The item ends at its first `;` outside braces, or with its first brace block.
        let mut i = at;
        let mut depth = 0usize;
        while i < b.len() {
            match b[i] {
                b'{' => depth += 1,
                b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        for x in &mut out[at..i.min(b.len())] {
            if *x != b'\n' {
                *x = b' ';
            }
        }
        from = i.min(b.len());
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a file under a crate's `src/` is test code (a `tests.rs` or in a `tests/` folder).
fn is_test_file(rel: &Path) -> bool {
    rel.components().any(|c| c.as_os_str() == "tests")
        || rel.file_stem().is_some_and(|s| s == "tests")
}

/// The module path of a file under `src/`: `decision/router/plan.rs` → [decision, router, plan].
fn module_path(rel: &Path) -> Vec<String> {
    let mut segs: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        segs.pop();
    }
    segs
}

/// Every path a source names from its crate root: `crate::a::b`, `super::x` (resolved against
/// `here`), with `{..}` groups expanded.
fn referenced_paths(src: &str, here: &[String]) -> Vec<Vec<String>> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = |w: &str| b[i..].starts_with(w.as_bytes()) && !ident_before(b, i);
        let after_colons = i >= 2 && &b[i - 2..i] == b"::";
        if !after_colons && (starts("crate::") || starts("super::")) {
            let (base, rest) = if starts("crate::") {
                (Vec::new(), i + "crate::".len())
            } else {
                let mut base = here.to_vec();
                let mut j = i;
                while b[j..].starts_with(b"super::") {
                    base.pop();
                    j += "super::".len();
                }
                (base, j)
            };
            let end = tree(b, rest, base, &mut out);
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Parses a use tree at `i` (`a::b::c`, `a::{b, c::d}`), pushing each full path; returns its end.
fn tree(b: &[u8], mut i: usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if b.get(i) == Some(&b'{') {
            i += 1;
            loop {
                i = tree(b, i, prefix.clone(), out);
                while i < b.len() && b[i].is_ascii_whitespace() {
                    i += 1;
                }
                match b.get(i) {
                    Some(b',') => i += 1,
                    Some(b'}') => return i + 1,
                    _ => return i,
                }
                while i < b.len() && b[i].is_ascii_whitespace() {
                    i += 1;
                }
                if b.get(i) == Some(&b'}') {
                    return i + 1;
                }
            }
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if i == start {
            // `*` or nothing: the prefix itself.
            out.push(prefix);
            return i;
        }
        let seg = String::from_utf8_lossy(&b[start..i]).into_owned();
        if seg != "self" {
            prefix.push(seg);
        }
        if b[i..].starts_with(b"::") {
            i += 2;
        } else {
            out.push(prefix);
            return i;
        }
    }
}

/// A crate's module graph, nodes as `group(path)` names them.
struct Graph {
    edges: BTreeMap<String, BTreeSet<String>>,
    /// One file that makes each edge, for the message.
    why: BTreeMap<(String, String), String>,
}

fn graph(src: &Path, group: &dyn Fn(&[String]) -> Option<String>) -> Graph {
    let mut g = Graph { edges: BTreeMap::new(), why: BTreeMap::new() };
    for file in rust_files(src) {
        let rel = file.strip_prefix(src).expect("under src").to_path_buf();
        if is_test_file(&rel) || rel.starts_with("bin") {
            continue;
        }
        let here = module_path(&rel);
        let Some(from) = group(&here) else { continue };
        let text = fs::read_to_string(&file).expect("readable source");
        let code = without_tests(&strip(&text));
        // `super::` in a `mod.rs`/`x.rs` resolves against the module itself.
        for path in referenced_paths(&code, &here) {
            let Some(to) = group(&path) else { continue };
            if to != from {
                g.why
                    .entry((from.clone(), to.clone()))
                    .or_insert_with(|| rel.display().to_string());
                g.edges.entry(from.clone()).or_default().insert(to);
            }
        }
        g.edges.entry(from).or_default();
    }
    g
}

/// Every cycle's members (strongly connected components of two or more nodes), each as a path
/// `a -> b -> ... -> a` with the file that makes each step.
fn cycles(g: &Graph) -> Vec<String> {
    let nodes: Vec<&String> = g.edges.keys().collect();
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for m in g.edges.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(*n) || !reachable[n].contains(*n) {
            continue;
        }
        let scc: BTreeSet<String> = reachable[n]
            .iter()
            .filter(|m| reachable.get(m).is_some_and(|r| r.contains(*n)))
            .cloned()
            .collect();
        done.extend(scc.iter().cloned());
        // A shortest way back to `n`, for the message.
        let mut prev: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([(*n).clone()]);
        let mut found = None;
        while let Some(x) = queue.pop_front() {
            for y in g.edges.get(&x).into_iter().flatten() {
                if y == *n {
                    found = Some(x.clone());
                    break;
                }
                if scc.contains(y) && !prev.contains_key(y) {
                    prev.insert(y.clone(), x.clone());
                    queue.push_back(y.clone());
                }
            }
            if found.is_some() {
                break;
            }
        }
        let mut back = Vec::new();
        let mut at = found.expect("a cycle through n");
        while at != **n {
            back.push(at.clone());
            at = prev[&at].clone();
        }
        back.reverse();
        let path: Vec<String> =
            std::iter::once((*n).clone()).chain(back).chain([(*n).clone()]).collect();
        let steps: Vec<String> = path
            .windows(2)
            .map(|w| format!("{} -> {} ({})", w[0], w[1], g.why[&(w[0].clone(), w[1].clone())]))
            .collect();
        out.push(format!(
            "[{}]: {}",
            scc.into_iter().collect::<Vec<_>>().join(", "),
            steps.join(", ")
        ));
    }
    out
}

/// Names the modules a path is in, for a crate whose graph is over `depth`-deep module paths
/// that exist under `src` (deeper paths fold into them; items of a module are the module).
fn module_node(src: &Path, path: &[String], depth: usize) -> Option<String> {
    let mut node = Vec::new();
    for seg in path.iter().take(depth) {
        let mut dir = src.to_path_buf();
        for s in &node {
            dir.push(s);
        }
        if !(dir.join(format!("{seg}.rs")).is_file() || dir.join(seg).join("mod.rs").is_file()) {
            break;
        }
        node.push(seg.clone());
    }
    (!node.is_empty()).then(|| node.join("::"))
}

#[test]
fn core_has_no_module_circles() {
    let src = root().join("core/src");
    let children = |p: &[String]| module_node(&src, p, 2);
    let homes = |p: &[String]| module_node(&src, p, 1);
    let mut found = cycles(&graph(&src, &children));
    found.extend(cycles(&graph(&src, &homes)));
    assert!(found.is_empty(), "module circles in kvroute-core:\n{}", found.join("\n"));
}

#[test]
fn updater_has_no_module_circles() {
    let src = root().join("updater/src");
    let top = |p: &[String]| module_node(&src, p, 1);
    let found = cycles(&graph(&src, &top));
    assert!(found.is_empty(), "module circles in kvroute-updater:\n{}", found.join("\n"));
}

/// The workspace's member folders, from the root `Cargo.toml`.
fn members() -> Vec<String> {
    let manifest = fs::read_to_string(root().join("Cargo.toml")).expect("root Cargo.toml");
    let line = manifest.lines().find(|l| l.trim_start().starts_with("members")).expect("members");
    line.split('"').skip(1).step_by(2).map(str::to_owned).collect()
}

#[test]
fn no_two_public_types_share_a_name() {
    let root = root();
    let mut defs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for member in members() {
        let dir = root.join(&member);
        for sub in ["src", "benches"] {
            let src = dir.join(sub);
            for file in rust_files(&src) {
                let rel = file.strip_prefix(&src).expect("under src");
                // Another member's sources (core/wasm-tests under core) count for that member.
                if is_test_file(rel)
                    || members().iter().any(|m| m != &member && file.starts_with(root.join(m)))
                {
                    continue;
                }
                let code = without_tests(&strip(&fs::read_to_string(&file).expect("readable")));
                for line in code.lines() {
                    let words: Vec<&str> = line.split_whitespace().collect();
                    if let ["pub", kind @ ("struct" | "enum" | "trait" | "type"), name, ..] =
                        words[..]
                    {
                        let name: String =
                            name.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        let at = file
                            .strip_prefix(&root)
                            .expect("in the workspace")
                            .display()
                            .to_string();
                        defs.entry(name).or_default().push(format!("{kind} in {at}"));
                    }
                }
            }
        }
    }
    let shared: Vec<String> = defs
        .iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(n, at)| format!("{n}: {}", at.join(", ")))
        .collect();
    assert!(shared.is_empty(), "public types sharing a name:\n{}", shared.join("\n"));
}

#[test]
fn no_source_file_is_over_1000_lines() {
    let root = root();
    let mut long = Vec::new();
    for file in rust_files(&root) {
        let rel = file.strip_prefix(&root).expect("in the repository");
        if rel == Path::new("fuzz/src/seeds.rs") {
            continue; // generated seeds
        }
        let lines = fs::read_to_string(&file).map(|s| s.lines().count()).unwrap_or(0);
        if lines > 1000 {
            long.push(format!("{} ({lines} lines)", rel.display()));
        }
    }
    assert!(long.is_empty(), "files over 1000 lines (aim under 600):\n{}", long.join("\n"));
}

#[test]
fn the_reference_parser_sees_groups_and_super() {
    let src = "use crate::{a::{b, c::D}, e};\nfn f() { super::super::g::h(); }\n// crate::x::y\n";
    let paths = referenced_paths(&strip(src), &["m".into(), "n".into()]);
    let got: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(got, ["a::b", "a::c::D", "e", "g::h"]);
    let cut = without_tests("x\n#[cfg(test)]\nmod tests {\n  use crate::a;\n}\ny");
    assert!(!cut.contains("crate::a") && cut.contains('y'));
}
