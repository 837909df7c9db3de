//! The AceMQ contract fixtures in `tests/fixtures/acemq/` are a byte-for-byte
//! copy of the cross-language conformance fixtures (see
//! `tests/fixtures/README.md`). Where the development workspace holds the
//! upstream copy beside the repository, this test checks that the two are
//! identical, file by file in both directions; in a clone without it, the
//! comparison is skipped (and says so), and the test passes. No broker needed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The fixtures as this repository keeps them.
const IN_REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/acemq");

/// The upstream copy of the fixtures in the development workspace, relative
/// to the repository root. An ordinary clone has no such folder.
const UPSTREAM: &str = "../shared/fixtures/acemq";

#[test]
fn in_repo_fixtures_are_the_upstream_copy() {
    let repo_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let upstream = repo_root.join(UPSTREAM);
    match compare(Path::new(IN_REPO), &upstream) {
        Ok(Compared::Identical { files }) => {
            assert!(files > 0, "no fixture files in {IN_REPO}");
        }
        Ok(Compared::Skipped(report)) => eprintln!("{report}"),
        Err(differences) => panic!("{differences}"),
    }
}

/// What [`compare`] found when the two copies agree, or could not be compared.
#[derive(Debug, PartialEq, Eq)]
enum Compared {
    /// Both folders hold the same files with the same bytes.
    Identical { files: usize },
    /// The upstream folder does not exist; the report says so.
    Skipped(String),
}

/// Compares the folder `ours` with `upstream`, every file in both directions
/// (subfolders included, by relative path). `Err` names every difference: a
/// file missing here, an extra file here, and a differing file with the
/// offset of its first differing byte.
fn compare(ours: &Path, upstream: &Path) -> Result<Compared, String> {
    if !upstream.exists() {
        return Ok(Compared::Skipped(format!(
            "fixtures: skipped the comparison with the upstream copy, because {} is absent",
            upstream.display()
        )));
    }
    let theirs = files_under(upstream)?;
    let mine = files_under(ours)?;

    let mut differences = Vec::new();
    for (name, upstream_bytes) in &theirs {
        match mine.get(name) {
            None => differences.push(format!(
                "missing file: {name} is in {} but not in {}",
                upstream.display(),
                ours.display()
            )),
            Some(our_bytes) => {
                if let Some(offset) = first_difference(our_bytes, upstream_bytes) {
                    differences.push(format!(
                        "differing file: {name} first differs at byte offset {offset} \
                         ({} here, {} upstream; {} bytes here, {} upstream)",
                        byte_at(our_bytes, offset),
                        byte_at(upstream_bytes, offset),
                        our_bytes.len(),
                        upstream_bytes.len()
                    ));
                }
            }
        }
    }
    for name in mine.keys().filter(|name| !theirs.contains_key(*name)) {
        differences.push(format!(
            "extra file: {name} is in {} but not in {}",
            ours.display(),
            upstream.display()
        ));
    }

    if differences.is_empty() {
        return Ok(Compared::Identical { files: mine.len() });
    }
    let mut report = format!(
        "the fixtures in {} are not a byte-for-byte copy of {}; replace them with the upstream \
         copy as a whole, never edit them by hand:",
        ours.display(),
        upstream.display()
    );
    for difference in differences {
        let _ = write!(report, "\n  {difference}");
    }
    Err(report)
}

/// Every file under `root`, by its path relative to `root` (`/`-separated),
/// with its bytes.
fn files_under(root: &Path) -> Result<BTreeMap<String, Vec<u8>>, String> {
    fn walk(root: &Path, dir: &Path, files: &mut BTreeMap<String, Vec<u8>>) -> Result<(), String> {
        let entries =
            std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        for entry in entries {
            let path: PathBuf = entry
                .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
                .path();
            if path.is_dir() {
                walk(root, &path, files)?;
            } else {
                let bytes = std::fs::read(&path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                let relative = path
                    .strip_prefix(root)
                    .expect("listed under its root")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                files.insert(relative, bytes);
            }
        }
        Ok(())
    }
    if !root.is_dir() {
        return Err(format!("{} is not a folder", root.display()));
    }
    let mut files = BTreeMap::new();
    walk(root, root, &mut files)?;
    Ok(files)
}

/// The offset of the first byte where `a` and `b` differ; when one is a
/// prefix of the other, the length of the shorter. `None` when identical.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(offset) => Some(offset),
        None if a.len() != b.len() => Some(a.len().min(b.len())),
        None => None,
    }
}

fn byte_at(bytes: &[u8], offset: usize) -> String {
    match bytes.get(offset) {
        Some(byte) => format!("0x{byte:02x}"),
        None => "end of file".to_string(),
    }
}

/// The comparison itself, on temporary folders.
mod comparison {
    use super::*;

    fn folder(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        dir
    }

    #[test]
    fn an_absent_upstream_folder_is_reported_as_skipped() {
        let ours = folder(&[("a.json", b"{}")]);
        let absent = ours.path().join("no-such-folder");
        match compare(ours.path(), &absent).unwrap() {
            Compared::Skipped(report) => {
                assert!(report.contains("skipped"), "{report}");
                assert!(report.contains("no-such-folder"), "{report}");
            }
            other => panic!("expected a skip, got {other:?}"),
        }
    }

    #[test]
    fn identical_folders_agree() {
        let files: &[(&str, &[u8])] = &[("a.json", b"{}"), ("README.md", b"# x\n")];
        let (ours, upstream) = (folder(files), folder(files));
        assert_eq!(
            compare(ours.path(), upstream.path()),
            Ok(Compared::Identical { files: 2 })
        );
    }

    #[test]
    fn every_difference_is_named() {
        let ours = folder(&[
            ("same.md", b"same"),
            ("changed.json", b"{\"a\": 1}"),
            ("short.json", b"abc"),
            ("extra.json", b"x"),
        ]);
        let upstream = folder(&[
            ("same.md", b"same"),
            ("changed.json", b"{\"a\": 2}"),
            ("short.json", b"abcd"),
            ("sub/missing.json", b"y"),
        ]);
        let report = compare(ours.path(), upstream.path()).unwrap_err();
        for expected in [
            "missing file: sub/missing.json",
            "extra file: extra.json",
            "differing file: changed.json first differs at byte offset 6 (0x31 here, 0x32 upstream; 8 bytes here, 8 upstream)",
            "differing file: short.json first differs at byte offset 3 (end of file here, 0x64 upstream; 3 bytes here, 4 upstream)",
        ] {
            assert!(report.contains(expected), "{expected:?} not in:\n{report}");
        }
        assert!(!report.contains("same.md"), "{report}");
        assert_eq!(report.lines().count(), 5, "{report}");
    }

    #[test]
    fn first_difference_handles_prefixes() {
        assert_eq!(first_difference(b"abc", b"abc"), None);
        assert_eq!(first_difference(b"abc", b"abd"), Some(2));
        assert_eq!(first_difference(b"ab", b"abc"), Some(2));
        assert_eq!(first_difference(b"", b"a"), Some(0));
    }
}
