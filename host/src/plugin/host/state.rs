//! `acemq:plugin/state`: the consumer's key-value namespace
//! (`[[consumers]] state = "NAME"`, docs/state.md).
//!
//! Each call of the plugin gets a fresh [`CallState`]: reads are answered
//! from the call's own writes or fetched from the store once per key, and
//! writes are only buffered. What the call leaves ([`StateEnd`]) goes with
//! its outcome; the delivery path commits it when the input is accepted.
//! A store that cannot be reached during the call is not the message's
//! fault: the call is told, and the delivery is given back to wait.

use std::sync::Arc;

use super::super::ConsumerContext;
use super::super::bindings::handler_world::acemq::plugin::state as wit_state;
use super::HostInterface;
use crate::state::call::{CallState, Changes, Lookup};
use crate::state::{Backend, NamespaceAccess};

/// What every state call answers for a consumer without a namespace.
pub const NO_STATE: &str =
    "this consumer has no state store: set state = \"NAME\" in its [[consumers]] entry";

/// One instance's state calls: its consumer's namespace, and the call in
/// progress.
pub struct StateCalls {
    access: Option<Arc<NamespaceAccess>>,
    call: Option<CallState>,
    /// Why the store could not answer during this call, if it could not.
    unavailable: Option<String>,
}

/// What a call left of its state.
#[derive(Debug, Default)]
pub struct StateEnd {
    /// Its writes, to commit if the input is accepted.
    pub changes: Changes,
    /// The store could not be reached: the delivery waits, whatever the
    /// plugin made of the error.
    pub unavailable: Option<String>,
}

impl HostInterface for StateCalls {
    fn prepare(context: &Arc<ConsumerContext>, _plugin: &Arc<str>) -> Self {
        StateCalls {
            access: context.state.clone(),
            call: None,
            unavailable: None,
        }
    }
}

impl StateCalls {
    /// A call starts at the time `now_ms` reads, with nothing read or written.
    pub fn begin_call(&mut self, now_ms: impl FnOnce() -> u64) {
        // The clock is read only for a consumer with state: most have none.
        self.call = self.access.as_ref().map(|_| CallState::new(now_ms()));
        self.unavailable = None;
    }

    /// The call ended: what it wrote, and whether the store failed it.
    pub fn end_call(&mut self) -> StateEnd {
        StateEnd {
            changes: self.call.take().map(CallState::finish).unwrap_or_default(),
            unavailable: self.unavailable.take(),
        }
    }

    /// The namespace and the call, or the error a plugin gets without them.
    fn current(&mut self, op: &str) -> Result<(&Arc<NamespaceAccess>, &mut CallState), String> {
        match (&self.access, &mut self.call) {
            (Some(access), Some(call)) => {
                access.count(op);
                Ok((access, call))
            }
            (None, _) => Err(NO_STATE.to_string()),
            (Some(_), None) => Err("state is only available during a handler call".to_string()),
        }
    }

    /// Makes sure the call knows the committed entry of `key` when its
    /// answer needs it (`get` only when the call did not write the key).
    async fn fetch(&mut self, op: &str, key: &[u8], always: bool) -> Result<(), String> {
        CallState::check_key(key)?;
        let (access, call) = self.current(op)?;
        let needed = if always {
            !call.has_fetched(key)
        } else {
            call.needs(key)
        };
        if !needed {
            return Ok(());
        }
        let access = access.clone();
        let now_ms = crate::envelope::now_ms();
        match access.store.get(&access.namespace, key, now_ms).await {
            Ok(entry) => {
                self.call().remember(key, entry);
                Ok(())
            }
            Err(e) => {
                let reason = e.to_string();
                self.unavailable = Some(reason.clone());
                Err(reason)
            }
        }
    }

    fn call(&mut self) -> &mut CallState {
        self.call
            .as_mut()
            .expect("current() checked the call is in progress")
    }
}

/// Answers a read once its key is fetched.
fn known<T>(lookup: Lookup<T>) -> T {
    match lookup {
        Lookup::Known(value) => value,
        Lookup::Fetch => unreachable!("fetched before it is read"),
    }
}

impl wit_state::Host for StateCalls {
    async fn get(&mut self, key: Vec<u8>) -> wasmtime::Result<Result<Option<Vec<u8>>, String>> {
        if let Err(e) = self.fetch("get", &key, false).await {
            return Ok(Err(e));
        }
        Ok(Ok(known(self.call().get(&key))))
    }

    async fn set(
        &mut self,
        key: Vec<u8>,
        value: Vec<u8>,
        ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<(), String>> {
        Ok(self
            .current("set")
            .and_then(|(_, call)| call.set(&key, value, ttl_ms)))
    }

    async fn delete(&mut self, key: Vec<u8>) -> wasmtime::Result<Result<(), String>> {
        Ok(self
            .current("delete")
            .and_then(|(_, call)| call.delete(&key)))
    }

    async fn increment(
        &mut self,
        key: Vec<u8>,
        by: i64,
        ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<i64, String>> {
        if let Err(e) = self.fetch("increment", &key, false).await {
            return Ok(Err(e));
        }
        Ok(self.call().increment(&key, by, ttl_ms))
    }

    async fn get_versioned(
        &mut self,
        key: Vec<u8>,
    ) -> wasmtime::Result<Result<Option<(Vec<u8>, u64)>, String>> {
        if let Err(e) = self.fetch("get_versioned", &key, true).await {
            return Ok(Err(e));
        }
        Ok(Ok(known(self.call().get_versioned(&key))))
    }

    async fn set_if_version(
        &mut self,
        key: Vec<u8>,
        value: Vec<u8>,
        version: u64,
        ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<(), String>> {
        Ok(self
            .current("set_if_version")
            .and_then(|(_, call)| call.set_if_version(&key, value, version, ttl_ms)))
    }
}
