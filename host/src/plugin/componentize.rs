//! Turning a plugin's core wasm module into a component.
//!
//! Plugins are built for `wasm32-unknown-unknown` (no WASI: the `host`
//! interface is their only authority), which yields a *core* module.
//! wit-bindgen embeds the plugin's WIT world in it as a `component-type:*`
//! custom section; [`componentize`] reads that section and wraps the module
//! in a component whose imports and exports are the world's. This is what
//! `wasm-tools component new` does, without a tool to install, and with the
//! same `wit-component` version that wasmtime links, so the two always agree
//! on the binary format.
//!
//! Used by `acemq-host plugin componentize IN OUT`, which
//! `scripts/build-plugins` runs for every plugin.

use anyhow::{Context, bail};
use wasmparser::{Encoding, Parser, Payload};

/// Wraps `core_module`, a core wasm module with an embedded component type
/// (as produced by wit-bindgen), into a validated component.
///
/// Errors say what is wrong with the input: not wasm at all, already a
/// component, a core module without the embedded type (not built with
/// wit-bindgen, or its custom sections were stripped), or a module that does
/// not match its own world (a missing export, say).
pub fn componentize(core_module: &[u8]) -> anyhow::Result<Vec<u8>> {
    check_input(core_module)?;
    wit_component::ComponentEncoder::default()
        // Catches a mismatch between the module and its world here, at build
        // time, rather than when the host loads the plugin.
        .validate(true)
        .module(core_module)
        .context("the embedded component type could not be read")?
        .encode()
        .context("the module does not fit its embedded WIT world")
}

/// Checks the kind of input up front: wit-component alone would encode a
/// module *without* a component type into a component with no exports,
/// which only fails later, at load, with a less helpful message.
fn check_input(bytes: &[u8]) -> anyhow::Result<()> {
    if !bytes.starts_with(b"\0asm") {
        bail!("not a WebAssembly binary (it does not start with `\\0asm`)");
    }
    let mut has_component_type = false;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.context("not a valid WebAssembly binary")? {
            Payload::Version {
                encoding: Encoding::Component,
                ..
            } => bail!("already a component; expected a core module to wrap"),
            Payload::CustomSection(section) if section.name().starts_with("component-type") => {
                has_component_type = true;
            }
            _ => {}
        }
    }
    if !has_component_type {
        bail!(
            "a core module without an embedded component type (no `component-type` \
             custom section): build the plugin with wit-bindgen (acemq-guest does) \
             and do not strip its custom sections"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLUGIN_WIT: &str = include_str!("../../../wit/plugin.wit");
    const PLUGIN_WIT_0_3: &str = include_str!("../../../wit/v0.3/plugin.wit");

    fn error_of(bytes: &[u8]) -> String {
        format!("{:#}", componentize(bytes).unwrap_err())
    }

    #[test]
    fn refuses_what_is_not_wasm() {
        assert!(error_of(b"").contains("not a WebAssembly binary"));
        assert!(error_of(b"#!/bin/sh\necho hi\n").contains("not a WebAssembly binary"));
    }

    #[test]
    fn refuses_a_truncated_module() {
        let mut module = handler_module(true);
        module.truncate(module.len() / 2);
        assert!(error_of(&module).contains("not a valid WebAssembly binary"));
    }

    #[test]
    fn refuses_a_component() {
        let component = componentize(&handler_module(true)).unwrap();
        assert!(error_of(&component).contains("already a component"));
    }

    #[test]
    fn refuses_a_module_without_component_type() {
        assert!(error_of(&handler_module(false)).contains("without an embedded component type"));
        assert!(error_of(b"\0asm\x01\0\0\0").contains("without an embedded component type"));
    }

    #[test]
    fn refuses_a_module_missing_its_worlds_export() {
        let module = core_module(&[], Some(component_type("handler-plugin")));
        let error = error_of(&module);
        assert!(
            error.contains("does not fit its embedded WIT world"),
            "{error}"
        );
        assert!(
            error.contains(concat!(
                "export of interface `",
                contract!("handler"),
                "` function `handle`"
            )),
            "{error}"
        );
    }

    /// A module shaped like a wit-bindgen handler plugin becomes a component
    /// that wasmtime accepts, with the world's import and export.
    #[test]
    fn wraps_a_handler_module_into_a_loadable_component() {
        let component = componentize(&handler_module(true)).unwrap();
        let engine = wasmtime::Engine::default();
        let component = wasmtime::component::Component::new(&engine, &component).unwrap();
        let ty = component.component_type();
        let imports: Vec<&str> = ty.imports(&engine).map(|(name, _)| name).collect();
        let exports: Vec<&str> = ty.exports(&engine).map(|(name, _)| name).collect();
        // `types` is imported too: it defines the types `host` and
        // `handler` use.
        assert_eq!(imports, [contract!("types"), contract!("host")]);
        assert_eq!(exports, [contract!("handler")]);
    }

    /// A plugin built against a contract this host does not implement is
    /// refused at load with its version and both supported ones named, not
    /// with the linker's "wrong type".
    #[test]
    fn a_plugin_of_another_contract_version_is_refused_by_name() {
        let old_wit = PLUGIN_WIT.replace(
            concat!("package acemq:plugin@", contract_version!()),
            "package acemq:plugin@0.1.0",
        );
        let module =
            handler_module_of("0.1.0", Some(component_type_of(&old_wit, "handler-plugin")));
        let component = componentize(&module).unwrap();
        let engine =
            crate::plugin::PluginEngine::new(crate::plugin::EngineSettings::default()).unwrap();
        let error = engine
            .compile_bytes(std::path::Path::new("old.wasm"), &component)
            .err()
            .expect("an old plugin is refused")
            .to_string();
        assert_eq!(
            error,
            concat!(
                "plugin old.wasm: was built against acemq:plugin@0.1.0, and this host implements ",
                "acemq:plugin@",
                contract_version!(),
                " and acemq:plugin@",
                legacy_contract_version!(),
                ": rebuild it with this host's guest SDK (wit/plugin.wit)"
            )
        );
        // The plugin of this host's own version passes the same check.
        let current = componentize(&handler_module(true)).unwrap();
        let compiled = engine
            .compile_bytes(std::path::Path::new("new.wasm"), &current)
            .unwrap();
        assert_eq!(compiled.contract, crate::plugin::Contract::V0_4);
    }

    /// A plugin built against the 0.3 contract still loads as a handler, and
    /// its `handle` runs: its calls go through the 0.3 adapter.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_plugin_of_the_0_3_contract_loads_and_handles() {
        let module = handler_module_of(
            legacy_contract_version!(),
            Some(component_type_of(PLUGIN_WIT_0_3, "handler-plugin")),
        );
        let component = componentize(&module).unwrap();
        let engine =
            crate::plugin::PluginEngine::new(crate::plugin::EngineSettings::default()).unwrap();
        let compiled = engine
            .compile_bytes(std::path::Path::new("legacy.wasm"), &component)
            .unwrap();
        assert_eq!(compiled.contract, crate::plugin::Contract::V0_3);
        let context = std::sync::Arc::new(crate::plugin::ConsumerContext::default());
        let version = crate::plugin::HandlerVersion::from_compiled(&engine, compiled, context)
            .unwrap_or_else(|e| panic!("{e}"));
        let invocation = version.invoke(crate::plugin::test_input()).await;
        assert_eq!(invocation.result.unwrap(), crate::plugin::Outcome::Accept);
    }

    /// The payload of a `component-type` custom section for `world` of
    /// `wit/plugin.wit`, as wit-bindgen would embed it.
    fn component_type(world: &str) -> Vec<u8> {
        component_type_of(PLUGIN_WIT, world)
    }

    /// [`component_type`] for another text of the contract.
    fn component_type_of(wit: &str, world: &str) -> Vec<u8> {
        let mut bindgen = wit_component::metadata::Bindgen::default();
        let package = bindgen.resolve.push_str("plugin.wit", wit).unwrap();
        let world = bindgen
            .resolve
            .select_world(&[package], Some(world))
            .unwrap();
        wit_component::metadata::encode(
            &bindgen.resolve,
            world,
            wit_component::StringEncoding::UTF8,
            None,
        )
        .unwrap()
    }

    /// A minimal core module with the canonical-ABI shape of a handler
    /// plugin: it imports `host.now-ms`, exports `handler#handle` (the
    /// message is passed by pointer; the result pointer 0 reads as `accept`
    /// in zeroed memory), `cabi_realloc` and `memory`.
    fn handler_module(with_component_type: bool) -> Vec<u8> {
        handler_module_of(
            contract_version!(),
            with_component_type.then(|| component_type("handler-plugin")),
        )
    }

    /// [`handler_module`] for `version` of the contract.
    fn handler_module_of(version: &str, component_type: Option<Vec<u8>>) -> Vec<u8> {
        let handle = format!("acemq:plugin/handler@{version}#handle");
        let exports = [
            (handle.as_str(), EXPORT_FUNC, 1),
            ("cabi_realloc", EXPORT_FUNC, 2),
            ("memory", EXPORT_MEMORY, 0),
        ];
        core_module_of(version, &exports, component_type)
    }

    const EXPORT_FUNC: u8 = 0x00;
    const EXPORT_MEMORY: u8 = 0x02;

    /// Hand-assembled (the host has no `wat` parser, on purpose): types,
    /// the `now-ms` import, two functions, one page of memory, `exports`,
    /// code, and the optional custom section.
    fn core_module(exports: &[(&str, u8, u32)], component_type: Option<Vec<u8>>) -> Vec<u8> {
        core_module_of(contract_version!(), exports, component_type)
    }

    /// [`core_module`] importing `host` of `version` of the contract.
    fn core_module_of(
        version: &str,
        exports: &[(&str, u8, u32)],
        component_type: Option<Vec<u8>>,
    ) -> Vec<u8> {
        const I32: u8 = 0x7f;
        const I64: u8 = 0x7e;
        let mut module = b"\0asm\x01\0\0\0".to_vec();

        let types: [(&[u8], &[u8]); 3] = [
            (&[I32], &[I32]),                // 0: handle(message) -> ptr
            (&[I32, I32, I32, I32], &[I32]), // 1: cabi_realloc
            (&[], &[I64]),                   // 2: now-ms
        ];
        let mut s = vec![types.len() as u8];
        for (params, results) in types {
            s.push(0x60);
            s.push(params.len() as u8);
            s.extend_from_slice(params);
            s.push(results.len() as u8);
            s.extend_from_slice(results);
        }
        section(&mut module, 1, &s);

        let mut s = vec![1];
        name(&mut s, &format!("acemq:plugin/host@{version}"));
        name(&mut s, "now-ms");
        s.extend_from_slice(&[0x00, 2]); // a function of type 2
        section(&mut module, 2, &s);

        section(&mut module, 3, &[2, 0, 1]); // functions 1 and 2: types 0, 1
        section(&mut module, 5, &[1, 0x00, 1]); // one memory, min 1 page

        let mut s = vec![exports.len() as u8];
        for (export, kind, index) in exports {
            name(&mut s, export);
            s.push(*kind);
            s.push(*index as u8);
        }
        section(&mut module, 7, &s);

        let handle: &[u8] = &[0, 0x10, 0, 0x1a, 0x41, 0, 0x0b]; // call now-ms; drop; i32.const 0
        let realloc: &[u8] = &[0, 0x41, 8, 0x0b]; // i32.const 8
        let mut s = vec![2];
        for body in [handle, realloc] {
            s.push(body.len() as u8);
            s.extend_from_slice(body);
        }
        section(&mut module, 10, &s);

        if let Some(payload) = component_type {
            let mut s = Vec::new();
            name(&mut s, "component-type:test");
            s.extend_from_slice(&payload);
            section(&mut module, 0, &s);
        }
        module
    }

    fn section(module: &mut Vec<u8>, id: u8, contents: &[u8]) {
        module.push(id);
        leb128(module, contents.len());
        module.extend_from_slice(contents);
    }

    fn name(out: &mut Vec<u8>, name: &str) {
        leb128(out, name.len());
        out.extend_from_slice(name.as_bytes());
    }

    fn leb128(out: &mut Vec<u8>, mut n: usize) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
}
