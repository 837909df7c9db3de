//! The documentation against what it documents: the configuration
//! reference (`docs/configuration.md`) against the real parser (every key the
//! table lists is one the parser accepts, and every key the parser accepts
//! is in the table), and every relative link of every Markdown file against
//! the files and headings it points to.
//!
//! The parser refuses unknown keys and names the ones it knows ("unknown
//! field `x`, expected one of `a`, `b`"), so each table's keys are learnt by
//! offering it a key it cannot know.

#[path = "docs/markdown.rs"]
mod markdown;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use acemq_host::config::LoadedConfig;
use acemq_tests::host::workspace_root;

const PROBE: &str = "zz_not_a_key";

/// Keys the parser reads that are not settings: `admin_token` is parsed
/// only to be refused with a sentence saying where the token goes instead.
const NOT_SETTINGS: [(&str, &str); 1] = [("host", "admin_token")];

/// The page of the configuration reference, from the workspace root.
const CONFIGURATION_REFERENCE: &str = "docs/configuration.md";

/// The reference's table: config table (as written, `[[queues]]` -> `queues`,
/// `[retry.NAME]` -> `retry.NAME`) to the keys it lists.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let page = std::fs::read_to_string(workspace_root().join(CONFIGURATION_REFERENCE)).unwrap();
    let mut tables: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for row in page.lines().filter(|l| l.starts_with("| `")) {
        let cell = row.split('|').nth(1).unwrap().trim().trim_matches('`');
        let (table, keys) = cell.split_once(']').expect("a row starts with its [table]");
        let table = table.trim_start_matches('[').to_string();
        let keys = keys.trim_start_matches(']').trim();
        if keys.is_empty() {
            // `[consumers.config]`: a table of its own, a key of its parent.
            let (parent, key) = table.rsplit_once('.').expect("a nested table");
            tables.entry(parent.into()).or_default().insert(key.into());
            continue;
        }
        // A nested table (`[broker.tls]`) is also a key of its parent; a
        // table of named ones (`[state.namespaces.NAME]`) is its parent's
        // key without the name (`[retry.NAME]` is a top-level table's).
        let named = table.strip_suffix(".NAME").unwrap_or(&table);
        if let Some((parent, key)) = named.rsplit_once('.') {
            tables.entry(parent.into()).or_default().insert(key.into());
        }
        let entry = tables.entry(table).or_default();
        for key in keys.split(',') {
            entry.insert(key.trim().to_string());
        }
    }
    tables
}

/// The keys the parser accepts in `table` (`""`: the top level).
fn accepted(table: &str) -> BTreeSet<String> {
    let header = match table {
        "" => String::new(),
        "exchanges" | "queues" | "bindings" | "consumers" | "codecs" => format!("[[{table}]]\n"),
        "retry.NAME" => "[retry.p]\n".to_string(),
        // A table of each consumer's: inside one.
        "consumers.candidate" => "[[consumers]]\n[consumers.candidate]\n".to_string(),
        other => format!("[{other}]\n"),
    };
    let text = format!("{header}{PROBE} = 1\n");
    let error = LoadedConfig::parse(Path::new("probe.toml"), text)
        .expect_err("an unknown key is refused")
        .to_string();
    let expected = error
        .split("expected")
        .nth(1)
        .unwrap_or_else(|| panic!("the refusal names no known keys: {error}"));
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .filter(|key| !NOT_SETTINGS.contains(&(table, key.as_str())))
        .collect()
}

#[test]
fn the_configuration_reference_lists_exactly_the_keys_the_parser_accepts() {
    let documented = documented();
    let mut tables: BTreeSet<String> = documented.keys().cloned().collect();
    // Every top-level table the parser knows is documented.
    for top in accepted("") {
        let written = if top == "retry" {
            "retry.NAME".to_string()
        } else {
            top.clone()
        };
        assert!(
            tables.contains(&written),
            "the parser accepts [{top}], which {CONFIGURATION_REFERENCE} does not list"
        );
        tables.insert(written);
    }
    for table in tables {
        let listed = documented.get(&table).cloned().unwrap_or_default();
        let parsed = accepted(&table);
        let undocumented: Vec<_> = parsed.difference(&listed).collect();
        let unknown: Vec<_> = listed.difference(&parsed).collect();
        assert!(
            undocumented.is_empty(),
            "[{table}]: the parser accepts {undocumented:?}, which {CONFIGURATION_REFERENCE} does not list"
        );
        assert!(
            unknown.is_empty(),
            "[{table}]: {CONFIGURATION_REFERENCE} lists {unknown:?}, which the parser refuses"
        );
    }
}

/// Folders (by name anywhere, or by path from the root) whose Markdown is not
/// the project's: build output, installed tools, generated bindings, and the
/// conformance fixtures, kept byte for byte as upstream wrote them (see
/// `tests/fixtures/README.md`). Hidden folders (`.git`) are skipped too.
const NOT_DOCUMENTATION: [&str; 4] = ["target", "node_modules", "bindings", "tests/fixtures/acemq"];

/// Every Markdown file of the repository, relative to its root, in order.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![PathBuf::new()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(root.join(&folder)).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let relative = folder.join(&name);
            let skipped = name.starts_with('.')
                || NOT_DOCUMENTATION
                    .iter()
                    .any(|n| relative == Path::new(n) || name == *n);
            if skipped {
                continue;
            }
            if entry.file_type().unwrap().is_dir() {
                folders.push(relative);
            } else if name.ends_with(".md") {
                found.push(relative);
            }
        }
    }
    found.sort();
    found
}

/// Why `link`, written in `file` (relative to `root`), leads nowhere; `None`
/// when the file it names exists inside the repository and, for an anchor,
/// when that file is Markdown with a heading of that anchor.
fn broken(root: &Path, file: &Path, link: &markdown::Link) -> Option<String> {
    let (path, anchor) = link.split();
    let target = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent().unwrap().join(path)
    };
    let Ok(resolved) = root.join(&target).canonicalize() else {
        return Some(format!("{} does not exist", target.display()));
    };
    if !resolved.starts_with(root.canonicalize().unwrap()) {
        return Some(format!("{} is outside the repository", target.display()));
    }
    let anchor = anchor?;
    if resolved.extension().is_none_or(|e| e != "md") {
        return Some(format!(
            "#{anchor}: only a Markdown file's anchors can be checked, and {} is not one",
            target.display()
        ));
    }
    let text = std::fs::read_to_string(&resolved).unwrap();
    if markdown::anchors(&text).contains(anchor) {
        return None;
    }
    Some(format!(
        "{} has no heading whose anchor is #{anchor}",
        target.display()
    ))
}

#[test]
fn every_relative_link_in_readme_and_docs_resolves() {
    let root = workspace_root();
    let files = markdown_files(&root);
    for expected in [
        "README.md",
        "docs/configuration.md",
        "docs/plugins/sandbox.md",
    ] {
        assert!(
            files.contains(&PathBuf::from(expected)),
            "{expected} is not among the Markdown files read: {files:?}"
        );
    }
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for link in markdown::links(&text).iter().filter(|l| !l.is_external()) {
            if let Some(why) = broken(&root, file, link) {
                problems.push(format!(
                    "{}:{}: ({}): {why}",
                    file.display(),
                    link.line,
                    link.target
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "links that lead nowhere:\n{}",
        problems.join("\n")
    );
}
