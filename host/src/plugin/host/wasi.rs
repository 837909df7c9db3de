//! The WASI a plugin gets when it imports it: wasmtime's own WASI 0.2,
//! locked down. Components built from Python (componentize-py) or
//! JavaScript (componentize-js) import WASI for their language runtime even
//! when the plugin itself never touches a file; a Rust plugin built with the
//! guest SDK imports none of it and pays nothing (no WASI is linked for it,
//! and its stores never build a WASI context).
//!
//! What each part of WASI grants ([`GRANTS`]):
//! - filesystem: linked, with no directory opened: every path is refused;
//! - sockets: linked, every use denied (no TCP, no UDP, no name lookup, no
//!   address passes the check);
//! - environment and arguments: empty; stdin: empty;
//! - stdout and stderr: captured per call and written to the host log with
//!   the consumer and the message id, bounded like the plugin's own log lines;
//! - clocks and random: allowed (they reveal nothing the `now-ms` import
//!   does not, and language runtimes seed their hashing from them).

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

/// What each WASI package a plugin may import is granted, for
/// `plugin inspect` and the README.
pub const GRANTS: [(&str, &str); 6] = [
    (
        "wasi:cli",
        "empty environment, arguments and stdin; stdout and stderr go to the host log",
    ),
    ("wasi:io", "streams and polling, for the rest"),
    ("wasi:clocks", "allowed"),
    ("wasi:random", "allowed"),
    (
        "wasi:filesystem",
        "no directory opened: every path is refused",
    ),
    (
        "wasi:sockets",
        "every use denied (no TCP, UDP or name lookup)",
    ),
];

/// Whether `import` (an interface name) is in a WASI package the host links.
pub fn granted(import: &str) -> bool {
    GRANTS
        .iter()
        .any(|(package, _)| import.starts_with(&format!("{package}/")))
}

/// Whether `component` imports any WASI interface.
pub fn imports_wasi(engine: &wasmtime::Engine, component: &Component) -> bool {
    component
        .component_type()
        .imports(engine)
        .any(|(name, _)| name.starts_with("wasi:"))
}

/// Links wasmtime's WASI 0.2 into `linker`: for components that import it.
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
