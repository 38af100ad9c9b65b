//! The README and the pages under `docs/` hold together: the README stays short (at most
//! [`MAX_README_LINES`]) with the two set-up commands on its first screen, every relative link
//! of every page reaches an existing file (and, into a Markdown file, an existing heading), every
//! `./dev <subcommand>` a page names is one `./dev` accepts, and no page names an issue number
//! (what users read stands on its own). Each check is a function of the text, tested on broken
//! inputs too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use kvroute_stack::paths;

use super::repo::markdown_docs;

/// The README is the first screen, not the manual.
const MAX_README_LINES: usize = 250;
/// The two set-up commands appear within this many lines of the README's top.
const FIRST_SCREEN: usize = 60;
/// The two set-up commands, as their lines in the README's first `sh` block start.
const COMMANDS: [&str; 2] = ["./dev demo ", "./dev test "];

fn read(rel: &str) -> String {
    std::fs::read_to_string(paths::repo_root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The lines outside fenced code blocks, with their 0-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i, line));
        }
    }
    out
}

/// The prose of `text` with fenced blocks and inline code spans removed (a code span may
/// continue on the next line of its paragraph, so spans are cut from the joined prose).
fn prose_without_code(text: &str) -> String {
    let joined: Vec<&str> = prose_lines(text).into_iter().map(|(_, l)| l).collect();
    let joined = joined.join("\n");
    joined.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// GitHub's anchor for a heading: lowercase, punctuation other than `-` and `_` dropped,
/// spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a Markdown text (repeated headings get `-1`, `-2`, ... as on GitHub).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim_end_matches('#'));
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// The targets of the inline links and images (`[text](target)`) in a text's prose.
fn links(text: &str) -> Vec<String> {
    let prose = prose_without_code(text);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].split_whitespace().next().unwrap_or_default();
        out.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
        rest = &rest[end..];
    }
    out
}

/// `dir/rel` with `.` and `..` resolved; `None` when it leaves the repository.
fn resolve(dir: &Path, rel: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in dir.join(rel).components() {
        match part {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// The broken relative links of Markdown file `file` (relative to the root), whose text is
/// `text`; `read` gives another file's text (`None`: no such file), `exists` whether a path
/// is a file or a folder.
fn broken_links(
    file: &str,
    text: &str,
    read: &dyn Fn(&Path) -> Option<String>,
    exists: &dyn Fn(&Path) -> bool,
) -> Vec<String> {
    let dir = Path::new(file).parent().unwrap_or(Path::new(""));
    let mut out = Vec::new();
    for target in links(text) {
        if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
            if target.is_empty() {
                out.push(format!("{file}: an empty link"));
            }
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        if path.is_empty() {
            // An anchor of this page.
            if !anchors(text).contains(anchor.unwrap_or_default()) {
                out.push(format!("{file}: {target}: no such heading here"));
            }
            continue;
        }
        let Some(resolved) = resolve(dir, path) else {
            out.push(format!("{file}: {target} leaves the repository"));
            continue;
        };
        if !exists(&resolved) {
            out.push(format!("{file}: {target}: no file {}", resolved.display()));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if resolved.extension().is_none_or(|x| x != "md") {
            continue;
        }
        let Some(target_text) = read(&resolved) else { continue };
        if !anchors(&target_text).contains(anchor) {
            out.push(format!("{file}: {target}: no heading #{anchor} in {}", resolved.display()));
        }
    }
    out
}

/// The subcommands `./dev` accepts: the arms of its `case "$cmd" in` (not `*)`).
fn dev_subcommands(script: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut inside = false;
    for line in script.lines() {
        let line = line.trim();
        if line.starts_with("case \"$cmd\" in") {
            inside = true;
            continue;
        }
        if line == "esac" {
            inside = false;
        }
        let Some((arm, _)) = line.split_once(')') else { continue };
        if inside && !arm.is_empty() && !arm.contains(' ') {
            let names =
                arm.split('|').filter(|n| n.chars().all(|c| c.is_ascii_lowercase() || c == '-'));
            out.extend(names.filter(|n| !n.is_empty()).map(String::from));
        }
    }
    out
}

/// The `./dev <word>` a text names that are not subcommands of `known`.
fn unknown_dev_commands(text: &str, known: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("./dev ") {
        let word: String =
            text[i + 6..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '-').collect();
        if !word.is_empty() && !known.contains(&word) {
            out.push(format!("./dev {word}"));
        }
    }
    out
}

/// What is wrong with the README's top: its length and where the two commands are.
fn readme_shape(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let lines = text.lines().count();
    if lines > MAX_README_LINES {
        out.push(format!("README.md has {lines} lines, at most {MAX_README_LINES}"));
    }
    // The commands as lines of a fenced block within the first screen.
    let first: Vec<&str> = text.lines().take(FIRST_SCREEN).collect();
    let fenced: BTreeSet<usize> = {
        let prose: BTreeSet<usize> =
            prose_lines(&first.join("\n")).into_iter().map(|(i, _)| i).collect();
        (0..first.len()).filter(|i| !prose.contains(i)).collect()
    };
    for command in COMMANDS {
        let found =
            first.iter().enumerate().any(|(i, l)| fenced.contains(&i) && l.starts_with(command));
        if !found {
            out.push(format!(
                "README.md: `{}` is not a command line in its first {FIRST_SCREEN} lines",
                command.trim_end()
            ));
        }
    }
    out
}

/// Lines of a text that name an issue number (`issue 12`, `issues 12 and 20`).
fn issue_numbers(text: &str) -> Vec<String> {
    let lower = text.to_lowercase();
    let mut out = Vec::new();
    for (n, line) in lower.lines().enumerate() {
        for word in ["issue ", "issues "] {
            for (i, _) in line.match_indices(word) {
                if line[i + word.len()..].starts_with(|c: char| c.is_ascii_digit()) {
                    out.push(format!("line {}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    out
}

fn on_disk(p: &Path) -> Option<String> {
    std::fs::read_to_string(paths::repo_root().join(p)).ok()
}

fn exists_on_disk(p: &Path) -> bool {
    paths::repo_root().join(p).exists()
}

#[test]
fn readme_is_short_with_the_two_commands_on_its_first_screen() {
    let found = readme_shape(&read("README.md"));
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn every_relative_link_of_the_readme_and_docs_reaches_a_file_and_heading() {
    let docs = markdown_docs();
    assert!(docs.len() > 5, "README.md and docs/: {docs:?}");
    let mut found = Vec::new();
    for file in &docs {
        found.extend(broken_links(file, &read(file), &on_disk, &exists_on_disk));
    }
    assert!(found.is_empty(), "broken links:\n{}", found.join("\n"));
}

#[test]
fn every_dev_subcommand_named_is_one_dev_accepts() {
    let known = dev_subcommands(&read("dev"));
    for must in ["demo", "test", "up", "setup", "build", "bench"] {
        assert!(known.contains(must), "./dev's case arms {known:?} lack {must}");
    }
    let mut found = Vec::new();
    for file in markdown_docs() {
        found.extend(
            unknown_dev_commands(&read(&file), &known).into_iter().map(|c| format!("{file}: {c}")),
        );
    }
    assert!(found.is_empty(), "not subcommands of ./dev ({known:?}):\n{}", found.join("\n"));
}

#[test]
fn no_page_names_an_issue_number() {
    let mut found = Vec::new();
    for file in &markdown_docs() {
        found.extend(issue_numbers(&read(file)).into_iter().map(|l| format!("{file}: {l}")));
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Each check fails on the way a page can go wrong.
#[test]
fn the_checks_catch_long_readmes_lost_commands_broken_links_and_unknown_subcommands() {
    let readme = read("README.md");
    let has = |found: &[String], needle: &str| found.iter().any(|p| p.contains(needle));
    // Too long; a command moved below the first screen.
    let long = format!("{readme}{}", "more\n".repeat(MAX_README_LINES));
    assert!(has(&readme_shape(&long), "lines, at most"));
    let demo = readme.lines().find(|l| l.starts_with(COMMANDS[0])).expect("the demo line");
    let moved =
        format!("{}\n{}```sh\n{demo}\n```\n", readme.replacen(demo, "", 1), "x\n".repeat(60));
    assert!(has(&readme_shape(&moved), "./dev demo"));
    // The command outside a code block does not count.
    assert!(has(
        &readme_shape("intro\n./dev demo   # x\n```sh\n./dev test   # y\n```\n"),
        "./dev demo"
    ));
    assert!(readme_shape("intro\n```sh\n./dev demo   # x\n./dev test   # y\n```\n").is_empty());

    // Links: a missing file, a missing heading, a link out of the repository; code is not a link.
    let files: BTreeMap<&str, &str> =
        [("docs/a.md", "# A\n\n## Two words, `code` (and more)\n\n## Two words, code and more\n")]
            .into_iter()
            .collect();
    let read = |p: &Path| files.get(p.to_str().unwrap_or_default()).map(|s| s.to_string());
    let exists =
        |p: &Path| files.contains_key(p.to_str().unwrap_or_default()) || p == Path::new("docs");
    let check = |text: &str| broken_links("README.md", text, &read, &exists);
    assert!(check("[a](docs/a.md) [b](docs/a.md#two-words-code-and-more) [c](docs/)").is_empty());
    assert!(
        check("[dup](docs/a.md#two-words-code-and-more-1) [web](https://example.com/x)").is_empty()
    );
    assert!(has(&check("[a](docs/b.md)"), "no file docs/b.md"));
    assert!(has(&check("see [a](docs/a.md#nowhere)"), "no heading #nowhere"));
    assert!(has(&check("[up](../../x.md)"), "leaves the repository"));
    assert!(has(&check("[self](#missing)\n\n# Here\n"), "no such heading here"));
    assert!(check("[self](#here)\n\n# Here\n").is_empty());
    assert!(check("`[a](docs/b.md)` and\n```md\n[b](docs/c.md)\n```\n").is_empty());
    let from_docs = broken_links("docs/a.md", "[r](../README.md) [s](a.md#a)", &read, &exists);
    assert_eq!(from_docs, vec!["docs/a.md: ../README.md: no file README.md".to_string()]);

    // Subcommands: from the case arms only; an unknown one is named.
    let script = "# ./dev nothing\ncmd=x\ncase \"$cmd\" in\n  setup) a ;;\n  up|start)\n    b\n    ;;\n  *)\n    c ;;\nesac\n";
    let known = dev_subcommands(script);
    assert_eq!(known, ["setup", "start", "up"].into_iter().map(String::from).collect());
    assert_eq!(
        unknown_dev_commands("`./dev up --x` then ./dev  and ./dev deploy", &known),
        ["./dev deploy"]
    );

    // Issue numbers.
    assert_eq!(issue_numbers("fixed in Issue 12\nan issue with this\nissues 3").len(), 2);
}
