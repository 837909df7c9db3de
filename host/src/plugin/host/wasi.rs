//! The WASI a plugin gets when it imports it: wasmtime's own WASI 0.2,
//! locked down. Components built from Python (componentize-py) or
//! JavaScript (componentize-js) import WASI for their language runtime even
//! when the plugin itself never touches a file; a Rust plugin built with the
//! guest SDK imports none of it and pays nothing (no WASI is linked for it,
//! and its stores never build a WASI context).
//!
//! [`GRANT`] is the sandbox promise: every WASI interface a plugin may
//! import, and what it gets from each. The linker is held to it (the tests
//! below link each interface, and refuse every other), and so are
//! `SECURITY.md`, `wit/plugin.wit` and `plugin/mod.rs` (`sandbox_doc.rs`).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::super::ConsumerContext;
use super::HostInterface;

/// Most bytes a call's stdout or stderr keeps; beyond them the output is
/// dropped (and the drop is said in the log).
pub const MAX_CALL_OUTPUT_BYTES: usize = 64 * 1024;

/// The sandbox promise in one sentence, said the same by `wit/plugin.wit`,
/// `plugin/mod.rs` and `SECURITY.md` (`sandbox_doc.rs` holds them to it);
/// [`GRANT`] is its detail.
pub const PROMISE: &str = "A plugin has no files, sockets or environment: it reaches the broker, \
    the log and its configuration only through the `host` interface. A component that imports \
    WASI 0.2 (as Python and JavaScript runtimes do) gets the part of it SECURITY.md lists, locked \
    down: its clocks and random numbers, but no file, socket or environment variable.";

/// What a plugin gets from some interfaces of one WASI 0.2 package.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The package, such as `wasi:cli`.
    pub package: &'static str,
    /// Its interfaces this row covers, such as `stdout`.
    pub interfaces: &'static [&'static str],
    /// What a plugin that imports them gets.
    pub policy: &'static str,
    /// Why that is safe, or needed.
    pub why: &'static str,
}

/// Every WASI interface a plugin may import. Anything else (another
/// interface of these packages, `wasi:http`, any other package) is not
/// linked: a plugin that imports it is refused when it loads.
pub const GRANT: &[Grant] = &[
    Grant {
        package: "wasi:cli",
        interfaces: &["environment"],
        policy: "empty: no variables, no arguments, no working directory",
        why: "the host's environment is the operator's (it may hold the admin token)",
    },
    Grant {
        package: "wasi:cli",
        interfaces: &["stdin"],
        policy: "empty",
        why: "a plugin's only input is the message it is handed",
    },
    Grant {
        package: "wasi:cli",
        interfaces: &["stdout", "stderr"],
        policy: "captured per call (at most 64 KiB each) and written to the host log, \
                 tagged with the consumer and the message id, bounded like the plugin's own log lines",
        why: "printing is how an interpreted plugin reports; it cannot flood the log",
    },
    Grant {
        package: "wasi:cli",
        interfaces: &[
            "terminal-input",
            "terminal-output",
            "terminal-stdin",
            "terminal-stdout",
            "terminal-stderr",
        ],
        policy: "no terminal: no stream is one",
        why: "language runtimes ask; there is nothing to reveal",
    },
    Grant {
        package: "wasi:cli",
        interfaces: &["exit"],
        policy: "ends the call as a fault; its instance is dropped",
        why: "a runtime's exit must not stop the host",
    },
    Grant {
        package: "wasi:clocks",
        interfaces: &["wall-clock", "monotonic-clock"],
        policy: "the host's clocks; a wait on them counts against the call's deadline",
        why: "they reveal no more than `now-ms`; runtimes time and seed with them",
    },
    Grant {
        package: "wasi:random",
        interfaces: &["random", "insecure", "insecure-seed"],
        policy: "allowed",
        why: "runtimes seed their hash tables from it; it reveals nothing of the host",
    },
    Grant {
        package: "wasi:filesystem",
        interfaces: &["types", "preopens"],
        policy: "no directory opened: every path is refused",
        why: "a plugin has no files",
    },
    Grant {
        package: "wasi:sockets",
        interfaces: &[
            "network",
            "instance-network",
            "tcp",
            "tcp-create-socket",
            "udp",
            "udp-create-socket",
            "ip-name-lookup",
        ],
        policy: "every use denied: no TCP, no UDP, no name lookup, no address passes the check",
        why: "a plugin reaches the broker only through `publish`",
    },
    Grant {
        package: "wasi:io",
        interfaces: &["error", "poll", "streams"],
        policy: "streams and polling, for the interfaces above; nothing of their own",
        why: "the rows above hand out streams",
    },
];

impl Grant {
    /// The interfaces' full names, such as `wasi:cli/stdout`.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.interfaces
            .iter()
            .map(|interface| format!("{}/{interface}", self.package))
    }
}

/// The grant row of `import` (an interface name, with or without its
/// version), if the host links it.
pub fn grant_of(import: &str) -> Option<&'static Grant> {
    let name = import.split('@').next().unwrap_or(import);
    let (package, interface) = name.split_once('/')?;
    GRANT
        .iter()
        .find(|grant| grant.package == package && grant.interfaces.contains(&interface))
}

/// Whether `import` (an interface name) is one the host links.
pub fn granted(import: &str) -> bool {
    grant_of(import).is_some()
}

/// Whether `component` imports any WASI interface.
pub fn imports_wasi(engine: &wasmtime::Engine, component: &Component) -> bool {
    component
        .component_type()
        .imports(engine)
        .any(|(name, _)| name.starts_with("wasi:"))
}

/// Links wasmtime's WASI 0.2 into `linker`: for components that import it.
/// What it links is [`GRANT`], no more (the tests hold it to that).
pub fn link<T: WasiView + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)
}

/// A store's WASI state, built the first time the plugin calls into WASI.
#[derive(Default)]
pub struct LazyWasi(Option<Box<Sandbox>>);

impl HostInterface for LazyWasi {
    fn prepare(_context: &Arc<ConsumerContext>, _plugin: &Arc<str>) -> Self {
        Self::default()
    }
}

struct Sandbox {
    ctx: WasiCtx,
    table: ResourceTable,
    stdout: Captured,
    stderr: Captured,
}

impl LazyWasi {
    /// The view WASI's host functions work on.
    pub fn view(&mut self) -> WasiCtxView<'_> {
        let sandbox = self.0.get_or_insert_with(|| Box::new(Sandbox::new()));
        WasiCtxView {
            ctx: &mut sandbox.ctx,
            table: &mut sandbox.table,
        }
    }

    /// What the plugin wrote to stdout and stderr since the last drain,
    /// as text, with how many bytes were dropped beyond the bound.
    pub fn drain(&mut self) -> Vec<(Stream, String, usize)> {
        let Some(sandbox) = &self.0 else {
            return Vec::new();
        };
        [
            (Stream::Stdout, &sandbox.stdout),
            (Stream::Stderr, &sandbox.stderr),
        ]
        .into_iter()
        .filter_map(|(stream, captured)| {
            let (bytes, dropped) = captured.take();
            (!bytes.is_empty() || dropped > 0).then(|| {
                (
                    stream,
                    String::from_utf8_lossy(&bytes).into_owned(),
                    dropped,
                )
            })
        })
        .collect()
    }
}

/// Which of the two outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

impl Sandbox {
    fn new() -> Self {
        let (stdout, stderr) = (Captured::default(), Captured::default());
        let ctx = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }))
            .build();
        Self {
            ctx,
            table: ResourceTable::new(),
            stdout,
            stderr,
        }
    }
}

/// One output stream's bytes since the last drain, bounded.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<CapturedBytes>>);

#[derive(Default)]
struct CapturedBytes {
    bytes: Vec<u8>,
    dropped: usize,
}

impl Captured {
    fn take(&self) -> (Vec<u8>, usize) {
        let mut captured = self.0.lock().expect("captured output poisoned");
        let dropped = std::mem::take(&mut captured.dropped);
        (std::mem::take(&mut captured.bytes), dropped)
    }

    fn append(&self, bytes: &[u8]) {
        let mut captured = self.0.lock().expect("captured output poisoned");
        let room = MAX_CALL_OUTPUT_BYTES.saturating_sub(captured.bytes.len());
        let kept = bytes.len().min(room);
        captured.bytes.extend_from_slice(&bytes[..kept]);
        captured.dropped += bytes.len() - kept;
    }
}

impl IsTerminal for Captured {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Captured {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }

    // Written to directly: the default adapter runs a task on the tokio
    // runtime, which a plugin loading on a thread of its own has not.
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Captured {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        // Never refused: a print beyond the bound is dropped, not an error
        // the plugin's runtime would have to handle.
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(MAX_CALL_OUTPUT_BYTES)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Captured {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for Captured {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        bytes: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.append(bytes);
        std::task::Poll::Ready(Ok(bytes.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every interface of the WASI 0.2 packages wasmtime implements, and of
    /// `wasi:http`: the host links exactly those [`GRANT`] lists.
    const WASI_0_2: &[(&str, &[&str])] = &[
        (
            "wasi:cli",
            &[
                "environment",
                "exit",
                "run",
                "stdin",
                "stdout",
                "stderr",
                "terminal-input",
                "terminal-output",
                "terminal-stdin",
                "terminal-stdout",
                "terminal-stderr",
            ],
        ),
        (
            "wasi:clocks",
            &["monotonic-clock", "wall-clock", "timezone"],
        ),
        ("wasi:filesystem", &["types", "preopens"]),
        ("wasi:io", &["error", "poll", "streams"]),
        ("wasi:random", &["insecure-seed", "insecure", "random"]),
        (
            "wasi:sockets",
            &[
                "network",
                "instance-network",
                "ip-name-lookup",
                "tcp",
                "tcp-create-socket",
                "udp",
                "udp-create-socket",
            ],
        ),
        (
            "wasi:http",
            &["types", "incoming-handler", "outgoing-handler"],
        ),
    ];

    /// The WASI 0.2 release wasmtime 48 implements (the packages of its
    /// `wit/deps`); it moves with wasmtime.
    const WASI_VERSION: &str = "0.2.12";

    struct Probe(LazyWasi);

    impl WasiView for Probe {
        fn ctx(&mut self) -> WasiCtxView<'_> {
            self.0.view()
        }
    }

    /// Whether the host's WASI linker defines `interface` (in the 0.2
    /// release wasmtime implements): defining anything else under its name
    /// is then refused (the linker allows no shadowing).
    fn links(engine: &wasmtime::Engine, interface: &str) -> bool {
        let mut linker = Linker::<Probe>::new(engine);
        link(&mut linker).unwrap();
        let name = format!("{interface}@{WASI_VERSION}");
        linker.root().func_new(&name, |_, _, _, _| Ok(())).is_err()
    }

    #[test]
    fn the_linker_links_exactly_the_grant() {
        let engine = wasmtime::Engine::default();
        assert!(
            links(&engine, "wasi:io/streams"),
            "WASI_VERSION is not the release this wasmtime links: update it"
        );
        let mut mismatches = Vec::new();
        for (package, interfaces) in WASI_0_2 {
            for interface in *interfaces {
                let name = format!("{package}/{interface}");
                if links(&engine, &name) != granted(&name) {
                    mismatches.push(format!("{name}: linked {}", links(&engine, &name)));
                }
            }
        }
        assert!(
            mismatches.is_empty(),
            "the grant is not what is linked: {mismatches:#?}"
        );
        for grant in GRANT {
            for name in grant.names() {
                assert!(links(&engine, &name), "{name} is granted but not linked");
            }
        }
    }

    #[test]
    fn the_grant_states_the_output_bound() {
        let stdout = grant_of("wasi:cli/stdout@0.2.0").unwrap();
        let bound = format!("at most {} KiB each", MAX_CALL_OUTPUT_BYTES / 1024);
        assert!(stdout.policy.contains(&bound), "{}", stdout.policy);
        assert_eq!(grant_of("wasi:cli/stderr"), Some(stdout));
        assert_eq!(grant_of("wasi:http/types@0.2.0"), None);
        assert_eq!(grant_of("wasi:cli/run@0.2.0"), None);
    }

    #[test]
    fn output_beyond_the_bound_is_dropped_and_counted() {
        let captured = Captured::default();
        captured.append(&vec![b'a'; MAX_CALL_OUTPUT_BYTES - 2]);
        captured.append(b"bcde");
        let (bytes, dropped) = captured.take();
        assert_eq!(bytes.len(), MAX_CALL_OUTPUT_BYTES);
        assert!(bytes.ends_with(b"abc"));
        assert_eq!(dropped, 2);
        assert_eq!(captured.take(), (Vec::new(), 0), "drained");
    }

    #[test]
    fn no_wasi_state_is_built_until_it_is_used() {
        let mut wasi = LazyWasi::default();
        assert!(wasi.drain().is_empty());
        assert!(wasi.0.is_none());
        let _ = wasi.view();
        assert!(wasi.0.is_some());
    }
}
