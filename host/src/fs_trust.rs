//! Who may change the files that decide what the host runs: plugin files
//! and their folders, the compiled-plugin cache folder and its key.
//!
//! The sandbox only holds if nobody but the host's operator chooses the code
//! inside it. Whoever can write a plugin's folder can put another plugin in
//! its place (hot swap loads it within a second); whoever can write the
//! cache folder can plant native code the host would map and run. Such paths
//! are refused at start, with the path, its mode and its owner.
//!
//! Trusted owners are the host's effective user and root: root can replace
//! the host binary itself, so trusting it costs nothing, and a root-owned,
//! read-only plugin folder is the safest way to deploy.
//!
//! The rules ([`judge`]) are pure; the functions that read metadata only
//! gather the facts for them.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The facts the rules look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
}

impl Ownership {
    pub fn of(metadata: &std::fs::Metadata) -> Self {
        Self {
            mode: metadata.mode() & 0o7777,
            uid: metadata.uid(),
        }
    }
}

/// What a path must satisfy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Only a trusted owner may write it (folders and plugin files).
    OwnerWritesOnly,
    /// Only a trusted owner may read or write it (a secret: the cache key).
    OwnerOnly,
}

/// The host's effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) takes nothing, touches no memory and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether `found` satisfies `rule` for a host running as `euid`; the reason
/// when it does not (without the path, which the caller names).
pub fn judge(rule: Rule, found: Ownership, euid: u32) -> Result<(), String> {
    let Ownership { mode, uid } = found;
    if uid != euid && uid != 0 {
        return Err(format!(
            "is owned by uid {uid} (mode {mode:04o}), neither the host's user (uid {euid}) nor \
             root: that user could change what the host runs; chown it to uid {euid}"
        ));
    }
    match rule {
        Rule::OwnerWritesOnly => {
            let by = match (mode & 0o020 != 0, mode & 0o002 != 0) {
                (false, false) => return Ok(()),
                (true, false) => "its group",
                (false, true) => "others",
                (true, true) => "its group and others",
            };
            Err(format!(
                "is writable by {by} (mode {mode:04o}, owner uid {uid}): whoever can write to it \
                 could change what the host runs; remove the write bits (chmod go-w)"
            ))
        }
        Rule::OwnerOnly if mode & 0o077 != 0 => Err(format!(
            "is accessible to its group or others (mode {mode:04o}, owner uid {uid}): whoever \
             reads this key can forge compiled-plugin cache entries the host would run as \
             native code; make it private (chmod 600)"
        )),
        Rule::OwnerOnly => Ok(()),
    }
}

/// A path refused by [`judge`], or whose metadata could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {reason}", path.display())]
pub struct Refused {
    /// What the path is to the host ("plugin folder", "plugin cache key file").
    pub what: &'static str,
    pub path: PathBuf,
    pub reason: String,
}

impl Refused {
    pub fn new(what: &'static str, path: &Path, reason: impl Into<String>) -> Self {
        Self {
            what,
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

/// Checks an existing folder against [`Rule::OwnerWritesOnly`].
pub fn check_folder(what: &'static str, path: &Path) -> Result<(), Refused> {
    let metadata = std::fs::metadata(path)
        .map_err(|e| Refused::new(what, path, format!("cannot be read: {e}")))?;
    if !metadata.is_dir() {
        return Err(Refused::new(what, path, "is not a folder"));
    }
    check_metadata(what, path, &metadata, Rule::OwnerWritesOnly)
}

/// Checks metadata already read (from a path, or from an open file, so that
/// what is checked is what is then read).
pub fn check_metadata(
    what: &'static str,
    path: &Path,
    metadata: &std::fs::Metadata,
    rule: Rule,
) -> Result<(), Refused> {
    judge(rule, Ownership::of(metadata), euid()).map_err(|reason| Refused::new(what, path, reason))
}

/// Checks a plugin file and the folders that hold it: the folder it is
/// named in and, when the name is a symlink (a Kubernetes ConfigMap, a
/// deploy tool's "current" link), the folder of the file it resolves to.
/// What does not exist is left to the loader, which says so in its own words.
pub fn check_plugin(path: &Path) -> Result<(), Refused> {
    let mut folders = vec![folder_of(path)];
    if let Ok(real) = std::fs::canonicalize(path) {
        let real_folder = folder_of(&real);
        if std::fs::canonicalize(&folders[0]).ok().as_deref() != Some(real_folder.as_path()) {
            folders.push(real_folder);
        }
    }
    for folder in &folders {
        if folder.exists() {
            check_folder("plugin folder", folder)?;
        }
    }
    match std::fs::metadata(path) {
        Ok(metadata) => check_metadata("plugin file", path, &metadata, Rule::OwnerWritesOnly),
        Err(_) => Ok(()),
    }
}

/// The folder a file is in; `.` for a bare file name.
fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    const HOST: u32 = 1000;

    fn owned(mode: u32, uid: u32) -> Ownership {
        Ownership { mode, uid }
    }

    #[test]
    fn folders_only_their_owner_writes_are_trusted() {
        for mode in [0o700, 0o755, 0o750, 0o555, 0o1755] {
            assert_eq!(
                judge(Rule::OwnerWritesOnly, owned(mode, HOST), HOST),
                Ok(()),
                "{mode:o}"
            );
        }
        // Root's folders are trusted: root can replace the host itself.
        assert_eq!(judge(Rule::OwnerWritesOnly, owned(0o755, 0), HOST), Ok(()));
    }

    #[test]
    fn group_or_world_writable_is_refused_with_mode_and_owner() {
        let cases = [
            (0o775, "writable by its group (mode 0775, owner uid 1000)"),
            (0o757, "writable by others (mode 0757, owner uid 1000)"),
            (0o777, "writable by its group and others (mode 0777"),
            // The sticky bit protects other users' files from each other,
            // not the folder from new names: still refused.
            (0o1777, "writable by its group and others (mode 1777"),
        ];
        for (mode, expected) in cases {
            let reason = judge(Rule::OwnerWritesOnly, owned(mode, HOST), HOST).unwrap_err();
            assert!(reason.contains(expected), "{mode:o}: {reason}");
        }
    }

    #[test]
    fn another_users_path_is_refused_whatever_its_mode() {
        for rule in [Rule::OwnerWritesOnly, Rule::OwnerOnly] {
            let reason = judge(rule, owned(0o700, 1001), HOST).unwrap_err();
            assert!(
                reason.contains(
                    "owned by uid 1001 (mode 0700), neither the host's user (uid 1000) nor root"
                ),
                "{reason}"
            );
        }
    }

    #[test]
    fn a_key_must_be_private_to_its_owner() {
        assert_eq!(judge(Rule::OwnerOnly, owned(0o600, HOST), HOST), Ok(()));
        assert_eq!(judge(Rule::OwnerOnly, owned(0o400, HOST), HOST), Ok(()));
        for mode in [0o640, 0o604, 0o620, 0o602, 0o644] {
            let reason = judge(Rule::OwnerOnly, owned(mode, HOST), HOST).unwrap_err();
            assert!(
                reason.contains(&format!(
                    "accessible to its group or others (mode {mode:04o}"
                )),
                "{reason}"
            );
        }
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_plugin_in_a_group_writable_folder_is_refused_naming_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("plugins");
        std::fs::create_dir(&plugins).unwrap();
        let plugin = plugins.join("handler.wasm");
        std::fs::write(&plugin, b"\0asm").unwrap();
        chmod(&plugin, 0o644);
        chmod(&plugins, 0o755);
        check_plugin(&plugin).unwrap();

        chmod(&plugins, 0o775);
        let err = check_plugin(&plugin).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "plugin folder {}: is writable by its group (mode 0775",
                plugins.display()
            )),
            "{err}"
        );

        chmod(&plugins, 0o755);
        chmod(&plugin, 0o666);
        let err = check_plugin(&plugin).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "plugin file {}: is writable by its group and others (mode 0666",
                plugin.display()
            )),
            "{err}"
        );
    }

    #[test]
    fn the_folder_a_plugin_symlink_resolves_to_is_checked_too() {
        let dir = tempfile::tempdir().unwrap();
        let (named, real) = (dir.path().join("current"), dir.path().join("releases"));
        std::fs::create_dir(&named).unwrap();
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("handler.wasm"), b"\0asm").unwrap();
        chmod(&real.join("handler.wasm"), 0o644);
        std::os::unix::fs::symlink(real.join("handler.wasm"), named.join("handler.wasm")).unwrap();
        chmod(&named, 0o755);
        chmod(&real, 0o777);
        let err = check_plugin(&named.join("handler.wasm")).unwrap_err();
        assert_eq!(err.what, "plugin folder");
        assert_eq!(err.path, real.canonicalize().unwrap());
    }

    #[test]
    fn a_folder_of_another_user_is_refused() {
        if euid() != 0 {
            // Only root can give a folder away; the rule itself is tested above.
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
        let err = check_folder("plugin cache folder", &theirs)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is owned by uid 65534"), "{err}");
    }

    #[test]
    fn a_missing_plugin_is_left_to_the_loader() {
        let dir = tempfile::tempdir().unwrap();
        check_plugin(&dir.path().join("absent.wasm")).unwrap();
    }
}
