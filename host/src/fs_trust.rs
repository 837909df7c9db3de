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
//! A plugin's own folder is not enough: whoever can write any folder above
//! it can rename the plugin folder away and put one of their own in its
//! place. So every folder on the way to a plugin, from `/` down, of the path
//! as named and of the path it resolves to, must be owned by a trusted user
//! and writable by no one else ([`judge_ancestor`]). The one exception is
//! what `/tmp` is: a folder with the sticky bit lets others add names, but
//! not rename or remove an entry they do not own, so it is safe to pass
//! through when the entry on the way is owned by a trusted user (as OpenSSH
//! and sudo reason about such folders). The plugin's own folder gets no
//! such exception: anyone could add files to it. Hot swap checks all of
//! this again before every reload (`plugin/swap.rs`).
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

/// Whether a folder on the way to a plugin (not the plugin's own folder)
/// may be passed through: `found` is the folder, `next_uid` the owner of the
/// entry inside it that the path goes on to (not following a symlink: who
/// owns the link is who could point it elsewhere). The reason when not.
pub fn judge_ancestor(found: Ownership, next_uid: u32, euid: u32) -> Result<(), String> {
    let Ownership { mode, uid } = found;
    if uid != euid && uid != 0 {
        return Err(format!(
            "is owned by uid {uid} (mode {mode:04o}), neither the host's user (uid {euid}) nor \
             root: that user could replace what is below it, and so change what the host runs; \
             chown it to uid {euid}"
        ));
    }
    let by = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (false, false) => return Ok(()),
        (true, false) => "its group",
        (false, true) => "others",
        (true, true) => "its group and others",
    };
    let sticky = mode & 0o1000 != 0;
    if sticky && (next_uid == euid || next_uid == 0) {
        // Others may add names here, and cannot touch the entry on the way.
        return Ok(());
    }
    if sticky {
        return Err(format!(
            "is writable by {by} with the sticky bit (mode {mode:04o}), and the entry in it on \
             the way to the plugin is owned by uid {next_uid}, neither the host's user (uid \
             {euid}) nor root: that user could replace it; keep plugins under folders only \
             the host's user or root can write"
        ));
    }
    Err(format!(
        "is writable by {by} (mode {mode:04o}, owner uid {uid}): whoever can write to it could \
         rename the folders below it away and put their own in their place, and so choose what \
         the host runs; remove the write bits (chmod go-w)"
    ))
}

/// Whether a folder that [`judge`] or [`judge_ancestor`] refused for its
/// write bits is a Kubernetes ConfigMap, Secret or projected volume, which
/// may be trusted whatever its mode: the kubelet mounts such a volume
/// read-only in the container (so its write bits, 0777 by the kubelet's
/// convention, let nobody in it write), gives it to root, and publishes new
/// contents by swapping its `..data` link (which is how the host's file
/// watcher sees them, `plugin/swap.rs`). Only the kubelet changes it, on
/// behalf of whoever may edit the ConfigMap: that person chooses the
/// plugin, as whoever runs the deploy tool does elsewhere.
pub fn is_kubelet_volume(read_only_mount: bool, has_data_link: bool, owner_uid: u32) -> bool {
    read_only_mount && has_data_link && owner_uid == 0
}

/// The facts [`is_kubelet_volume`] judges, read from `folder`.
fn kubelet_volume_at(folder: &Path, owner_uid: u32) -> bool {
    let has_data_link = std::fs::symlink_metadata(folder.join("..data"))
        .is_ok_and(|link| link.file_type().is_symlink());
    has_data_link && is_kubelet_volume(read_only_mount(folder), has_data_link, owner_uid)
}

/// Whether the file system `path` is on is mounted read-only.
fn read_only_mount(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(name) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let mut facts = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: statvfs(3) reads the NUL-terminated name and fills `facts`,
    // which is read only when it succeeded.
    let filled = unsafe { libc::statvfs(name.as_ptr(), facts.as_mut_ptr()) } == 0;
    // SAFETY: filled by the successful call above.
    filled && unsafe { facts.assume_init() }.f_flag & libc::ST_RDONLY != 0
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

/// [`check_folder`] for a plugin's folder, which may also be a Kubernetes
/// volume ([`is_kubelet_volume`]).
fn check_plugin_folder(path: &Path) -> Result<(), Refused> {
    check_folder("plugin folder", path).or_else(|refused| {
        let owner = std::fs::metadata(path).map_or(u32::MAX, |m| m.uid());
        if kubelet_volume_at(path, owner) {
            Ok(())
        } else {
            Err(refused)
        }
    })
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

/// Checks a plugin file, the folders that hold it and every folder above
/// them (see the module doc): the folder it is named in and, when the name
/// resolves elsewhere through a symlink (a Kubernetes ConfigMap, a deploy
/// tool's "current" link), the folder of the file it resolves to, each with
/// its ancestors up to `/`. What does not exist is left to the loader,
/// which says so in its own words.
pub fn check_plugin(path: &Path) -> Result<(), Refused> {
    let named = absolute(path);
    let mut folders = vec![folder_of(&named)];
    let resolved = std::fs::canonicalize(&named).ok();
    if let Some(real) = &resolved {
        let real_folder = folder_of(real);
        if std::fs::canonicalize(&folders[0]).ok().as_deref() != Some(real_folder.as_path()) {
            folders.push(real_folder);
        }
    }
    // Ancestors first, from `/` down, so the refusal names the highest
    // folder at fault; each checked once, whichever path passes it.
    let mut checked = std::collections::BTreeSet::new();
    for folder in &folders {
        check_ancestors(folder, &mut checked)?;
    }
    if let Some(real) = &resolved {
        check_ancestors(&folder_of(real), &mut checked)?;
    }
    for folder in &folders {
        if folder.exists() {
            check_plugin_folder(folder)?;
        }
    }
    match std::fs::metadata(&named) {
        Ok(metadata) => check_metadata("plugin file", path, &metadata, Rule::OwnerWritesOnly),
        Err(_) => Ok(()),
    }
}

/// Checks every folder above `folder` (not `folder` itself) with
/// [`judge_ancestor`], skipping the (folder, next entry) pairs in `checked`
/// and adding the rest.
fn check_ancestors(
    folder: &Path,
    checked: &mut std::collections::BTreeSet<(PathBuf, PathBuf)>,
) -> Result<(), Refused> {
    let mut chain: Vec<&Path> = folder.ancestors().collect();
    chain.reverse();
    // Each ancestor with the entry below it on the way to `folder`.
    for pair in chain.windows(2) {
        let (ancestor, next) = (pair[0], pair[1]);
        if !checked.insert((ancestor.to_path_buf(), next.to_path_buf())) {
            continue;
        }
        let Ok(metadata) = std::fs::metadata(ancestor) else {
            // Missing: the loader names what is missing.
            continue;
        };
        let Ok(next_metadata) = std::fs::symlink_metadata(next) else {
            continue;
        };
        let judged = judge_ancestor(Ownership::of(&metadata), next_metadata.uid(), euid());
        if judged.is_err() && kubelet_volume_at(ancestor, metadata.uid()) {
            continue;
        }
        judged.map_err(|reason| Refused::new("folder above a plugin", ancestor, reason))?;
    }
    Ok(())
}

/// `path` made absolute against the current folder (not resolved: the
/// folders it names are checked as named).
fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        return path.to_path_buf();
    }
    match std::env::current_dir() {
        Ok(here) => here.join(path),
        Err(_) => path.to_path_buf(),
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
    fn only_a_read_only_root_owned_folder_with_the_data_link_is_a_kubelet_volume() {
        assert!(is_kubelet_volume(true, true, 0));
        // Writable: someone in the container could put a plugin there.
        assert!(!is_kubelet_volume(false, true, 0));
        // No `..data` link: a read-only mount of anything else.
        assert!(!is_kubelet_volume(true, false, 0));
        // The kubelet gives its volumes to root.
        assert!(!is_kubelet_volume(true, true, HOST));
    }

    /// A plain folder with a `..data` link is no volume: it is writable.
    #[test]
    fn a_writable_folder_with_a_data_link_is_still_refused() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("volume");
        std::fs::create_dir(&folder).unwrap();
        std::os::unix::fs::symlink(".", folder.join("..data")).unwrap();
        std::fs::write(folder.join("p.wasm"), b"x").unwrap();
        chmod(&folder, 0o777);
        let refused = check_plugin(&folder.join("p.wasm")).unwrap_err();
        assert!(
            refused.reason.contains("writable by its group and others"),
            "{refused}"
        );
        assert!(!read_only_mount(&folder));
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

    /// The rules for folders above a plugin, for a host that is not root
    /// (the tests run as root, where every path is root's).
    #[test]
    fn a_folder_above_a_plugin_is_judged_by_its_owner_its_mode_and_the_sticky_bit() {
        for mode in [0o755, 0o700, 0o555] {
            assert_eq!(judge_ancestor(owned(mode, 0), HOST, HOST), Ok(()));
            assert_eq!(judge_ancestor(owned(mode, HOST), 1001, HOST), Ok(()));
        }
        let reason = judge_ancestor(owned(0o755, 1001), HOST, HOST).unwrap_err();
        assert!(reason.contains("is owned by uid 1001"), "{reason}");
        for mode in [0o775, 0o757, 0o777] {
            let reason = judge_ancestor(owned(mode, 0), HOST, HOST).unwrap_err();
            assert!(
                reason.contains(&format!("(mode {mode:04o}, owner uid 0)"))
                    && reason.contains("rename the folders below it away"),
                "{reason}"
            );
        }
        // /tmp: shared, sticky. Passing through it to an entry the host's
        // user (or root) owns is safe; to anyone else's entry is not.
        assert_eq!(judge_ancestor(owned(0o1777, 0), HOST, HOST), Ok(()));
        assert_eq!(judge_ancestor(owned(0o1777, 0), 0, HOST), Ok(()));
        let reason = judge_ancestor(owned(0o1777, 0), 1001, HOST).unwrap_err();
        assert!(
            reason.contains("sticky bit (mode 1777)") && reason.contains("owned by uid 1001"),
            "{reason}"
        );
    }

    /// A plugin laid out as `<tmp>/<top>/<mid>/plugins/handler.wasm`, every
    /// part private to its owner: returns the folders and the file.
    fn layout() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("top");
        let mid = top.join("mid");
        let plugins = mid.join("plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        let plugin = plugins.join("handler.wasm");
        std::fs::write(&plugin, b"\0asm").unwrap();
        for folder in [&top, &mid, &plugins] {
            chmod(folder, 0o755);
        }
        chmod(&plugin, 0o644);
        (dir, top, mid, plugin)
    }

    /// Whoever can write a folder above the plugin's own can swap the
    /// plugin folder: any writable folder on the way is refused by name.
    #[test]
    fn a_writable_folder_anywhere_above_a_plugin_is_refused_naming_it() {
        let (_dir, top, mid, plugin) = layout();
        // The temporary folder itself sits in /tmp: sticky, passed through.
        check_plugin(&plugin).unwrap();
        for (folder, mode) in [(&top, 0o777), (&mid, 0o775), (&top, 0o757)] {
            chmod(folder, mode);
            let err = check_plugin(&plugin).unwrap_err();
            assert_eq!(err.what, "folder above a plugin", "{err}");
            assert_eq!(&err.path, folder, "{err}");
            assert!(err.reason.contains(&format!("(mode {mode:04o}")), "{err}");
            chmod(folder, 0o755);
        }
        check_plugin(&plugin).unwrap();
    }

    /// A sticky shared folder on the way is passed through when the entry
    /// below it is the host's (or root's), and refused when another user
    /// owns that entry: they could rename it and put theirs in its place.
    #[test]
    fn a_sticky_folder_above_a_plugin_is_passed_only_to_an_entry_of_a_trusted_owner() {
        let (_dir, top, mid, plugin) = layout();
        chmod(&top, 0o1777);
        check_plugin(&plugin).unwrap();
        if euid() != 0 {
            return; // Only root can give `mid` away.
        }
        std::os::unix::fs::chown(&mid, Some(65534), None).unwrap();
        let err = check_plugin(&plugin).unwrap_err();
        assert_eq!(err.path, top, "{err}");
        assert!(
            err.reason.contains("sticky bit (mode 1777)") && err.reason.contains("uid 65534"),
            "{err}"
        );
        // Without the sticky bit the folder is refused whoever owns `mid`.
        std::os::unix::fs::chown(&mid, Some(0), None).unwrap();
        chmod(&top, 0o777);
        assert_eq!(check_plugin(&plugin).unwrap_err().path, top);
    }

    /// A folder above a plugin that belongs to another user is refused
    /// however private its mode.
    #[test]
    fn a_folder_above_a_plugin_of_another_user_is_refused() {
        if euid() != 0 {
            return; // Only root can give a folder away.
        }
        let (_dir, top, _mid, plugin) = layout();
        std::os::unix::fs::chown(&top, Some(65534), None).unwrap();
        let err = check_plugin(&plugin).unwrap_err();
        assert_eq!(err.path, top, "{err}");
        assert!(err.reason.contains("is owned by uid 65534"), "{err}");
    }

    /// The folders above the file a plugin symlink resolves to are checked
    /// as well as those above the link.
    #[test]
    fn the_folders_above_a_plugin_symlinks_target_are_checked_too() {
        let (dir, top, _mid, plugin) = layout();
        let named = dir.path().join("current");
        std::fs::create_dir(&named).unwrap();
        chmod(&named, 0o755);
        std::os::unix::fs::symlink(&plugin, named.join("handler.wasm")).unwrap();
        check_plugin(&named.join("handler.wasm")).unwrap();
        chmod(&top, 0o777);
        let err = check_plugin(&named.join("handler.wasm")).unwrap_err();
        assert_eq!(err.path, top.canonicalize().unwrap(), "{err}");
    }

    /// A relative plugin path is checked up to `/` too, from the current
    /// folder (the path a config names is resolved against its file, so the
    /// host sees absolute ones; `plugin check` may not).
    #[test]
    fn a_relative_path_is_checked_from_the_current_folder() {
        let absolute = absolute(Path::new("plugins/handler.wasm"));
        assert!(absolute.is_absolute());
        assert!(absolute.ends_with("plugins/handler.wasm"));
    }

    #[test]
    fn a_missing_plugin_is_left_to_the_loader() {
        let dir = tempfile::tempdir().unwrap();
        check_plugin(&dir.path().join("absent.wasm")).unwrap();
    }
}
