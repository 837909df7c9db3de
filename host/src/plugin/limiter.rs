//! The limits of one plugin instance, enforced by wasmtime as its store
//! grows: one linear-memory budget across all the instance's memories, and
//! caps on its core instances, memories and tables. Handler and codec stores
//! both carry a [`MemoryLimiter`]; the engine sizes its instance pool with
//! the same caps, so the pool admits exactly what a store admits.

use wasmtime::ResourceLimiter;

/// Core module instances one plugin instance may create. A Rust guest built
/// by `scripts/build-plugins` has three (its own module, and the shim and
/// fixup modules wit-component adds for indirect calls); a Python component
/// built by componentize-py has 38 (the interpreter, its C libraries and the
/// WASI adapter). 64 admits those without letting a component fan out.
pub const MAX_CORE_INSTANCES: usize = 64;
/// Linear memories one plugin instance may define. A Rust guest has one;
/// the second admits a component composed from two (each with its own
/// heap). More buys a plugin no memory (the budget below is per instance),
/// but each costs a pool slot and its address-space reservation.
pub const MAX_MEMORIES: usize = 2;
/// Tables one plugin instance may define: a Rust guest has two (its own
/// indirect-call table, and the shim's).
pub const MAX_TABLES: usize = 4;
/// Table growth beyond this many elements is refused; guests need a handful.
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// Holds one store (one plugin instance) to a single linear-memory budget
/// across all its memories, and remembers a refusal so the resulting trap
/// can be reported as "out of memory" rather than a bare `unreachable`.
///
/// A cap per memory would give a component of several core modules, or a
/// module with several memories, several times the limit; the budget is the
/// sum. Every byte of linear memory an instance gets passes through
/// [`ResourceLimiter::memory_growing`] (its initial size at instantiation,
/// then each `memory.grow`), so the running total is exact.
pub struct MemoryLimiter {
    limit: usize,
    /// Bytes of linear memory the store's memories hold together.
    total: usize,
    /// The total a refused allocation would have reached, since the last reset.
    pub refused: Option<usize>,
}

impl MemoryLimiter {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            total: 0,
            refused: None,
        }
    }
}

impl MemoryLimiter {
    /// Bytes of linear memory the store's memories hold together now.
    pub fn total(&self) -> usize {
        self.total
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Past the memory's own declared maximum wasmtime refuses anyway;
        // refusing here keeps it out of the total, and it is not our limit,
        // so it is not recorded as one.
        if maximum.is_some_and(|maximum| desired > maximum) {
            return Ok(false);
        }
        let total = self.total.saturating_sub(current).saturating_add(desired);
        if total > self.limit {
            self.refused = Some(total);
            // A memory being created (it starts from nothing) fails the
            // instantiation; an error says why, where `false` would only say
            // "exceeds memory limits". Growth of a live memory answers -1 to
            // the guest, as the spec has it, and the guest decides.
            if current == 0 {
                return Err(wasmtime::Error::msg(super::fault::out_of_memory_reason(
                    total, self.limit,
                )));
            }
            return Ok(false);
        }
        self.total = total;
        Ok(true)
    }

    /// A growth this limiter allowed failed after all (the operating system
    /// refused the pages). The total keeps it: wasmtime also calls this for
    /// growths it never asked `memory_growing` about, so giving bytes back
    /// here could let a guest shrink its tally while its memory grows. Over
    /// counting after a failure only makes the budget stricter.
    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        Ok(())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

#[cfg(test)]
mod tests {
    use wasmtime::component::{Component, Instance, Linker};
    use wasmtime::{Engine, Store};

    use super::*;
    use crate::plugin::{EngineSettings, PluginEngine};

    const PAGE: usize = 64 << 10;
    const MIB: usize = 1 << 20;
    /// The budget of every test here.
    const CAP: usize = 3 * MIB;

    /// A component of core modules (given by their bodies), each
    /// instantiated once as `$i0`, `$i1`, ..., followed by `tail`.
    fn component_of(modules: &[String], tail: &str) -> Vec<u8> {
        let mut text = String::from("(component\n");
        for (i, body) in modules.iter().enumerate() {
            text += &format!(
                "  (core module $m{i} {body})\n  (core instance $i{i} (instantiate $m{i}))\n"
            );
        }
        text += tail;
        text += ")\n";
        wat::parse_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    /// Two core modules with a memory each, `first` and `second` pages;
    /// the component exports `grow`, a `memory.grow` of the second.
    fn two_memories(first: usize, second: usize) -> Vec<u8> {
        component_of(
            &[
                format!("(memory {first})"),
                format!(
                    "(memory {second}) (func (export \"grow\") (param i32) (result i32) \
                     (memory.grow (local.get 0)))"
                ),
            ],
            "(func (export \"grow\") (param \"pages\" u32) (result s32) (canon lift (core func $i1 \"grow\")))",
        )
    }

    /// The host's own engine (pooled where there is address space for it),
    /// and one allocating on demand: the limits must hold on both.
    fn engines() -> Vec<(&'static str, Engine)> {
        let host = PluginEngine::new(EngineSettings {
            max_instances: 4,
            max_memory_bytes: CAP as u64,
            ..EngineSettings::default()
        })
        .unwrap();
        let host_name = if host.uses_pooling() {
            "host engine (pooled)"
        } else {
            "host engine (on demand: no address space for the pool here)"
        };
        let mut on_demand = wasmtime::Config::new();
        on_demand.wasm_component_model(true);
        vec![
            (host_name, host.engine().clone()),
            ("on-demand engine", Engine::new(&on_demand).unwrap()),
        ]
    }

    /// Compiles and instantiates `wasm` under a [`MemoryLimiter`] of
    /// [`CAP`]. The pooling allocator refuses a component it cannot hold
    /// already when it compiles, so that counts as refused too.
    fn instantiate(
        engine: &Engine,
        wasm: &[u8],
    ) -> (Store<MemoryLimiter>, wasmtime::Result<Instance>) {
        let mut store = Store::new(engine, MemoryLimiter::new(CAP));
        store.limiter(|limiter| limiter);
        // The host engine interrupts on epochs; nothing here loops.
        store.set_epoch_deadline(1 << 40);
        let instance = Component::new(engine, wasm)
            .and_then(|component| Linker::new(engine).instantiate(&mut store, &component));
        (store, instance)
    }

    /// Each memory stays under the cap (2 MiB and 0.5 MiB, the second
    /// asking for 2 MiB), and together they pass it: the growth is refused.
    #[test]
    fn memories_of_one_instance_share_one_budget() {
        for (name, engine) in engines() {
            let (mut store, instance) = instantiate(&engine, &two_memories(32, 8));
            let instance = instance.unwrap_or_else(|e| panic!("{name}: {e:#}"));
            let grow = instance
                .get_typed_func::<(u32,), (i32,)>(&mut store, "grow")
                .unwrap();
            let call =
                |store: &mut Store<MemoryLimiter>, pages| grow.call(store, (pages,)).unwrap().0;
            assert_eq!(call(&mut store, 24), -1, "{name}: the growth was allowed");
            assert_eq!(store.data().refused, Some(4 * MIB), "{name}");
            // Up to the cap exactly is allowed: 2 MiB + 1 MiB.
            assert_eq!(call(&mut store, 8), 8, "{name}");
            assert_eq!(call(&mut store, 1), -1, "{name}");
            assert_eq!(store.data().refused, Some(CAP + PAGE), "{name}");
        }
    }

    /// Two memories of 2 MiB each: the instance never comes to be, and the
    /// reason says it ran out of memory, with the total and the limit.
    #[test]
    fn memories_over_the_budget_together_fail_instantiation_with_a_reason() {
        for (name, engine) in engines() {
            let (store, instance) = instantiate(&engine, &two_memories(32, 32));
            let err = format!(
                "{:#}",
                instance
                    .err()
                    .unwrap_or_else(|| panic!("{name}: instantiated"))
            );
            assert!(
                err.contains(&format!(
                    "out of memory: the plugin asked for {} bytes of linear memory, over its limit of {CAP} bytes",
                    4 * MIB
                )),
                "{name}: {err}"
            );
            assert_eq!(store.data().refused, Some(4 * MIB), "{name}");
        }
    }

    /// One more memory, table or core instance than allowed is refused at
    /// instantiation, whoever allocates the instance.
    #[test]
    fn memories_tables_and_core_instances_are_counted() {
        let cases = [
            (
                "(memory 1)",
                MAX_MEMORIES,
                ["memory count too high", "Wasm linear memories"],
            ),
            (
                "(table 1 funcref)",
                MAX_TABLES,
                ["table count too high", "tables, which exceeds"],
            ),
            (
                "",
                MAX_CORE_INSTANCES,
                ["instance count too high", "core module instances"],
            ),
        ];
        for (body, allowed, refusals) in cases {
            for (name, engine) in engines() {
                let at_most = component_of(&vec![body.to_string(); allowed], "");
                let (_, instance) = instantiate(&engine, &at_most);
                instance.unwrap_or_else(|e| panic!("{name}: {allowed} × {body:?}: {e:#}"));

                let over = component_of(&vec![body.to_string(); allowed + 1], "");
                let (_, instance) = instantiate(&engine, &over);
                let err = format!(
                    "{:#}",
                    instance.err().unwrap_or_else(|| panic!(
                        "{name}: {} × {body:?} instantiated",
                        allowed + 1
                    ))
                );
                assert!(
                    refusals.iter().any(|refusal| err.contains(refusal)),
                    "{name}: {err}"
                );
            }
        }
    }
}
