//! The plugin author's loop: `acemq-host plugin new`, `plugin build` and
//! `plugin run`. One module per command; each keeps its pure decisions
//! (names, templates, toolchain choice, what to rebuild, how to show a
//! result) apart from the files and processes it touches, so they are tested
//! without either.

pub mod build;
pub mod captured;
pub mod new;
pub mod precompile;
pub mod run;

use std::path::{Path, PathBuf};

/// Why a command stopped, with the exit code the CLI uses for it: 2 when the
/// input cannot be used as given (a name, a path, an argument, a plugin
/// file), 1 when the work itself failed (a build, a trap).
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub error: anyhow::Error,
}

impl Failure {
    /// Input that cannot be used (exit 2).
    pub fn input(error: impl Into<anyhow::Error>) -> Self {
        Self {
            code: 2,
            error: error.into(),
        }
    }

    /// Work that failed (exit 1).
    pub fn failed(error: impl Into<anyhow::Error>) -> Self {
        Self {
            code: 1,
            error: error.into(),
        }
    }
}

/// `path` as the user will want to read it: relative to the current folder
/// when it lies inside it, as given otherwise.
pub fn shown(path: &Path) -> String {
    let relative = std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf));
    match relative {
        Some(relative) if !relative.as_os_str().is_empty() => relative.display().to_string(),
        _ => path.display().to_string(),
    }
}

/// The checkout this binary was built from (its `host/` crate's parent):
/// where `plugin new` finds the guest SDK by default.
pub fn build_checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}
