//! What a Markdown file links to and which anchors it offers, read the way
//! GitHub renders it. Pure: text in, links and anchors out.

use std::collections::BTreeSet;

/// One link as written: the line it is on and its target (`path#anchor`).
#[derive(Debug, PartialEq, Eq)]
pub struct Link {
    pub line: usize,
    pub target: String,
}

impl Link {
    /// A link to another site (or a mail address), which no file can check.
    pub fn is_external(&self) -> bool {
        self.target.contains("://") || self.target.starts_with("mailto:")
    }

    /// The file part (empty for a link within the same file) and the anchor.
    pub fn split(&self) -> (&str, Option<&str>) {
        match self.target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (self.target.as_str(), None),
        }
    }
}

/// The lines that are prose, numbered from 1: fenced code blocks are left
/// out, since a `](` or a `#` in code is neither a link nor a heading.
fn prose_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fence: Option<&str> = None;
    text.lines().enumerate().filter_map(move |(index, line)| {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                None
            }
            (Some(open), Some(m)) if open == m => {
                fence = None;
                None
            }
            (Some(_), _) => None,
            (None, None) => Some((index + 1, line)),
        }
    })
}

/// `line` without its code spans (`` `x` ``, ``` ``x`y`` ```): their text is
/// shown as written, never read as a link. A run of backticks with no
/// closing run of the same length is text.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].len() - rest[start..].trim_start_matches('`').len();
        let after = &rest[start + ticks..];
        let fence = &rest[start..start + ticks];
        match find_run(after, fence) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                out.push_str(fence);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Where in `text` a run of exactly `fence` backticks starts.
fn find_run(text: &str, fence: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = text[from..].find(fence) {
        let at = from + found;
        let before = text[..at].ends_with('`');
        let after = text[at + fence.len()..].starts_with('`');
        if !before && !after {
            return Some(at);
        }
        from = at + text[at..].len() - text[at..].trim_start_matches('`').len();
    }
    None
}

/// Every inline link (`[text](target)`, images too) and reference
/// definition (`[label]: target`) in prose.
pub fn links(text: &str) -> Vec<Link> {
    let mut found = Vec::new();
    for (line, raw) in prose_lines(text) {
        let prose = without_code_spans(raw);
        if let Some(target) = reference_definition(&prose) {
            found.push(Link { line, target });
        }
        let mut rest = prose.as_str();
        while let Some(open) = rest.find("](") {
            let after = &rest[open + 2..];
            let Some(close) = after.find(')') else { break };
            // `[x](<path with spaces> "title")`: the target is the first word.
            let target = after[..close]
                .split_whitespace()
                .next()
                .unwrap_or("")
                .trim_start_matches('<')
                .trim_end_matches('>');
            found.push(Link {
                line,
                target: target.to_string(),
            });
            rest = &after[close + 1..];
        }
    }
    found
}

/// `[label]: target` at the start of a line.
fn reference_definition(line: &str) -> Option<String> {
    let rest = line.trim_start().strip_prefix('[')?;
    let (label, after) = rest.split_once("]:")?;
    if label.is_empty() || label.contains(']') {
        return None;
    }
    after.split_whitespace().next().map(str::to_string)
}

/// The anchor GitHub gives a heading: lower case, each space a `-`, every
/// other character that is not a letter, a digit, `-` or `_` dropped.
pub fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of every heading (`#` to `######`) in prose; a heading
/// whose anchor is taken already gets `-1`, `-2`, ... as on GitHub.
pub fn anchors(text: &str) -> BTreeSet<String> {
    let mut taken = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let title = line[hashes..].trim().trim_end_matches('#');
        let base = anchor_of(title);
        let mut anchor = base.clone();
        let mut n = 0;
        while taken.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        taken.insert(anchor);
    }
    taken
}

#[test]
fn anchors_are_computed_as_github_does() {
    assert_eq!(
        anchor_of("The plugin author's loop"),
        "the-plugin-authors-loop"
    );
    assert_eq!(
        anchor_of("Hot swap and the admin endpoint"),
        "hot-swap-and-the-admin-endpoint"
    );
    assert_eq!(
        anchor_of("`plugin run`: one message"),
        "plugin-run-one-message"
    );
    assert_eq!(anchor_of("§3 Retry ladder"), "3-retry-ladder");
    let text = "# Title\n## Notes\n```\n# not a heading\n```\n### Notes\n#hashtag\n";
    let expected: BTreeSet<String> = ["title", "notes", "notes-1"].map(String::from).into();
    assert_eq!(anchors(text), expected);
}

#[test]
fn links_in_code_are_not_links() {
    let text = "See [a](a.md#x) and `[b](b.md)`, ``[c](c.md) ` ``.\n\
                ```\n[d](d.md)\n```\n\
                [e]: e.md\n![f](img/f.png \"F\") [g](https://example.com)\n";
    let found = links(text);
    let pairs: Vec<(usize, &str)> = found.iter().map(|l| (l.line, l.target.as_str())).collect();
    assert_eq!(
        pairs,
        [
            (1, "a.md#x"),
            (5, "e.md"),
            (6, "img/f.png"),
            (6, "https://example.com")
        ]
    );
    assert!(found[3].is_external());
    assert_eq!(found[0].split(), ("a.md", Some("x")));
}
