//! The manual (`docs/`) and the README hold together: every page is in the
//! table of contents (`docs/README.md`) and reached from it, every relative
//! link and `#anchor` resolves, every page with a Rust example is compiled
//! as a doctest (`src/lib.rs`), and the project's own words stay out of it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

/// The workspace root (this package's manifest directory).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown file under `docs/`, relative to the root.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(
                    path.strip_prefix(root())
                        .expect("under the root")
                        .to_path_buf(),
                );
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join("docs"), &mut out);
    out.sort();
    out
}

/// The manual's pages and the README.
fn documents() -> BTreeMap<PathBuf, String> {
    let mut docs = BTreeMap::new();
    for page in pages().into_iter().chain([PathBuf::from("README.md")]) {
        let text = std::fs::read_to_string(root().join(&page))
            .unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        docs.insert(page, text);
    }
    docs
}

/// The text outside fenced code blocks, line by line (with line numbers).
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((n + 1, line));
        }
    }
    out
}

/// A heading's anchor as GitHub makes it: lower case, spaces to `-`,
/// punctuation other than `-` and `_` dropped; repeats get `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let Some(title) = line.strip_prefix('#').map(|t| t.trim_start_matches('#')) else {
            continue;
        };
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let count = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *count == 0 {
            slug.clone()
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    out
}

/// The targets of the inline links `[text](target)` outside code, with
/// their line numbers. Code spans are skipped.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(text) {
        let mut in_code = false;
        let bytes = line.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'`' => in_code = !in_code,
                b']' if !in_code && bytes.get(i + 1) == Some(&b'(') => {
                    if let Some(end) = line[i + 2..].find(')') {
                        out.push((n, line[i + 2..i + 2 + end].to_string()));
                        i += end + 2;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
    out
}

/// `base`'s directory joined with `relative`, `..` resolved lexically.
fn resolve(base: &Path, relative: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for part in base
        .parent()
        .unwrap_or(Path::new(""))
        .join(relative)
        .components()
    {
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

/// Every relative link of the manual and the README, resolved: the page
/// (or file, or directory) it names, and the anchor on that page.
fn resolved_links(docs: &BTreeMap<PathBuf, String>) -> Vec<(String, PathBuf, Option<String>)> {
    let mut out = Vec::new();
    for (page, text) in docs {
        for (line, target) in links(text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let place = format!("{}:{line}: ({target})", page.display());
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor.to_string())),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.clone()
            } else {
                resolve(page, path)
            };
            out.push((place, file, anchor));
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let docs = documents();
    let mut broken = Vec::new();
    for (place, file, anchor) in resolved_links(&docs) {
        if !root().join(&file).exists() {
            broken.push(format!("{place}: no file {}", file.display()));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        match docs.get(&file) {
            Some(text) if anchors(text).contains(&anchor) => {}
            Some(_) => broken.push(format!(
                "{place}: no heading #{anchor} in {}",
                file.display()
            )),
            None => broken.push(format!("{place}: #{anchor} in a file that is no page")),
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_page_is_in_the_contents_and_reached_from_the_readme() {
    let docs = documents();
    let contents = PathBuf::from("docs/README.md");
    let listed: BTreeSet<PathBuf> = links(&docs[&contents])
        .into_iter()
        .filter(|(_, t)| !t.contains("://") && !t.contains('#'))
        .map(|(_, t)| resolve(&contents, &t))
        .collect();
    let missing: Vec<String> = pages()
        .into_iter()
        .filter(|p| *p != contents && !listed.contains(p))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "pages not in the table of contents (docs/README.md): {missing:?}"
    );

    // No orphan: every page is reached by following links from the README.
    let mut reached = BTreeSet::from([PathBuf::from("README.md")]);
    let mut todo = vec![PathBuf::from("README.md")];
    let all = resolved_links(&docs);
    while let Some(page) = todo.pop() {
        let prefix = format!("{}:", page.display());
        for (place, file, _) in &all {
            if place.starts_with(&prefix) && docs.contains_key(file) && reached.insert(file.clone())
            {
                todo.push(file.clone());
            }
        }
    }
    let orphans: Vec<String> = docs
        .keys()
        .filter(|p| !reached.contains(*p))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        orphans.is_empty(),
        "pages no link from the README leads to: {orphans:?}"
    );
}

#[test]
fn every_page_with_rust_examples_is_compiled_as_doctests() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs");
    let untested: Vec<String> = documents()
        .into_iter()
        .filter(|(_, text)| {
            text.lines()
                .any(|l| l.trim_start().starts_with("```rust") && !l.contains("ignore"))
        })
        .map(|(page, _)| page.display().to_string())
        .filter(|page| !lib.contains(&format!("include_str!(\"../{page}\")")))
        .collect();
    assert!(
        untested.is_empty(),
        "pages with Rust examples that src/lib.rs does not include as doctests: {untested:?}"
    );
}

#[test]
fn the_readme_fits_on_a_few_screens() {
    let lines = documents()[&PathBuf::from("README.md")].lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; the manual (docs/) takes the rest"
    );
}

#[test]
fn the_anchors_follow_github() {
    let text = "# A page\n## Why this order\n## `ops resume`, again\n```\n# not a heading\n```\n## Why this order\n";
    let found = anchors(text);
    let expected: BTreeSet<String> = [
        "a-page",
        "why-this-order",
        "ops-resume-again",
        "why-this-order-1",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(found, expected);
    assert_eq!(
        links("see [a](b.md#c) and `[x](y)` and [d](../e.md)"),
        vec![(1, "b.md#c".to_string()), (1, "../e.md".to_string())]
    );
}

/// The project speaks of its subject, moving the control plane to new
/// machines, never of the in-house name for the field reports behind it.
#[test]
fn the_in_house_name_appears_nowhere() {
    // Spelled in pieces so that this file does not hold it either.
    let words = [
        concat!("se", "eds"),
        concat!("se", "ed's"),
        concat!("se", "ed 0"),
    ];
    let mut found = Vec::new();
    let mut todo = vec![root()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                if !matches!(name, "target" | ".git" | "node_modules") {
                    todo.push(path);
                }
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue; // not text
            };
            for (n, line) in text.lines().enumerate() {
                let lower = line.to_lowercase();
                if words.iter().any(|w| lower.contains(w)) {
                    found.push(format!("{}:{}: {line}", path.display(), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "say what it is (moving the control plane to new machines):\n{}",
        found.join("\n")
    );
}
