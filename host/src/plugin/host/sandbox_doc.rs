//! The sandbox promise as the documents state it, against the code:
//! `SECURITY.md` lists every row of [`GRANT`] (and no other WASI row), and
//! `SECURITY.md`, `wit/plugin.wit` and `plugin/mod.rs` each say
//! [`PROMISE`] and nothing that contradicts it.

use super::log::{MAX_LOG_LINE_BYTES, MAX_LOG_LINES_PER_CALL};
use super::wasi::{GRANT, Grant, PROMISE};

const SECURITY_MD: &str = include_str!("../../../../SECURITY.md");
const PLUGIN_WIT: &str = include_str!("../../../../wit/plugin.wit");
const PLUGIN_MOD_RS: &str = include_str!("../mod.rs");

/// What the documents once said that the grant contradicts (it links WASI,
/// with its clocks and random numbers, for a component that imports it).
const CONTRADICTIONS: [&str; 4] = [
    "no wasi is linked, so",
    "no clocks",
    "environment or clocks",
    "environment or randomness",
];

/// One grant row as `SECURITY.md`'s table shows it.
fn row(grant: &Grant) -> String {
    let names: Vec<String> = grant.names().map(|name| format!("`{name}`")).collect();
    format!(
        "| {} | {} | {} |",
        names.join(", "),
        grant.policy,
        grant.why
    )
}

/// `text` with comment markers dropped and whitespace collapsed, so that a
/// sentence wrapped across comment lines reads as one.
fn prose(text: &str) -> String {
    text.lines()
        .map(|line| {
            let line = line.trim_start();
            ["//!", "///", "//"]
                .iter()
                .find_map(|marker| line.strip_prefix(marker))
                .unwrap_or(line)
        })
        .collect::<Vec<_>>()
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The module's own doc comment (`//!` lines) of `plugin/mod.rs`, and the
/// package's (`///` lines before `package`) of the WIT.
fn header(text: &str, marker: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .take_while(|line| line.trim().is_empty() || line.starts_with(marker))
        .collect();
    prose(&lines.join("\n"))
}

#[test]
fn security_md_lists_the_grant_row_for_row() {
    let expected: Vec<String> = GRANT.iter().map(row).collect();
    let listed: Vec<&str> = SECURITY_MD
        .lines()
        .filter(|line| line.starts_with("| `wasi:"))
        .collect();
    assert_eq!(
        listed,
        expected,
        "SECURITY.md's WASI table is not plugin/host/wasi.rs's GRANT; the rows should be:\n{}",
        expected.join("\n")
    );
}

#[test]
fn every_document_makes_the_same_promise() {
    let promise = prose(PROMISE);
    let documents = [
        ("SECURITY.md", prose(SECURITY_MD)),
        ("wit/plugin.wit", header(PLUGIN_WIT, "///")),
        ("host/src/plugin/mod.rs", header(PLUGIN_MOD_RS, "//!")),
    ];
    for (name, text) in &documents {
        assert!(
            text.contains(&promise),
            "{name} does not say the sandbox promise (plugin/host/wasi.rs's PROMISE):\n{promise}"
        );
        let lower = text.to_lowercase();
        for contradiction in CONTRADICTIONS {
            assert!(
                !lower.contains(contradiction),
                "{name} says \"{contradiction}\", which the grant contradicts"
            );
        }
    }
}

#[test]
fn security_md_states_the_log_bounds() {
    let text = prose(SECURITY_MD);
    for bound in [
        format!("at most {MAX_LOG_LINE_BYTES} bytes"),
        format!("at most {MAX_LOG_LINES_PER_CALL} lines"),
    ] {
        assert!(text.contains(&bound), "SECURITY.md does not say {bound:?}");
    }
}
