//! `acemq-host plugin inspect FILE`: what a plugin file is — which contract
//! version it was built against, which world it targets, what it imports
//! and exports, its size and hash — read from the component's own type
//! information, without running it.

use std::fmt::Write as _;
use std::path::Path;

use sha2::{Digest, Sha256};
use wit_component::DecodedWasm;

use super::{Contract, PluginError};

/// The host interface of this host's own contract, named in refusals.
const HOST_IMPORT: &str = contract!("host");

/// The facts shown about a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginFacts {
    pub size: usize,
    pub sha256: String,
    pub imports: Vec<String>,
    pub exports: Vec<String>,
    /// The version of the contract it was built against, or why this host
    /// would refuse it.
    pub contract: Result<Contract, String>,
    /// The `handler-plugin` or `codec-plugin` world, qualified, or why it is neither.
    pub world: Result<String, String>,
    /// The `[consumers.config]` keys it declares it reads.
    pub config_keys: Option<Vec<String>>,
}

pub fn inspect_file(path: &Path) -> Result<String, PluginError> {
    let bytes =
        std::fs::read(path).map_err(|e| PluginError::new(path, format!("cannot read it: {e}")))?;
    let facts = inspect_bytes(path, &bytes)?;
    Ok(render(path, &facts))
}

fn inspect_bytes(path: &Path, bytes: &[u8]) -> Result<PluginFacts, PluginError> {
    if !wasmparser::Parser::is_component(bytes) {
        let what = if wasmparser::Parser::is_core_wasm(bytes) {
            "is a core WebAssembly module, not a component; build it with scripts/build-plugins \
             or convert it with `acemq-host plugin componentize`"
        } else {
            "is not a WebAssembly component"
        };
        return Err(PluginError::new(path, what));
    }
    let decoded = wit_component::decode(bytes)
        .map_err(|e| PluginError::new(path, format!("is not a valid component: {e:#}")))?;
    let DecodedWasm::Component(resolve, world_id) = decoded else {
        return Err(PluginError::new(
            path,
            "holds a WIT package, not a component",
        ));
    };
    let world = &resolve.worlds[world_id];
    let name_of = |key: &wit_parser::WorldKey| resolve.name_world_key(key);
    let imports: Vec<String> = world.imports.keys().map(name_of).collect();
    let exports: Vec<String> = world.exports.keys().map(name_of).collect();
    let contract = Contract::of_names(imports.iter().chain(&exports).map(String::as_str));
    let world = match &contract {
        Ok(contract) => classify(*contract, &imports, &exports),
        Err(why) => Err(why.clone()),
    };
    Ok(PluginFacts {
        size: bytes.len(),
        sha256: hex::encode(Sha256::digest(bytes)),
        imports,
        exports,
        contract,
        world,
        config_keys: super::config_keys::declared(bytes),
    })
}

/// Which of `contract`'s worlds the imports and exports fit.
fn classify(contract: Contract, imports: &[String], exports: &[String]) -> Result<String, String> {
    // WASI is linked, locked down, for components that import it.
    let foreign: Vec<&String> = imports
        .iter()
        .filter(|i| !i.starts_with("acemq:plugin/") && !super::host::wasi::granted(i))
        .collect();
    if !foreign.is_empty() {
        let names: Vec<&str> = foreign.iter().map(|s| s.as_str()).collect();
        return Err(format!(
            "imports {}, which this host does not provide (plugins get only {HOST_IMPORT} and a locked-down WASI 0.2)",
            names.join(", ")
        ));
    }
    let version = contract.version();
    let name = |item: &str| format!("acemq:plugin/{item}@{version}");
    let (handler, codec) = (name("handler"), name("codec"));
    if exports.contains(&handler) {
        return Ok(name("handler-plugin"));
    }
    if exports.contains(&codec) {
        return Ok(name("codec-plugin"));
    }
    Err(format!("exports neither {handler} nor {codec}"))
}

fn render(path: &Path, facts: &PluginFacts) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "file:    {}", path.display());
    let _ = writeln!(out, "size:    {} bytes", facts.size);
    let _ = writeln!(out, "sha256:  {}", facts.sha256);
    match &facts.contract {
        Ok(Contract::V0_4) => {
            let _ = writeln!(out, "contract: {} (this host's own)", Contract::V0_4);
        }
        Ok(contract) => {
            let _ = writeln!(
                out,
                "contract: {contract} (an earlier one this host still runs; rebuild it with \
                 this host's guest SDK for {})",
                Contract::V0_4
            );
        }
        Err(why) => {
            let _ = writeln!(out, "contract: refused: it {why}");
        }
    }
    match &facts.world {
        Ok(world) => {
            let _ = writeln!(out, "world:   {world}");
        }
        Err(why) => {
            let _ = writeln!(out, "world:   none of this host's ({why})");
        }
    }
    let list = |items: &[String]| {
        if items.is_empty() {
            "(none)".to_string()
        } else {
            items.join(", ")
        }
    };
    let _ = writeln!(out, "imports: {}", list(&facts.imports));
    let _ = writeln!(out, "exports: {}", list(&facts.exports));
    // (A WASI interface the host does not link is named by `world` above.)
    let wasi = wasi_grants(&facts.imports);
    if wasi.is_empty() {
        let _ = writeln!(out, "wasi:    none imported");
    } else {
        let _ = writeln!(out, "wasi:    imported, locked down:");
        for line in wasi {
            let _ = writeln!(out, "  {line}");
        }
    }
    match &facts.config_keys {
        Some(keys) => {
            let _ = writeln!(out, "config:  {}", list(keys));
        }
        None => {
            let _ = writeln!(out, "config:  not declared (no warning for unknown keys)");
        }
    }
    out
}

/// One line per row of the sandbox grant that `imports` use: the
/// interfaces imported, and what they get.
fn wasi_grants(imports: &[String]) -> Vec<String> {
    super::host::wasi::GRANT
        .iter()
        .filter_map(|grant| {
            let imported: Vec<String> = grant
                .names()
                .filter(|name| imports.iter().any(|i| i.split('@').next() == Some(name)))
                .collect();
            (!imported.is_empty()).then(|| format!("{}: {}", imported.join(", "), grant.policy))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HANDLER_EXPORT: &str = contract!("handler");
    const CODEC_EXPORT: &str = contract!("codec");

    fn names(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn worlds_are_told_apart() {
        let v0_4 = Contract::V0_4;
        assert_eq!(
            classify(v0_4, &names(&[HOST_IMPORT]), &names(&[HANDLER_EXPORT])),
            Ok(contract!("handler-plugin").to_string())
        );
        assert_eq!(
            classify(v0_4, &[], &names(&[CODEC_EXPORT])),
            Ok(contract!("codec-plugin").to_string())
        );
        // A plugin of the 0.3 contract is one of its worlds.
        assert_eq!(
            classify(
                Contract::V0_3,
                &names(&[legacy_contract!("host")]),
                &names(&[legacy_contract!("handler")])
            ),
            Ok(legacy_contract!("handler-plugin").to_string())
        );
        // WASI is linked (locked down) for the components that import it.
        assert_eq!(
            classify(
                v0_4,
                &names(&["wasi:cli/environment@0.2.0", HOST_IMPORT]),
                &names(&[HANDLER_EXPORT]),
            ),
            Ok(contract!("handler-plugin").to_string())
        );
        let err = classify(
            v0_4,
            &names(&["wasi:cli/environment@0.2.0", "wasi:http/types@0.2.0"]),
            &names(&[HANDLER_EXPORT]),
        )
        .unwrap_err();
        assert!(err.contains("wasi:http/types@0.2.0"), "{err}");
        assert!(!err.contains("wasi:cli"), "{err}");
        let err = classify(v0_4, &[], &names(&["other:thing/iface"])).unwrap_err();
        assert!(err.contains("exports neither"), "{err}");
    }

    #[test]
    fn garbage_and_core_modules_are_refused_with_reasons() {
        let err = inspect_bytes(Path::new("g.wasm"), b"garbage").unwrap_err();
        assert!(
            err.to_string()
                .contains("g.wasm: is not a WebAssembly component"),
            "{err}"
        );
        let core = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
        let err = inspect_bytes(Path::new("m.wasm"), &core).unwrap_err();
        assert!(err.to_string().contains("core WebAssembly module"), "{err}");
    }
}
