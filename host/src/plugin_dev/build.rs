//! `acemq-host plugin build [DIR]`: the plugin crate (or every plugin crate
//! of the workspace) at DIR, compiled for wasm32 and made into components;
//! or the Python or JavaScript plugin folder at DIR made into one
//! ([`interpreted`]). What DIR holds says which ([`Language::detect`]).
//!
//! A Rust crate or workspace:
//! 1. The guest toolchain: rustup's when it has the wasm32 target, otherwise
//!    Debian's rustc-web building std from source (`-Zbuild-std`), installed
//!    first if missing by `scripts/ensure-wasm-toolchain.sh`, which is built
//!    into this binary so the same steps run outside the repository too (it
//!    prints the exact command when it cannot install).
//! 2. `cargo build --release --target wasm32-unknown-unknown` into
//!    `<target>/wasm` (Debian) or `<target>/wasm-rustup`: each toolchain has
//!    its own directory, as they cannot share build artefacts. `<target>` is
//!    `--target-dir`, else the workspace's `[workspace.metadata.acemq]
//!    target-dir`, else cargo's target directory.
//! 3. Each core module into `<out>/<package>.wasm` (`--out-dir`, default
//!    `<target>/plugins`) with the same componentize as
//!    `acemq-host plugin componentize`.
//!
//! Incremental: cargo rebuilds only what changed, and a component is redone
//! only when its core module is newer. A component is written beside the old
//! one and renamed over it, so a reader (a test, a host watching the file
//! for hot swap) sees the old one or the new one, never half of one; after a
//! failure the old one stays but is still older than its core module, so the
//! next build redoes it. Building a whole workspace into its default output
//! folder also removes components whose crate is gone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, anyhow};

use super::{Failure, shown};

mod interpreted;

pub use interpreted::{LOOKED_FOR, Language};

/// The wasm target plugins are built for.
pub const TARGET: &str = "wasm32-unknown-unknown";

/// The installer of Debian's wasm-capable toolchain, run as it is.
const ENSURE_TOOLCHAIN: &str = include_str!("../../../scripts/ensure-wasm-toolchain.sh");

/// Which Rust toolchain builds the plugins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toolchain {
    /// rustup's, with the wasm32 target installed.
    Rustup,
    /// Debian's rustc-web and cargo-web in /usr/bin, std built from source.
    Debian,
}

impl Toolchain {
    /// rustup's when `installed_targets` (the output of `rustup target list
    /// --installed`, `None` without rustup) lists the wasm target.
    pub fn choose(installed_targets: Option<&str>) -> Self {
        match installed_targets {
            Some(targets) if targets.lines().any(|line| line.trim() == TARGET) => Self::Rustup,
            _ => Self::Debian,
        }
    }

    /// Its folder under the target directory.
    pub fn core_subdir(self) -> &'static str {
        match self {
            Self::Rustup => "wasm-rustup",
            Self::Debian => "wasm",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::Rustup => "rustup's toolchain",
            Self::Debian => "Debian's rustc-web (std built from source)",
        }
    }

    /// A `cargo` of this toolchain, with `args`.
    fn cargo(self, args: &[&str]) -> Command {
        match self {
            Self::Rustup => {
                let mut command = Command::new("cargo");
                command.args(args);
                command
            }
            Self::Debian => {
                let mut command = Command::new("/usr/bin/cargo");
                // /usr/bin first so nothing of rustup's (~/.cargo/bin usually
                // comes first) is picked up; RUSTC in case the caller's
                // environment names rustup's; RUSTC_BOOTSTRAP because
                // -Zbuild-std is unstable; Debian ships no wasm std, hence
                // build-std, and links with wasm-ld-22.
                let path = std::env::var("PATH").unwrap_or_default();
                command
                    .env("PATH", format!("/usr/bin:{path}"))
                    .env("RUSTC", "/usr/bin/rustc")
                    .env("RUSTC_BOOTSTRAP", "1")
                    .env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", "wasm-ld-22")
                    .args(args);
                command
            }
        }
    }

    /// The extra arguments of `cargo build` on this toolchain.
    fn build_args(self) -> &'static [&'static str] {
        match self {
            Self::Rustup => &[],
            Self::Debian => &["-Zbuild-std=std,panic_abort"],
        }
    }
}

/// Finds the toolchain, installing Debian's when rustup's lacks the target.
pub fn find_toolchain() -> Result<Toolchain, Failure> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned());
    let toolchain = Toolchain::choose(installed.as_deref());
    if toolchain == Toolchain::Debian {
        let status = Command::new("bash")
            .arg("-c")
            .arg(ENSURE_TOOLCHAIN)
            .arg("ensure-wasm-toolchain")
            .status()
            .context("cannot run bash to check the wasm toolchain")
            .map_err(Failure::failed)?;
        if !status.success() {
            return Err(Failure::failed(anyhow!(
                "no wasm toolchain: rustup has no {TARGET} target (`rustup target add {TARGET}` \
                 adds it) and Debian's could not be installed (see above)"
            )));
        }
    }
    Ok(toolchain)
}

/// Where things go, as asked on the command line.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub target_dir: Option<PathBuf>,
    pub out_dir: Option<PathBuf>,
}

/// One plugin crate to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginCrate {
    pub package: String,
    /// The cdylib's name: the core module is `<lib>.wasm`.
    pub lib: String,
}

/// What one `plugin build` does, decided from `cargo metadata`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildPlan {
    pub workspace_manifest: PathBuf,
    /// Cargo's target directory for these builds (without the toolchain's folder).
    pub target_dir: PathBuf,
    pub out_dir: PathBuf,
    pub plugins: Vec<PluginCrate>,
    /// Outputs of crates that are gone may be removed from `out_dir`: the
    /// whole workspace is built into its own default folder.
    pub prune: bool,
}

impl BuildPlan {
    /// From `cargo metadata --no-deps --format-version 1` of `manifest`:
    /// that package if `manifest` is a package's, else every cdylib package
    /// of the workspace.
    pub fn from_metadata(
        metadata: &serde_json::Value,
        manifest: &Path,
        overrides: &Overrides,
    ) -> Result<Self, String> {
        let text = |value: &serde_json::Value, key: &str| {
            value
                .get(key)
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .ok_or_else(|| format!("cargo metadata has no `{key}`"))
        };
        let workspace_root = PathBuf::from(text(metadata, "workspace_root")?);
        let packages = metadata
            .get("packages")
            .and_then(|p| p.as_array())
            .ok_or("cargo metadata has no `packages`")?;
        let cdylib = |package: &serde_json::Value| {
            package
                .get("targets")
                .and_then(|t| t.as_array())
                .into_iter()
                .flatten()
                .find(|target| {
                    target
                        .get("crate_types")
                        .and_then(|k| k.as_array())
                        .is_some_and(|kinds| kinds.iter().any(|k| k.as_str() == Some("cdylib")))
                })
                .and_then(|target| target.get("name").and_then(|n| n.as_str()))
                .map(|name| name.replace('-', "_"))
        };
        let this_package = packages.iter().find(|p| {
            p.get("manifest_path")
                .and_then(|m| m.as_str())
                .map(Path::new)
                == Some(manifest)
        });
        let plugins = match this_package {
            Some(package) => {
                let name = text(package, "name")?;
                let lib = cdylib(package).ok_or_else(|| {
                    format!(
                        "{}: the package '{name}' is not a plugin crate: it needs \
                         [lib] crate-type = [\"cdylib\"]",
                        manifest.display()
                    )
                })?;
                vec![PluginCrate { package: name, lib }]
            }
            None => packages
                .iter()
                .filter_map(|package| {
                    Some(PluginCrate {
                        package: text(package, "name").ok()?,
                        lib: cdylib(package)?,
                    })
                })
                .collect(),
        };
        if plugins.is_empty() {
            return Err(format!(
                "{}: no plugin crates (packages with [lib] crate-type = [\"cdylib\"])",
                manifest.display()
            ));
        }
        let configured = metadata
            .pointer("/metadata/acemq/target-dir")
            .and_then(|dir| dir.as_str())
            .map(|dir| lexically_normal(&workspace_root.join(dir)));
        let target_dir = match (&overrides.target_dir, configured) {
            (Some(dir), _) => dir.clone(),
            (None, Some(dir)) => dir,
            (None, None) => PathBuf::from(text(metadata, "target_directory")?),
        };
        Ok(Self {
            workspace_manifest: workspace_root.join("Cargo.toml"),
            out_dir: overrides
                .out_dir
                .clone()
                .unwrap_or_else(|| target_dir.join("plugins")),
            prune: this_package.is_none() && overrides.out_dir.is_none(),
            target_dir,
            plugins,
        })
    }
}

/// `path` without `.` and `dir/..` components, for reading (symlinks are
/// not followed, as a configured `../target` is meant lexically).
pub fn lexically_normal(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Whether a component must be (re)made from its core module: it is
/// missing, or not newer than the module (`None`: no such file).
pub fn is_stale(core: Option<SystemTime>, component: Option<SystemTime>) -> bool {
    match (core, component) {
        (Some(core), Some(component)) => component <= core,
        _ => true,
    }
}

/// The components in `out_dir` (file stems) that no crate of `plugins` writes.
pub fn orphans<'a>(
    existing: &'a [String],
    plugins: &[PluginCrate],
    other_languages: &[String],
) -> Vec<&'a String> {
    existing
        .iter()
        .filter(|stem| !plugins.iter().any(|p| &p.package == *stem))
        .filter(|stem| !other_languages.contains(stem))
        .collect()
}

/// The plugins of `workspace` in other languages: folders with a
/// `build.sh` and no `Cargo.toml` (scripts/build-wasm-langs builds them
/// into the same output folder, so their components are not orphans).
fn other_language_plugins(workspace: &Path) -> Vec<String> {
    std::fs::read_dir(workspace)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|dir| dir.join("build.sh").is_file() && !dir.join("Cargo.toml").exists())
        .filter_map(|dir| Some(dir.file_name()?.to_string_lossy().into_owned()))
        .collect()
}

/// What happened to one component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    pub path: PathBuf,
    pub bytes: u64,
    pub rewritten: bool,
    /// How long making it took, when it was made on its own (a Python or
    /// JavaScript build; cargo builds a workspace's crates together).
    pub took: Option<Duration>,
}

/// Builds the plugin at `dir`: a Rust crate or workspace (or its
/// Cargo.toml), or a Python or JavaScript plugin folder.
pub fn build(dir: &Path, overrides: &Overrides) -> Result<Vec<Built>, Failure> {
    if dir.is_dir() {
        let folder = dir.canonicalize().map_err(|e| {
            Failure::input(anyhow!("{}: cannot read the folder: {e}", dir.display()))
        })?;
        match Language::detect(|relative| folder.join(relative).is_file()) {
            Some(Language::Rust) => {}
            Some(language) => {
                return interpreted::build(&folder, language, overrides).map(|built| vec![built]);
            }
            None => {
                return Err(Failure::input(anyhow!(
                    "{}: not a plugin folder: looked for {LOOKED_FOR}",
                    shown(&folder)
                )));
            }
        }
    }
    build_crates(dir, overrides)
}

/// Builds the plugin crate or workspace at `dir`.
fn build_crates(dir: &Path, overrides: &Overrides) -> Result<Vec<Built>, Failure> {
    let manifest = if dir.is_file() {
        dir.to_path_buf()
    } else {
        dir.join("Cargo.toml")
    };
    let manifest = manifest.canonicalize().map_err(|e| {
        Failure::input(anyhow!(
            "{}: no Cargo.toml of a plugin crate or workspace there ({e})",
            manifest.display()
        ))
    })?;
    let toolchain = find_toolchain()?;
    let manifest_arg = manifest.to_string_lossy().into_owned();
    let metadata = run_cargo(
        toolchain,
        &[
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--manifest-path",
            &manifest_arg,
        ],
    )
    .map_err(Failure::input)?;
    let metadata: serde_json::Value = serde_json::from_slice(&metadata)
        .context("cargo metadata printed something else than JSON")
        .map_err(Failure::failed)?;
    let plan = BuildPlan::from_metadata(&metadata, &manifest, overrides)
        .map_err(|e| Failure::input(anyhow!(e)))?;

    let core_dir = plan.target_dir.join(toolchain.core_subdir());
    eprintln!(
        "plugin build: compiling {} with {} into {}",
        plan.plugins
            .iter()
            .map(|p| p.package.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        toolchain.describe(),
        shown(&core_dir)
    );
    let workspace_manifest = plan.workspace_manifest.to_string_lossy().into_owned();
    let core_dir_arg = core_dir.to_string_lossy().into_owned();
    let mut args = vec![
        "build",
        "--release",
        "--target",
        TARGET,
        "--manifest-path",
        &workspace_manifest,
        "--target-dir",
        &core_dir_arg,
    ];
    for plugin in &plan.plugins {
        args.extend(["-p", plugin.package.as_str()]);
    }
    args.extend(toolchain.build_args());
    let status = toolchain
        .cargo(&args)
        .status()
        .context("cannot run cargo")
        .map_err(Failure::failed)?;
    if !status.success() {
        return Err(Failure::failed(anyhow!(
            "cargo build for {TARGET} failed ({status})"
        )));
    }

    std::fs::create_dir_all(&plan.out_dir)
        .with_context(|| format!("cannot create {}", plan.out_dir.display()))
        .map_err(Failure::failed)?;
    let release = core_dir.join(TARGET).join("release");
    let mut built = Vec::new();
    for plugin in &plan.plugins {
        let core = release.join(format!("{}.wasm", plugin.lib));
        let out = plan.out_dir.join(format!("{}.wasm", plugin.package));
        let rewritten = is_stale(modified(&core), modified(&out));
        if rewritten {
            componentize_into(&core, &out).map_err(Failure::failed)?;
        }
        let bytes = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
        built.push(Built {
            path: out,
            bytes,
            rewritten,
            took: None,
        });
    }
    if plan.prune {
        let workspace = plan.workspace_manifest.parent().unwrap_or(Path::new("."));
        remove_orphans(
            &plan.out_dir,
            &plan.plugins,
            &other_language_plugins(workspace),
        );
    }
    Ok(built)
}

/// `cargo ARGS` on `toolchain`; its stdout, or an error with its stderr.
fn run_cargo(toolchain: Toolchain, args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let output = toolchain.cargo(args).output().context("cannot run cargo")?;
    if !output.status.success() {
        anyhow::bail!(
            "cargo {} failed: {}",
            args.first().unwrap_or(&""),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(output.stdout)
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The component of `core`, written to `out` through a temporary file
/// renamed over it.
fn componentize_into(core: &Path, out: &Path) -> anyhow::Result<()> {
    let module = std::fs::read(core).with_context(|| {
        format!(
            "cargo built no {}: is the crate a cdylib with the plugin's name?",
            core.display()
        )
    })?;
    let component = crate::plugin::componentize::componentize(&module)
        .with_context(|| format!("{}", core.display()))?;
    let tmp = out.with_extension(format!("wasm.tmp.{}", std::process::id()));
    let written = std::fs::write(&tmp, component).and_then(|()| std::fs::rename(&tmp, out));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(anyhow!("cannot write {}: {e}", out.display()));
    }
    Ok(())
}

fn remove_orphans(out_dir: &Path, plugins: &[PluginCrate], other_languages: &[String]) {
    let existing: Vec<String> = std::fs::read_dir(out_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "wasm"))
        .filter_map(|path| Some(path.file_stem()?.to_string_lossy().into_owned()))
        .collect();
    for stem in orphans(&existing, plugins, other_languages) {
        let path = out_dir.join(format!("{stem}.wasm"));
        eprintln!(
            "plugin build: removing {} (no crate builds it any more)",
            shown(&path)
        );
        let _ = std::fs::remove_file(path);
    }
}

/// What `plugin build` prints: one line per component.
pub fn summary(built: &[Built]) -> String {
    built
        .iter()
        .map(|b| {
            let state = match (b.rewritten, b.took) {
                (false, _) => "up to date".to_string(),
                (true, None) => "written".to_string(),
                (true, Some(took)) => format!("written in {:.1} s", took.as_secs_f64()),
            };
            format!("{:<44} {:>9} bytes  {state}\n", shown(&b.path), b.bytes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn rustup_is_used_when_it_has_the_wasm_target() {
        let with = "x86_64-unknown-linux-gnu\nwasm32-unknown-unknown\n";
        assert_eq!(Toolchain::choose(Some(with)), Toolchain::Rustup);
        assert_eq!(
            Toolchain::choose(Some("x86_64-unknown-linux-gnu\n")),
            Toolchain::Debian
        );
        assert_eq!(Toolchain::choose(None), Toolchain::Debian);
    }

    fn metadata(root: &str, target_metadata: Option<&str>) -> serde_json::Value {
        let package = |name: &str, kind: &str| {
            serde_json::json!({
                "name": name,
                "manifest_path": format!("{root}/{name}/Cargo.toml"),
                "targets": [{ "name": name, "crate_types": [kind] }],
            })
        };
        serde_json::json!({
            "workspace_root": root,
            "target_directory": format!("{root}/target"),
            "packages": [package("order-audit", "cdylib"), package("echo", "cdylib"), package("util", "lib")],
            "metadata": target_metadata.map(|dir| serde_json::json!({ "acemq": { "target-dir": dir } })),
        })
    }

    #[test]
    fn a_package_manifest_builds_that_plugin_into_its_target_dir() {
        let plan = BuildPlan::from_metadata(
            &metadata("/w", None),
            Path::new("/w/order-audit/Cargo.toml"),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(
            plan.plugins,
            vec![PluginCrate {
                package: "order-audit".into(),
                lib: "order_audit".into()
            }]
        );
        assert_eq!(plan.target_dir, Path::new("/w/target"));
        assert_eq!(plan.out_dir, Path::new("/w/target/plugins"));
        assert_eq!(plan.workspace_manifest, Path::new("/w/Cargo.toml"));
        assert!(!plan.prune);
    }

    #[test]
    fn a_workspace_builds_every_cdylib_where_its_metadata_says() {
        let plan = BuildPlan::from_metadata(
            &metadata("/repo/plugins", Some("../target")),
            Path::new("/repo/plugins/Cargo.toml"),
            &Overrides::default(),
        )
        .unwrap();
        let names: Vec<_> = plan.plugins.iter().map(|p| p.package.as_str()).collect();
        assert_eq!(names, ["order-audit", "echo"]);
        assert_eq!(plan.out_dir, Path::new("/repo/target/plugins"));
        assert!(plan.prune);

        let plan = BuildPlan::from_metadata(
            &metadata("/repo/plugins", Some("../target")),
            Path::new("/repo/plugins/Cargo.toml"),
            &Overrides {
                target_dir: Some("/t".into()),
                out_dir: Some("/o".into()),
            },
        )
        .unwrap();
        assert_eq!(
            (plan.target_dir.as_path(), plan.out_dir.as_path()),
            (Path::new("/t"), Path::new("/o"))
        );
        assert!(!plan.prune, "an output folder given is not pruned");
    }

    #[test]
    fn parent_folders_are_resolved_lexically() {
        assert_eq!(
            lexically_normal(Path::new("/repo/plugins/../target/./x")),
            Path::new("/repo/target/x")
        );
        assert_eq!(lexically_normal(Path::new("../a/../b")), Path::new("../b"));
    }

    #[test]
    fn a_package_that_is_no_cdylib_is_named() {
        let error = BuildPlan::from_metadata(
            &metadata("/w", None),
            Path::new("/w/util/Cargo.toml"),
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(
            error.contains("'util'") && error.contains("cdylib"),
            "{error}"
        );
    }

    #[test]
    fn a_component_is_redone_only_when_its_module_is_newer() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let later = t + Duration::from_secs(1);
        assert!(!is_stale(Some(t), Some(later)));
        assert!(is_stale(Some(later), Some(t)));
        assert!(is_stale(Some(t), Some(t)));
        assert!(is_stale(Some(t), None));
        assert!(is_stale(None, Some(t)));
    }

    #[test]
    fn the_summary_says_where_each_component_is_its_size_and_what_was_done() {
        let built = |rewritten, took| Built {
            path: PathBuf::from("/o/x.wasm"),
            bytes: 18_581_043,
            rewritten,
            took,
        };
        assert_eq!(
            summary(&[built(true, Some(Duration::from_millis(16_240)))]),
            format!(
                "{:<44} {:>9} bytes  written in 16.2 s\n",
                "/o/x.wasm", 18_581_043
            )
        );
        assert!(summary(&[built(true, None)]).ends_with("bytes  written\n"));
        assert!(summary(&[built(false, None)]).ends_with("bytes  up to date\n"));
    }

    #[test]
    fn only_components_of_gone_crates_are_orphans() {
        let plugins = [PluginCrate {
            package: "echo".into(),
            lib: "echo".into(),
        }];
        let existing = vec![
            "echo".to_string(),
            "old".to_string(),
            "router-py".to_string(),
        ];
        let other_languages = ["router-py".to_string()];
        assert_eq!(
            orphans(&existing, &plugins, &other_languages),
            [&"old".to_string()]
        );
    }
}
