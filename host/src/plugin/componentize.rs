//! Turning a core WebAssembly module with an embedded component type (what
//! wit-bindgen produces for wasm32-unknown-unknown) into a component.

/// Encodes `core_module` as a component, validating the result.
pub fn componentize(core_module: &[u8]) -> anyhow::Result<Vec<u8>> {
    if !wasmparser::Parser::is_core_wasm(core_module) {
        anyhow::bail!("is not a core WebAssembly module");
    }
    let mut encoder = wit_component::ComponentEncoder::default()
        .validate(true)
        .module(core_module)
        .map_err(|e| anyhow::anyhow!("has no usable embedded component type (was it built with wit-bindgen?): {e:#}"))?;
    encoder
        .encode()
        .map_err(|e| anyhow::anyhow!("cannot be turned into a component: {e:#}"))
}
