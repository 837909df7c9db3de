//! The compiled-plugin cache: the native code compiled from plugins, kept on
//! disk so that a restart does not compile again, and used only when the
//! host can prove it wrote that code itself, for that plugin.
//!
//! Loading a cache entry maps its bytes as executable code. wasmtime checks
//! that they are a compiled component for a compatible engine, not where they
//! came from: whoever can write an entry runs native code in the host, or
//! puts another plugin's code under a trusted plugin's hash. So every entry
//! carries an HMAC-SHA256 computed by the host, with a key kept outside the
//! cache folder, over the engine's fingerprint (wasmtime's version and
//! compilation settings), the SHA-256 of the plugin's source and the compiled
//! bytes. An entry whose MAC is missing or wrong is never deserialized: the
//! plugin is compiled from its source again and the entry overwritten.
//!
//! An entry is one file, `{source sha256}-{engine fingerprint}.cwasm`:
//!
//! ```text
//! MAGIC (16 bytes) | MAC (32 bytes) | wasmtime's serialized component
//! ```
//!
//! The MAC is a header rather than a side file: one file is replaced by one
//! rename, so no reader ever pairs an artifact with another one's MAC, and
//! the entry is read into memory once, so the bytes verified are the bytes
//! deserialized (no window to swap the file between the check and the use).
//!
//! The sealing and opening of entries ([`seal`], [`unseal`]) are pure; the
//! rest reads and writes files.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use rand::TryRngCore;
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::fs_trust::{self, Refused, Rule};

/// Marks an entry sealed by this format (and is covered by the MAC).
const MAGIC: &[u8; 16] = b"acemq-cwasm-mac1";
const MAC_LEN: usize = 32;
/// The key's length: HMAC-SHA256's block-sized security, 256 bits.
pub const KEY_LEN: usize = 32;

const KEY_FILE: &str = "plugin cache key file";
const CACHE_FOLDER: &str = "plugin cache folder";

type HmacSha256 = Hmac<Sha256>;

/// The secret that authenticates cache entries. Deliberately not `Debug`,
/// so it can never be formatted into a log line.
pub struct CacheKey([u8; KEY_LEN]);

/// What an entry's MAC binds its compiled bytes to.
#[derive(Clone, Copy)]
pub struct EntryId<'a> {
    /// [`engine_fingerprint`] of the engine that compiled it.
    pub engine: &'a [u8; 32],
    /// SHA-256 of the plugin file's bytes it was compiled from.
    pub source: &'a [u8; 32],
}

/// Why an entry is not trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Untrusted {
    /// No header: written by an older host, or not by a host at all.
    NoMac,
    /// A header whose MAC does not match: the bytes were changed, were
    /// compiled from another plugin or by another engine, or sealed with
    /// another key.
    WrongMac,
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Untrusted::NoMac => "it carries no MAC (written by an older host, or not by this one)",
            Untrusted::WrongMac => {
                "its MAC does not match (changed since this host wrote it, compiled from another \
                 plugin, or sealed with another key)"
            }
        })
    }
}

fn mac(key: &CacheKey, id: EntryId<'_>, artifact: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(&key.0).expect("HMAC accepts keys of any length");
    // Fixed-length fields first, the one variable-length field last: no two
    // different entries feed the MAC the same bytes.
    mac.update(MAGIC);
    mac.update(id.engine);
    mac.update(id.source);
    mac.update(artifact);
    mac
}

/// The entry file's bytes for a compiled `artifact`.
pub fn seal(key: &CacheKey, id: EntryId<'_>, artifact: &[u8]) -> Vec<u8> {
    let tag = mac(key, id, artifact).finalize().into_bytes();
    let mut entry = Vec::with_capacity(MAGIC.len() + MAC_LEN + artifact.len());
    entry.extend_from_slice(MAGIC);
    entry.extend_from_slice(&tag);
    entry.extend_from_slice(artifact);
    entry
}

/// The compiled bytes of `entry`, if its MAC proves this host sealed them
/// for `id`. The comparison takes the same time wherever the MAC differs.
pub fn unseal<'e>(key: &CacheKey, id: EntryId<'_>, entry: &'e [u8]) -> Result<&'e [u8], Untrusted> {
    let rest = entry
        .strip_prefix(MAGIC.as_slice())
        .ok_or(Untrusted::NoMac)?;
    if rest.len() < MAC_LEN {
        return Err(Untrusted::NoMac);
    }
    let (tag, artifact) = rest.split_at(MAC_LEN);
    mac(key, id, artifact)
        .verify_slice(tag)
        .map_err(|_| Untrusted::WrongMac)?;
    Ok(artifact)
}

/// Feeds what a value hashes into SHA-256: a digest of wasmtime's
/// compatibility data that, unlike `DefaultHasher`, is the same in every
/// build of the host.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        // `Hash` implementations only write; the digest is read with
        // `finalize` instead.
        unreachable!("the digest is read with finalize")
    }
}

/// What makes compiled code usable by `engine`: wasmtime's version, the
/// target and every compilation setting (`precompile_compatibility_hash`).
pub fn engine_fingerprint(engine: &Engine) -> [u8; 32] {
    let mut hasher = Sha256Hasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hasher.0.finalize().into()
}

/// Where the key lives unless configured: beside the cache folder, named
/// after it (`/var/cache/acemq/plugins` → `/var/cache/acemq/plugins.key`).
/// `None` for a folder without a name of its own (`/`, `.`).
pub fn default_key_file(cache_dir: &Path) -> Option<PathBuf> {
    let mut name = cache_dir.file_name()?.to_os_string();
    name.push(".key");
    Some(cache_dir.with_file_name(name))
}

impl CacheKey {
    /// Reads the key file, or creates it with a fresh random key when it
    /// does not exist. Refuses a key file that is not a regular file, is not
    /// private to a trusted owner, or does not hold exactly one key.
    pub fn load_or_create(path: &Path) -> Result<Self, Refused> {
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                create_key_file(path)?;
                // Read back what is there rather than the key just drawn:
                // if another host created the file first, both use its key.
                std::fs::File::open(path)
                    .map_err(|e| Refused::new(KEY_FILE, path, format!("cannot be opened: {e}")))?
            }
            Err(e) => {
                return Err(Refused::new(
                    KEY_FILE,
                    path,
                    format!("cannot be opened: {e}"),
                ));
            }
        };
        read_key(path, file)
    }

    #[cfg(test)]
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// A key for another kind of entry, derived from this one: what is
    /// sealed for one purpose never opens for another.
    pub fn derive(&self, purpose: &[u8]) -> CacheKey {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC accepts keys of any length");
        mac.update(purpose);
        CacheKey(mac.finalize().into_bytes().into())
    }
}

/// Creates the key file with 32 random bytes, exclusively: the bytes are
/// written to a temporary file created with O_EXCL and mode 0600, which is
/// then linked to the key's name only if nothing has that name yet. A
/// reader therefore never sees a half-written key, and a name someone else
/// created (or a symlink planted there) is never written through.
fn create_key_file(path: &Path) -> Result<(), Refused> {
    let refused =
        |e: std::io::Error| Refused::new(KEY_FILE, path, format!("cannot be created: {e}"));
    let mut key = [0u8; KEY_LEN];
    rand::rngs::OsRng
        .try_fill_bytes(&mut key)
        .map_err(|e| refused(std::io::Error::other(e)))?;
    let folder = match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".acemq-key-")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(folder)
        .map_err(refused)?;
    tmp.write_all(&key).map_err(refused)?;
    tmp.as_file().sync_all().map_err(refused)?;
    match tmp.persist_noclobber(path) {
        Ok(_) => {
            tracing::info!(key_file = %path.display(), "created a new plugin cache key");
            Ok(())
        }
        // Another host created it meanwhile: its key is the one to use.
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(refused(e.error)),
    }
}

/// Checks the open key file (its own metadata, so the file checked is the
/// file read) and reads the key.
fn read_key(path: &Path, mut file: std::fs::File) -> Result<CacheKey, Refused> {
    let metadata = file
        .metadata()
        .map_err(|e| Refused::new(KEY_FILE, path, format!("cannot be read: {e}")))?;
    if !metadata.is_file() {
        return Err(Refused::new(KEY_FILE, path, "is not a regular file"));
    }
    fs_trust::check_metadata(KEY_FILE, path, &metadata, Rule::OwnerOnly)?;
    if metadata.len() != KEY_LEN as u64 {
        return Err(Refused::new(
            KEY_FILE,
            path,
            format!(
                "holds {} bytes, and a key is {KEY_LEN}: delete it to have a new key made (every \
                 cache entry is then compiled again)",
                metadata.len()
            ),
        ));
    }
    let mut key = [0u8; KEY_LEN];
    file.read_exact(&mut key)
        .map_err(|e| Refused::new(KEY_FILE, path, format!("cannot be read: {e}")))?;
    Ok(CacheKey(key))
}

/// The cache folder, with the key that authenticates its entries.
pub struct PluginCache {
    dir: PathBuf,
    key: CacheKey,
    engine: [u8; 32],
}

impl PluginCache {
    /// Opens (creating it with mode 0700 when missing) the cache folder and
    /// its key. Refuses, with the reason, a folder others could write, a key
    /// file others could read or write, and a key inside the folder it
    /// protects.
    pub fn open(engine: &Engine, dir: &Path, key_file: Option<&Path>) -> Result<Self, Refused> {
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| Refused::new(CACHE_FOLDER, dir, format!("cannot be created: {e}")))?;
        }
        fs_trust::check_folder(CACHE_FOLDER, dir)?;
        let key_file = match key_file {
            Some(path) => path.to_path_buf(),
            None => default_key_file(dir).ok_or_else(|| {
                Refused::new(
                    CACHE_FOLDER,
                    dir,
                    "has no name to put its key file beside; set [host] plugin_cache_key_file",
                )
            })?,
        };
        check_key_outside(dir, &key_file)?;
        let key = CacheKey::load_or_create(&key_file)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            key,
            engine: engine_fingerprint(engine),
        })
    }

    /// The folder the entries are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Lets `functions` keep compiled functions in this folder, sealed
    /// under a key of their own.
    pub fn arm(&self, functions: &super::functions::FunctionCache) {
        functions.arm(
            &self.dir,
            self.key.derive(b"acemq-host compiled functions"),
            self.engine,
        );
    }

    fn entry_path(&self, source: &[u8; 32]) -> PathBuf {
        self.dir.join(format!(
            "{}-{}.cwasm",
            hex::encode(source),
            hex::encode(&self.engine[..8])
        ))
    }

    /// The cached compilation of the plugin whose source hashes to `source`,
    /// if there is one and its MAC proves this host wrote it. Anything else
    /// is logged (naming the entry and the plugin) and answered with `None`,
    /// so the caller compiles from the source and overwrites the entry.
    pub fn load(&self, engine: &Engine, plugin: &Path, source: &[u8; 32]) -> Option<Component> {
        let path = self.entry_path(source);
        let entry = match std::fs::read(&path) {
            Ok(entry) => entry,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(cache = %path.display(), error = %e, "cannot read a compiled-plugin cache entry; compiling the plugin instead");
                return None;
            }
        };
        let id = EntryId {
            engine: &self.engine,
            source,
        };
        let artifact = match unseal(&self.key, id, &entry) {
            Ok(artifact) => artifact,
            Err(why) => {
                tracing::warn!(
                    cache = %path.display(),
                    plugin = %plugin.display(),
                    "compiled-plugin cache entry is not trusted: {why}; compiling the plugin from \
                     its source and overwriting the entry"
                );
                return None;
            }
        };
        // SAFETY: the bytes are in memory and their MAC, under a key only
        // this host's user can read, proves this host serialized them from
        // its own compilation of exactly this source with an engine of this
        // fingerprint; wasmtime requires no more of `deserialize`.
        match unsafe { Component::deserialize(engine, artifact) } {
            Ok(component) => Some(component),
            Err(e) => {
                tracing::warn!(cache = %path.display(), error = %e, "ignoring an unusable compiled-plugin cache entry");
                None
            }
        }
    }

    /// Writes the entry for a plugin compiled from `source`, sealed. The
    /// bytes go to a temporary file created exclusively under a random name
    /// in the cache folder, then renamed over the entry: a crash never
    /// leaves half an entry under its name, and nobody can plant a file or
    /// a symlink at a name the host is about to write through.
    pub fn store(&self, source: &[u8; 32], component: &Component) -> anyhow::Result<PathBuf> {
        let artifact = component.serialize()?;
        let id = EntryId {
            engine: &self.engine,
            source,
        };
        let path = self.entry_path(source);
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        tmp.write_all(&seal(&self.key, id, &artifact))?;
        tmp.persist(&path)?;
        Ok(path)
    }
}

/// Refuses a key file inside the folder it protects: the key must not travel
/// with the entries (a copied or shared cache folder would carry the means to
/// forge them).
fn check_key_outside(dir: &Path, key_file: &Path) -> Result<(), Refused> {
    let key_folder = match key_file.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    let (Ok(dir), Ok(key_folder)) = (dir.canonicalize(), key_folder.canonicalize()) else {
        // A missing key folder is reported when the key file is created.
        return Ok(());
    };
    if key_folder.starts_with(&dir) {
        return Err(Refused::new(
            KEY_FILE,
            key_file,
            format!(
                "is inside the cache folder {} it protects; keep it outside (the default is \
                 beside the folder)",
                dir.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENGINE: [u8; 32] = [7; 32];
    const SOURCE: [u8; 32] = [1; 32];

    fn key() -> CacheKey {
        CacheKey::from_bytes([42; KEY_LEN])
    }

    fn id<'a>(engine: &'a [u8; 32], source: &'a [u8; 32]) -> EntryId<'a> {
        EntryId { engine, source }
    }

    #[test]
    fn a_sealed_entry_opens_to_its_artifact() {
        let entry = seal(&key(), id(&ENGINE, &SOURCE), b"native code");
        assert_eq!(
            unseal(&key(), id(&ENGINE, &SOURCE), &entry),
            Ok(b"native code".as_slice())
        );
    }

    #[test]
    fn a_tampered_artifact_is_refused() {
        let mut entry = seal(&key(), id(&ENGINE, &SOURCE), b"native code");
        *entry.last_mut().unwrap() ^= 1;
        assert_eq!(
            unseal(&key(), id(&ENGINE, &SOURCE), &entry),
            Err(Untrusted::WrongMac)
        );
        let mut longer = seal(&key(), id(&ENGINE, &SOURCE), b"native code");
        longer.extend_from_slice(b" and more");
        assert_eq!(
            unseal(&key(), id(&ENGINE, &SOURCE), &longer),
            Err(Untrusted::WrongMac)
        );
    }

    #[test]
    fn an_entry_for_another_source_is_refused() {
        // Plugin A's entry under plugin B's name: same key, same engine.
        let entry = seal(&key(), id(&ENGINE, &SOURCE), b"plugin A's code");
        let other_source = [2; 32];
        assert_eq!(
            unseal(&key(), id(&ENGINE, &other_source), &entry),
            Err(Untrusted::WrongMac)
        );
    }

    #[test]
    fn an_entry_for_another_engine_is_refused() {
        let entry = seal(&key(), id(&ENGINE, &SOURCE), b"native code");
        assert_eq!(
            unseal(&key(), id(&[8; 32], &SOURCE), &entry),
            Err(Untrusted::WrongMac)
        );
    }

    #[test]
    fn an_entry_sealed_with_another_key_is_refused() {
        let entry = seal(
            &CacheKey::from_bytes([43; KEY_LEN]),
            id(&ENGINE, &SOURCE),
            b"native code",
        );
        assert_eq!(
            unseal(&key(), id(&ENGINE, &SOURCE), &entry),
            Err(Untrusted::WrongMac)
        );
    }

    #[test]
    fn an_entry_without_a_mac_is_refused() {
        // What hosts before the MAC wrote: wasmtime's bytes alone.
        assert_eq!(
            unseal(&key(), id(&ENGINE, &SOURCE), b"\x7fELF..."),
            Err(Untrusted::NoMac)
        );
        assert_eq!(
            unseal(&key(), id(&ENGINE, &SOURCE), MAGIC),
            Err(Untrusted::NoMac)
        );
        // A header with the MAC cut off is refused, not sliced out of bounds.
        let entry = seal(&key(), id(&ENGINE, &SOURCE), b"");
        assert_eq!(
            unseal(&key(), id(&ENGINE, &SOURCE), &entry[..entry.len() - 1]),
            Err(Untrusted::NoMac)
        );
    }

    #[test]
    fn the_key_file_sits_beside_the_cache_folder() {
        assert_eq!(
            default_key_file(Path::new("/var/cache/acemq/plugins")),
            Some(PathBuf::from("/var/cache/acemq/plugins.key"))
        );
        assert_eq!(
            default_key_file(Path::new("cache/")),
            Some(PathBuf::from("cache.key"))
        );
        assert_eq!(default_key_file(Path::new("/")), None);
        assert_eq!(default_key_file(Path::new(".")), None);
    }

    fn mode_of(path: &Path) -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().mode() & 0o7777
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn engine() -> Engine {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        Engine::new(&config).unwrap()
    }

    #[test]
    fn a_missing_cache_and_key_are_created_private() {
        let dir = tempfile::tempdir().unwrap();
        let cache_dir = dir.path().join("var/cache");
        let cache = PluginCache::open(&engine(), &cache_dir, None).unwrap();
        assert_eq!(mode_of(&cache_dir), 0o700);
        let key_file = dir.path().join("var/cache.key");
        assert_eq!(mode_of(&key_file), 0o600);
        assert_eq!(std::fs::read(&key_file).unwrap().len(), KEY_LEN);
        // Opening again reads the same key: what one run sealed, the next opens.
        let again = PluginCache::open(&engine(), &cache_dir, None).unwrap();
        assert_eq!(cache.key.0, again.key.0);
        // Nothing but the two is left behind (no temporary key file).
        let mut names: Vec<_> = std::fs::read_dir(dir.path().join("var"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["cache", "cache.key"]);
    }

    #[test]
    fn a_stored_entry_loads_back_and_nothing_is_written_through_a_planted_name() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let cache = PluginCache::open(&engine, &dir.path().join("cache"), None).unwrap();
        let component = Component::new(&engine, wat::parse_str("(component)").unwrap()).unwrap();
        let entry = cache.entry_path(&SOURCE);
        // Hosts before this one wrote through `<entry>.tmp<pid>`: a name
        // anyone could guess, and plant a symlink at to have the host
        // overwrite a file of theirs choosing.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let planted = entry.with_extension(format!("tmp{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();

        assert_eq!(cache.store(&SOURCE, &component).unwrap(), entry);
        assert!(
            std::fs::read(&victim).unwrap() == b"precious",
            "the entry was written through the planted symlink"
        );
        assert!(cache.load(&engine, Path::new("p.wasm"), &SOURCE).is_some());
        // No temporary file is left behind either.
        let mut names: Vec<_> = std::fs::read_dir(dir.path().join("cache"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        let mut expected = vec![entry, planted];
        expected.sort();
        assert_eq!(names, expected);
    }

    #[test]
    fn a_cache_folder_others_can_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache_dir = dir.path().join("cache");
        std::fs::create_dir(&cache_dir).unwrap();
        chmod(&cache_dir, 0o777);
        let err = PluginCache::open(&engine(), &cache_dir, None)
            .err()
            .unwrap();
        assert_eq!(err.what, CACHE_FOLDER);
        assert!(
            err.to_string()
                .contains("is writable by its group and others (mode 0777"),
            "{err}"
        );
        assert!(
            !dir.path().join("cache.key").exists(),
            "a key was made for a refused folder"
        );
    }

    #[test]
    fn a_key_file_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("cache.key");
        std::fs::write(&key_file, [0u8; KEY_LEN]).unwrap();
        chmod(&key_file, 0o644);
        let err = PluginCache::open(&engine(), &dir.path().join("cache"), None)
            .err()
            .unwrap();
        assert_eq!(err.what, KEY_FILE);
        assert!(
            err.to_string()
                .contains("accessible to its group or others (mode 0644"),
            "{err}"
        );
        chmod(&key_file, 0o600);
        PluginCache::open(&engine(), &dir.path().join("cache"), None).unwrap();
    }

    #[test]
    fn a_key_file_of_the_wrong_length_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("k");
        std::fs::write(&key_file, b"short").unwrap();
        chmod(&key_file, 0o600);
        let err = PluginCache::open(&engine(), &dir.path().join("cache"), Some(&key_file))
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("holds 5 bytes, and a key is 32"),
            "{err}"
        );
    }

    #[test]
    fn a_key_inside_the_cache_folder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache_dir = dir.path().join("cache");
        let err = PluginCache::open(&engine(), &cache_dir, Some(&cache_dir.join("key")))
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("is inside the cache folder"),
            "{err}"
        );
    }
}
