//! `acemq-host run`, `plan` and `validate`: a host's config, run, planned
//! or checked.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Exit, fail, load_config, report};
use crate::app;
use crate::logging::{self, LogFormat};
use crate::telemetry::Metrics;
use crate::topology::{self, Topology};

/// The host's config, the one argument of `run`, `plan` and `validate`.
#[derive(Debug, clap::Args)]
pub struct ConfigArg {
    #[arg(long, short)]
    pub config: PathBuf,
}

/// `run`: logs as `--log-format`, else the config, says; consumes until
/// SIGINT or SIGTERM.
pub fn run(config_path: &Path, log_format: Option<LogFormat>) -> ExitCode {
    let config = match load_config(config_path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    logging::init(
        log_format
            .or(config.config.host.log_format)
            .unwrap_or_default(),
    );
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        commit = crate::build_info::COMMIT,
        wasmtime = crate::build_info::WASMTIME,
        "acemq-host starting"
    );
    let metrics = Arc::new(Metrics::new());
    let prepared = match app::prepare(config, &metrics) {
        Ok(prepared) => prepared,
        Err(e) => return fail(Exit::Invalid, &e),
    };
    let runtime = match crate::runtime::build(prepared.config.config.host.worker_threads()) {
        Ok(runtime) => runtime,
        Err(e) => return fail(Exit::Failed, &e),
    };
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(stop_on_signals(shutdown.clone()));
        app::run(prepared, shutdown, metrics).await
    });
    report(result)
}

/// `plan`: every declaration the config makes, or its topology's problems.
pub fn plan(config_path: &Path) -> ExitCode {
    let config = match load_config(config_path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    match Topology::from_config(&config.config) {
        Ok(topology) => {
            println!("{}", topology::plan(&topology));
            Exit::Done.into()
        }
        Err(problems) => {
            println!("{}", problems.located_in(&config));
            Exit::Invalid.into()
        }
    }
}

/// `validate`: everything `run` checks before it connects.
pub fn validate(config_path: &Path) -> ExitCode {
    let config = match load_config(config_path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    match app::prepare_to_validate(config) {
        Ok(prepared) => {
            println!(
                "{}: valid ({} exchanges, {} queues, {} bindings, {} consumers)",
                config_path.display(),
                prepared.topology.exchanges.len(),
                prepared.topology.queues.len(),
                prepared.topology.bindings.len(),
                prepared.consumers.len()
            );
            Exit::Done.into()
        }
        Err(e) => fail(Exit::Invalid, &e),
    }
}

async fn stop_on_signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::error!("cannot listen for SIGINT/SIGTERM");
        return;
    };
    let name = tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    };
    tracing::info!(
        signal = name,
        "shutting down: no new deliveries, finishing the running ones"
    );
    shutdown.cancel();
}
