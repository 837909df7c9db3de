//! After `plugin build`: each component compiled to machine code once, into
//! the user's compiled-plugin cache, so that the first host start, hot swap
//! or `validate` after a build takes it from there instead of compiling
//! (seconds for a Python or JavaScript plugin, which carries its
//! interpreter).
//!
//! The machine code is made by an engine with a host's default settings;
//! the cache key covers wasmtime's version and every compilation setting
//! that changes the code (`engine_fingerprint`), so a host configured
//! otherwise (`fuel_metering = true`) simply compiles again, never runs
//! code made for other settings. The entries are sealed with the cache's
//! key like any the host writes itself.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::plugin::{CacheChoice, EngineSettings, PluginEngine};

/// What precompiling one component came to.
#[derive(Debug)]
pub enum Precompiled {
    /// Compiled and stored in the cache.
    Compiled(Duration),
    /// The cache already held it (nothing changed since the last build).
    AlreadyCached,
    /// Not compiled: the reason (the component is still built).
    Failed(String),
}

/// Where the entries went and what became of each component.
#[derive(Debug)]
pub struct Report {
    /// `None` when there is no user cache (the log said why).
    pub cache: Option<PathBuf>,
    pub components: Vec<(PathBuf, Precompiled)>,
}

/// Compiles each of `components` into the user's cache.
pub fn precompile(components: &[PathBuf]) -> Report {
    let engine = match PluginEngine::new(EngineSettings {
        // One instance is never made here: the pool's size matters not.
        max_instances: 1,
        cache: CacheChoice::UserDefault,
        ..EngineSettings::default()
    }) {
        Ok(engine) => engine,
        Err(e) => {
            return Report {
                cache: None,
                components: components
                    .iter()
                    .map(|path| (path.clone(), Precompiled::Failed(format!("{e:#}"))))
                    .collect(),
            };
        }
    };
    let Some(cache) = engine.cache_dir().map(Path::to_path_buf) else {
        return Report {
            cache: None,
            components: Vec::new(),
        };
    };
    let components = components
        .iter()
        .map(|path| {
            let started = Instant::now();
            let outcome = match engine.compile_file(path) {
                Ok(compiled) if compiled.from_cache => Precompiled::AlreadyCached,
                Ok(_) => Precompiled::Compiled(started.elapsed()),
                Err(e) => Precompiled::Failed(e.to_string()),
            };
            (path.clone(), outcome)
        })
        .collect();
    Report {
        cache: Some(cache),
        components,
    }
}

/// The lines `plugin build` prints after its own.
pub fn summary(report: &Report) -> String {
    let Some(cache) = &report.cache else {
        return "not precompiled: there is no compiled-plugin cache (see the warning above)\n"
            .to_string();
    };
    let mut out = String::new();
    for (path, outcome) in &report.components {
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |name| name.to_string_lossy().into_owned(),
        );
        out.push_str(&match outcome {
            Precompiled::Compiled(took) => format!(
                "{name}: precompiled in {:.1} s into {}\n",
                took.as_secs_f64(),
                super::shown(cache)
            ),
            Precompiled::AlreadyCached => format!("{name}: precompiled code up to date\n"),
            Precompiled::Failed(why) => format!("{name}: not precompiled: {why}\n"),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_says_what_became_of_each_component() {
        let report = Report {
            cache: Some(PathBuf::from("/home/ada/.cache/acemq-host/plugins")),
            components: vec![
                (
                    PathBuf::from("out/router.wasm"),
                    Precompiled::Compiled(Duration::from_millis(8_400)),
                ),
                (PathBuf::from("out/audit.wasm"), Precompiled::AlreadyCached),
                (
                    PathBuf::from("out/broken.wasm"),
                    Precompiled::Failed("does not compile: bad section".into()),
                ),
            ],
        };
        assert_eq!(
            summary(&report),
            "router.wasm: precompiled in 8.4 s into /home/ada/.cache/acemq-host/plugins\n\
             audit.wasm: precompiled code up to date\n\
             broken.wasm: not precompiled: does not compile: bad section\n"
        );
        let without = Report {
            cache: None,
            components: Vec::new(),
        };
        assert!(
            summary(&without).starts_with("not precompiled: there is no compiled-plugin cache")
        );
    }
}
