//! Build facts for `acemq-host --version` (`host/src/build_info.rs`): the
//! commit the binary was built from, and the wasmtime release it links.
//! Both are read from the checkout, so they say what was built, not what a
//! constant claims.

use std::path::Path;
use std::process::Command;

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let workspace = Path::new(&manifest)
        .parent()
        .expect("host/ sits in the workspace");
    let commit = git(workspace, &["rev-parse", "--short=12", "HEAD"]);
    println!(
        "cargo:rustc-env=ACEMQ_BUILD_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    // A new commit moves HEAD's branch (or HEAD itself, detached).
    if let Some(git_dir) = git(workspace, &["rev-parse", "--absolute-git-dir"]) {
        let git_dir = Path::new(&git_dir);
        for watched in ["HEAD", "refs/heads", "packed-refs"] {
            println!("cargo:rerun-if-changed={}", git_dir.join(watched).display());
        }
    }
    let lock = workspace.join("Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let wasmtime = std::fs::read_to_string(&lock)
        .ok()
        .and_then(|text| locked_version(&text, "wasmtime"))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=ACEMQ_WASMTIME_VERSION={wasmtime}");
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The version of package `name` in a Cargo.lock.
fn locked_version(lock: &str, name: &str) -> Option<String> {
    let wanted = format!("name = \"{name}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == wanted {
            let version = lines.next()?.trim().strip_prefix("version = \"")?;
            return Some(version.trim_end_matches('"').to_string());
        }
    }
    None
}
