//! The user's cache folder, where acemq-host keeps what it can make again
//! but would rather not: compiled plugins (`plugins/`, with their key
//! `plugins.key` beside it), the guest toolchains `plugin build` installs
//! on first use (`toolchains/`), and the records of rollouts
//! (`rollouts/`).
//!
//! It follows the XDG base-directory rule every Linux tool does:
//! `$XDG_CACHE_HOME/acemq-host` when that is an absolute path, otherwise
//! `$HOME/.cache/acemq-host`. With neither, there is no user cache, and what
//! would use it says so and does without.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The folder under the cache home that belongs to acemq-host.
const APP: &str = "acemq-host";

/// `acemq-host`'s folder in the user's cache, from the environment.
pub fn dir() -> Option<PathBuf> {
    dir_from(std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME"))
}

/// `acemq-host`'s folder in the cache given `XDG_CACHE_HOME` and `HOME`.
/// A relative or empty value counts as unset, as the XDG specification
/// says it must.
pub fn dir_from(xdg_cache_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    let absolute =
        |value: Option<OsString>| value.map(PathBuf::from).filter(|path| path.is_absolute());
    absolute(xdg_cache_home)
        .or_else(|| absolute(home).map(|home| home.join(".cache")))
        .map(|base| base.join(APP))
}

/// Where compiled plugins are cached when the configuration names no folder.
pub fn compiled_plugins() -> Option<PathBuf> {
    dir().map(|dir| compiled_plugins_in(&dir))
}

/// The compiled-plugin folder inside an acemq-host cache folder.
pub fn compiled_plugins_in(cache: &Path) -> PathBuf {
    cache.join("plugins")
}

/// Where rollout records are kept when the configuration names no folder.
pub fn rollouts() -> Option<PathBuf> {
    dir().map(|dir| dir.join("rollouts"))
}

/// Where `plugin build` installs the guest toolchains it pins.
pub fn toolchains() -> Option<PathBuf> {
    dir().map(|dir| dir.join("toolchains"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(value: &str) -> Option<OsString> {
        Some(OsString::from(value))
    }

    #[test]
    fn xdg_cache_home_comes_first_then_home() {
        assert_eq!(
            dir_from(os("/x/cache"), os("/home/ada")),
            Some(PathBuf::from("/x/cache/acemq-host"))
        );
        assert_eq!(
            dir_from(None, os("/home/ada")),
            Some(PathBuf::from("/home/ada/.cache/acemq-host"))
        );
    }

    #[test]
    fn relative_or_empty_values_count_as_unset() {
        assert_eq!(
            dir_from(os("cache"), os("/home/ada")),
            Some(PathBuf::from("/home/ada/.cache/acemq-host"))
        );
        assert_eq!(
            dir_from(os(""), os("/root")),
            Some(PathBuf::from("/root/.cache/acemq-host"))
        );
        assert_eq!(dir_from(os(""), os("relative")), None);
        assert_eq!(dir_from(None, None), None);
    }

    #[test]
    fn compiled_plugins_sit_in_their_own_folder_with_the_key_beside_it() {
        let plugins = compiled_plugins_in(Path::new("/home/ada/.cache/acemq-host"));
        assert_eq!(
            plugins,
            PathBuf::from("/home/ada/.cache/acemq-host/plugins")
        );
        assert_eq!(
            crate::plugin::default_cache_key_file(&plugins),
            Some(PathBuf::from("/home/ada/.cache/acemq-host/plugins.key"))
        );
    }
}
