//! `plugin build` of a Python or JavaScript plugin folder: its component,
//! made by the same script the repository's own plugins are built with
//! (`scripts/build-python-plugin`, `scripts/build-js-plugin`, built into
//! this binary), with the tools it pins installed on first use into the
//! user's cache and reused offline after that.
//!
//! The pure parts (what the folder is, which files are its sources, what a
//! script's output says) are apart from the files and processes, and tested
//! without either.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, anyhow};

use super::{Built, Overrides, is_stale, modified};
use crate::plugin_dev::{Failure, shown};

const BUILD_PYTHON: &str = include_str!("../../../../scripts/build-python-plugin");
const BUILD_JS: &str = include_str!("../../../../scripts/build-js-plugin");
/// The WIT a folder without its own `wit/plugin.wit` is built against.
const WIT: &str = include_str!("../../../../wit/plugin.wit");

/// What a plugin folder is written in, by what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Rust,
    Python,
    JavaScript,
}

/// The folders builds, installs and interpreters write into a plugin
/// folder (and git's): never sources.
const GENERATED: &[&str] = &["target", "bindings", "node_modules", "__pycache__", ".git"];

/// What was looked for, in the order it is looked for.
pub const LOOKED_FOR: &str = "Cargo.toml (Rust), src/app.py (Python), package.json with app.js \
                              (JavaScript)";

impl Language {
    /// The language of a folder where `has(relative path)` says which files
    /// exist; `None` when it is none of them.
    pub fn detect(has: impl Fn(&str) -> bool) -> Option<Self> {
        if has("Cargo.toml") {
            Some(Self::Rust)
        } else if has("src/app.py") {
            Some(Self::Python)
        } else if has("package.json") && has("app.js") {
            Some(Self::JavaScript)
        } else {
            None
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Rust => "Rust",
            Self::Python => "Python",
            Self::JavaScript => "JavaScript",
        }
    }

    /// The script that builds it, and the name it runs under (a Rust
    /// crate is cargo's: `None`).
    fn script(self) -> Option<(&'static str, &'static str)> {
        match self {
            Self::Python => Some((BUILD_PYTHON, "build-python-plugin")),
            Self::JavaScript => Some((BUILD_JS, "build-js-plugin")),
            Self::Rust => None,
        }
    }

    /// Whether `relative` (a path inside the folder, `/`-separated) is one
    /// of the sources the component is made from: what a change of makes it
    /// stale. Python: everything under `src/`. JavaScript: the modules and
    /// the package files, not the tests, nor what builds and installs write.
    pub fn is_source(self, relative: &str) -> bool {
        let mut parts = relative.split('/');
        let first = parts.next().unwrap_or_default();
        if relative.split('/').any(|part| GENERATED.contains(&part)) {
            return false;
        }
        match self {
            Self::Python => first == "src" && parts.next().is_some(),
            Self::JavaScript => {
                first != "test"
                    && (relative.ends_with(".js")
                        || relative.ends_with(".mjs")
                        || relative.ends_with(".cjs")
                        || relative == "package.json"
                        || relative == "package-lock.json")
                    // The test host the tests import is no part of the build.
                    && relative != "acemq-testing.mjs"
            }
            Self::Rust => false,
        }
    }
}

/// The reason in what a build script printed when it could not build
/// (`NAME: skipped: REASON`: no python3 or node, the registry unreachable).
pub fn skipped_reason(stdout: &str) -> Option<&str> {
    stdout
        .lines()
        .find_map(|line| line.split_once(": skipped: ").map(|(_, reason)| reason))
}

/// Builds the Python or JavaScript plugin at `dir` (canonical).
pub fn build(dir: &Path, language: Language, overrides: &Overrides) -> Result<Built, Failure> {
    let Some((script, script_name)) = language.script() else {
        return Err(Failure::input(anyhow!(
            "{} is a Rust crate: cargo builds it",
            shown(dir)
        )));
    };
    if overrides.target_dir.is_some() {
        return Err(Failure::input(anyhow!(
            "--target-dir is cargo's, for Rust plugins; {} is a {} plugin (use --out-dir for \
             where the component goes)",
            shown(dir),
            language.describe()
        )));
    }
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Failure::input(anyhow!("{}: a plugin folder has a name", dir.display())))?;
    let out = overrides
        .out_dir
        .clone()
        .unwrap_or_else(|| dir.join("target").join("plugins"))
        .join(format!("{name}.wasm"));
    let wit = wit_for(dir).map_err(Failure::failed)?;

    let mut newest = modified(&wit);
    for source in sources(dir, language) {
        newest = newest.max(modified(&source));
    }
    if !is_stale(newest, modified(&out)) {
        return Ok(Built {
            bytes: std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0),
            path: out,
            rewritten: false,
            took: None,
        });
    }

    let tools = crate::user_cache::toolchains().ok_or_else(|| {
        Failure::failed(anyhow!(
            "no cache folder to install the {} toolchain into: neither XDG_CACHE_HOME nor HOME \
             is an absolute path",
            language.describe()
        ))
    })?;
    eprintln!(
        "plugin build: building {name} ({}) into {}, tools in {}",
        language.describe(),
        shown(&out),
        tools.display()
    );
    let started = Instant::now();
    let run = Command::new("bash")
        .arg("-c")
        .arg(script)
        .arg(script_name)
        .arg(dir)
        .arg(&wit)
        .arg(&out)
        .arg(&tools)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run bash for the build script")
        .map_err(Failure::failed)?;
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&run.stdout);
    // Its progress lines go where the Rust build's do: stderr.
    eprint!("{stdout}");
    if !run.status.success() {
        return Err(Failure::failed(anyhow!(
            "the {} build of {} failed ({}; its output is above)",
            language.describe(),
            shown(dir),
            run.status
        )));
    }
    if let Some(reason) = skipped_reason(&stdout) {
        return Err(Failure::failed(anyhow!(
            "cannot build {}: {reason}",
            shown(dir)
        )));
    }
    // The script wrote it, or there is nothing to show.
    if is_stale(newest, modified(&out)) {
        return Err(Failure::failed(anyhow!(
            "the {} build of {} wrote no {}",
            language.describe(),
            shown(dir),
            out.display()
        )));
    }
    Ok(Built {
        bytes: std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0),
        path: out,
        rewritten: true,
        took: Some(took),
    })
}

/// The folder's own `wit/plugin.wit` (what `plugin new` puts there); else
/// the WIT built into this binary, written into the folder's `target/wit/`
/// (only when it differs, so its time says when the contract changed).
fn wit_for(dir: &Path) -> anyhow::Result<PathBuf> {
    let own = dir.join("wit").join("plugin.wit");
    if own.is_file() {
        return Ok(own);
    }
    let builtin = dir.join("target").join("wit").join("plugin.wit");
    if std::fs::read_to_string(&builtin).ok().as_deref() != Some(WIT) {
        if let Some(folder) = builtin.parent() {
            std::fs::create_dir_all(folder)
                .with_context(|| format!("cannot create {}", folder.display()))?;
        }
        std::fs::write(&builtin, WIT)
            .with_context(|| format!("cannot write {}", builtin.display()))?;
    }
    Ok(builtin)
}

/// The files under `dir` that are `language`'s sources.
fn sources(dir: &Path, language: Language) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            let path = entry.path();
            let Ok(relative) = path.strip_prefix(dir) else {
                continue;
            };
            let relative = relative.to_string_lossy().replace('\\', "/");
            let generated = GENERATED.contains(&entry.file_name().to_string_lossy().as_ref());
            match entry.file_type() {
                // Not into what builds and installs write (big, and never sources).
                Ok(kind) if kind.is_dir() && !generated => pending.push(path),
                Ok(kind) if kind.is_file() && language.is_source(&relative) => found.push(path),
                _ => {}
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(files: &[&str]) -> Option<Language> {
        Language::detect(|path| files.contains(&path))
    }

    #[test]
    fn the_language_is_what_the_folder_holds() {
        assert_eq!(folder(&["Cargo.toml", "src/lib.rs"]), Some(Language::Rust));
        assert_eq!(
            folder(&["src/app.py", "test_app.py"]),
            Some(Language::Python)
        );
        assert_eq!(
            folder(&["package.json", "app.js", "package-lock.json"]),
            Some(Language::JavaScript)
        );
        // A Cargo.toml decides, as it did before other languages.
        assert_eq!(folder(&["Cargo.toml", "src/app.py"]), Some(Language::Rust));
        assert_eq!(folder(&["package.json"]), None, "a package.json alone");
        assert_eq!(folder(&["app.py"]), None, "app.py outside src/");
        assert_eq!(folder(&[]), None);
        for looked_for in ["Cargo.toml", "src/app.py", "package.json", "app.js"] {
            assert!(LOOKED_FOR.contains(looked_for));
        }
    }

    #[test]
    fn python_sources_are_what_is_under_src() {
        let python = Language::Python;
        assert!(python.is_source("src/app.py"));
        assert!(python.is_source("src/orders/model.py"));
        assert!(!python.is_source("src/__pycache__/app.cpython-311.pyc"));
        assert!(!python.is_source("test_app.py"));
        assert!(!python.is_source("acemq_testing.py"));
        assert!(!python.is_source("bindings/wit_world/__init__.py"));
        assert!(!python.is_source("src"));
    }

    #[test]
    fn javascript_sources_are_the_modules_and_package_files_not_tests() {
        let js = Language::JavaScript;
        for source in [
            "app.js",
            "lib/order.mjs",
            "package.json",
            "package-lock.json",
        ] {
            assert!(js.is_source(source), "{source}");
        }
        for other in [
            "test/app.test.mjs",
            "acemq-testing.mjs",
            "node_modules/x/index.js",
            "bindings/handler-plugin.d.ts",
            "target/wit/plugin.wit",
            "README.md",
        ] {
            assert!(!js.is_source(other), "{other}");
        }
    }

    #[test]
    fn a_skipped_build_says_why() {
        let out = "x: installing componentize-py 0.25.1 into /c\n\
                   x: skipped: pip could not install componentize-py 0.25.1 (offline?): no index\n";
        assert_eq!(
            skipped_reason(out),
            Some("pip could not install componentize-py 0.25.1 (offline?): no index")
        );
        assert_eq!(skipped_reason("x: wrote /o/x.wasm (5 bytes, 1 s)\n"), None);
    }
}
