//! `acemq:plugin/state`: the consumer's key-value state. Linked so that a
//! 0.4 plugin which imports it loads, but not available in this host yet:
//! every call answers an error saying so, and the plugin decides what that
//! means for its message (the SDK turns an unwrapped error into a retry).

use std::sync::Arc;

use super::super::ConsumerContext;
use super::super::bindings::handler_world::acemq::plugin::state as wit_state;
use super::HostInterface;

/// What every state call answers in this host.
pub const NOT_AVAILABLE: &str = "key-value state is not available in this host yet \
     (acemq:plugin/state is linked, but no consumer can have a state store)";

/// One instance's state store: none, in this host.
pub struct Unavailable;

impl HostInterface for Unavailable {
    fn prepare(_context: &Arc<ConsumerContext>, _plugin: &Arc<str>) -> Self {
        Unavailable
    }
}

fn not_available<T>() -> wasmtime::Result<Result<T, String>> {
    Ok(Err(NOT_AVAILABLE.to_string()))
}

impl wit_state::Host for Unavailable {
    fn get(&mut self, _key: Vec<u8>) -> wasmtime::Result<Result<Option<Vec<u8>>, String>> {
        not_available()
    }

    fn set(
        &mut self,
        _key: Vec<u8>,
        _value: Vec<u8>,
        _ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<(), String>> {
        not_available()
    }

    fn delete(&mut self, _key: Vec<u8>) -> wasmtime::Result<Result<(), String>> {
        not_available()
    }

    fn increment(
        &mut self,
        _key: Vec<u8>,
        _by: i64,
        _ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<i64, String>> {
        not_available()
    }

    fn get_versioned(
        &mut self,
        _key: Vec<u8>,
    ) -> wasmtime::Result<Result<Option<(Vec<u8>, u64)>, String>> {
        not_available()
    }

    fn set_if_version(
        &mut self,
        _key: Vec<u8>,
        _value: Vec<u8>,
        _version: u64,
        _ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<(), String>> {
        not_available()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wit_state::Host as _;

    #[test]
    fn every_call_says_state_is_not_available_yet() {
        let mut state = Unavailable;
        let errors = [
            state.get(b"k".to_vec()).unwrap().unwrap_err(),
            state
                .set(b"k".to_vec(), b"v".to_vec(), None)
                .unwrap()
                .unwrap_err(),
            state.delete(b"k".to_vec()).unwrap().unwrap_err(),
            state
                .increment(b"k".to_vec(), 1, Some(5))
                .unwrap()
                .unwrap_err(),
            state.get_versioned(b"k".to_vec()).unwrap().unwrap_err(),
            state
                .set_if_version(b"k".to_vec(), b"v".to_vec(), 3, None)
                .unwrap()
                .unwrap_err(),
        ];
        for error in errors {
            assert!(
                error.starts_with("key-value state is not available in this host yet"),
                "{error}"
            );
        }
    }
}
