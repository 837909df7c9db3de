//! `acemq-host plugin ...`: `componentize` and `inspect` are
//! [`crate::plugin`]'s; `new`, `build` and `run` live in
//! [`crate::plugin_dev`]. Here each command's arguments become its request.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use super::{Exit, fail, report};
use crate::plugin;
use crate::plugin_dev::run::parse_key_value;
use crate::plugin_dev::{Failure, build, new, precompile, run as run_one};

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Turn a core module with an embedded component type into a component.
    Componentize { input: PathBuf, output: PathBuf },
    /// Show what a plugin file is: world, imports, exports, size, hash.
    Inspect { file: PathBuf },
    /// Create a plugin (a Rust crate, or a Python or JavaScript folder) that
    /// builds and passes its tests as it is.
    #[command(after_help = PLUGIN_NEW_HELP)]
    New {
        /// The plugin's name (and its folder's): lowercase letters, digits,
        /// `-` and `_`, starting with a letter.
        name: String,
        /// The language it is written in.
        #[arg(long, value_enum, default_value = "rust")]
        lang: new::Lang,
        /// A codec (converts bodies between the wire and handlers) instead
        /// of a handler. Rust only.
        #[arg(long)]
        codec: bool,
        /// The folder to create the plugin's folder in.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The guest SDK (the `guest-sdk` folder of an acemq-host checkout)
        /// a crate outside a plugin workspace depends on; by default the
        /// one of the checkout this binary was built from.
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Build a plugin (a Rust crate, every plugin crate of a workspace, or
    /// a Python or JavaScript plugin folder) into WebAssembly components.
    #[command(after_help = PLUGIN_BUILD_HELP)]
    Build {
        /// The plugin's folder: a crate or workspace (or its Cargo.toml), or
        /// a Python (`src/app.py`) or JavaScript (`package.json`, `app.js`) one.
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Cargo's target directory for the wasm build (core modules go in
        /// `wasm/` or `wasm-rustup/` under it). Default: the workspace's
        /// `[workspace.metadata.acemq] target-dir`, else cargo's. Rust only.
        #[arg(long)]
        target_dir: Option<PathBuf>,
        /// Where the components go. Default: `plugins/` in the target
        /// directory (Rust), `target/plugins/` in the folder (Python, JavaScript).
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Run one message through a handler component, without a broker, and
    /// show what the host would do: the outcome, the outputs it would
    /// publish, the plugin's log lines, time and fuel.
    #[command(after_help = PLUGIN_RUN_HELP)]
    Run {
        /// The handler component.
        file: PathBuf,
        /// A captured delivery: the JSON of the management UI's "Get
        /// messages" or `rabbitmqadmin get --format=raw_json` (payload,
        /// properties with headers, exchange, routing key). The flags below
        /// override what it says.
        #[arg(long, value_name = "FILE")]
        message: Option<PathBuf>,
        /// The message body: the text itself, `@FILE` for a file's bytes,
        /// or `@-` for standard input. Required unless --message has a payload.
        #[arg(long)]
        body: Option<String>,
        /// A message header, `KEY=VALUE` (a text value); repeatable.
        #[arg(long = "header", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        headers: Vec<(String, String)>,
        /// A `[consumers.config]` entry the plugin reads with `config(KEY)`,
        /// `KEY=VALUE`; repeatable.
        #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        config: Vec<(String, String)>,
        /// An exchange the plugin may publish to (`publish_to`); repeatable.
        /// A publish anywhere else is refused, as the host refuses it.
        #[arg(long = "publish-to", value_name = "EXCHANGE")]
        publish_to: Vec<String>,
        /// The message's content type.
        #[arg(long)]
        content_type: Option<String>,
        /// The exchange the message seems to come from ("" is the default
        /// exchange, and the default).
        #[arg(long)]
        exchange: Option<String>,
        /// The routing key it seems to have been published with (default
        /// `plugin.run`).
        #[arg(long)]
        routing_key: Option<String>,
        /// Its message id; the captured message's or a random one by default.
        #[arg(long)]
        message_id: Option<String>,
        /// The call's time limit, as a consumer's `deadline`.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        deadline: std::time::Duration,
    },
}

const PLUGIN_NEW_HELP: &str = "\
Rust (the default): inside a workspace that takes every folder as a member
and provides the SDK (this repository's plugins/), the crate joins it;
anywhere else it is a workspace of its own depending on the guest SDK by path.

Python and JavaScript: a folder with the handler (src/app.py, or app.js), its
tests, the test host they import (acemq_testing.py, or acemq-testing.mjs),
the WIT it is built against (wit/plugin.wit) and a README of what follows,
including what runs at build time and what at call time. Its tests need no
install (unittest, node --test). --codec and --sdk are Rust only.

Examples:
  acemq-host plugin new order-audit
  cd order-audit && cargo test && acemq-host plugin build
  acemq-host plugin new order-audit --lang python
  cd order-audit && python3 -m unittest && acemq-host plugin build
  acemq-host plugin new order-audit --lang js
  cd order-audit && node --test test/ && acemq-host plugin build

Exit codes: 0 created, 2 unusable name, folder or option, 1 could not write.";

const PLUGIN_BUILD_HELP: &str = "\
The language is what the folder holds: Cargo.toml (Rust), src/app.py
(Python), package.json with app.js (JavaScript).

Rust: uses rustup's toolchain when it has the wasm32-unknown-unknown target,
otherwise Debian's rustc-web (installed with apt when missing and allowed;
otherwise the command to run is printed). Only what changed is rebuilt.

Python and JavaScript: against the folder's wit/plugin.wit (else the WIT
built into acemq-host), with componentize-py 0.25.1 (from PyPI, with this
machine's python3) or the componentize-js and jco of the folder's
package-lock.json (from npm, with node and npm), installed on first use into
the user's cache ($XDG_CACHE_HOME/acemq-host/toolchains, else
~/.cache/acemq-host/toolchains) and reused offline by every later build. A
component newer than every source (src/ or the .js files, package.json, the
lock, the WIT) is up to date and not rebuilt.

Prints where each component is, its size, and the build's time.

Examples:
  acemq-host plugin build order-audit
  acemq-host plugin build plugins          # every Rust plugin of this repository
  acemq-host plugin build plugins/order-router-py --out-dir /tmp/components

Exit codes: 0 built, 2 not a plugin folder (or an option of another
language), 1 build failed (or its toolchain could not be installed).";

const PLUGIN_RUN_HELP: &str = "\
Example:
  acemq-host plugin run target/plugins/order-router.wasm \\
      --body '{\"id\":\"A-1\",\"customer\":\"ada\",\"total\":4.5}' \\
      --content-type application/json --publish-to orders.events
  acemq-host plugin run target/plugins/order-router.wasm \
      --message captured.json --publish-to orders.events

Each output is shown as a host would publish it: its properties and every
header, the plugin's and the envelope's (x-acemq-*). The compiled plugin is
kept in the user's cache (~/.cache/acemq-host/plugins), so the next run of
the same file starts in milliseconds.

Exit codes: 0 the call completed, whatever the handler decided; 1 it did not
(trap, panic, deadline, memory, or a publish outside --publish-to); 2 unusable
input (an argument, the body file, the plugin file).";

pub fn run(command: PluginCommand) -> ExitCode {
    let result = match command {
        PluginCommand::Componentize { input, output } => {
            return report(componentize(&input, &output));
        }
        PluginCommand::Inspect { file } => {
            return match plugin::inspect::inspect_file(&file) {
                Ok(text) => {
                    print!("{text}");
                    Exit::Done.into()
                }
                Err(e) => fail(Exit::Invalid, &e),
            };
        }
        PluginCommand::New {
            name,
            lang,
            codec,
            dir,
            sdk,
        } => create(new::NewRequest {
            name,
            lang,
            codec,
            parent: dir,
            sdk,
        }),
        PluginCommand::Build {
            dir,
            target_dir,
            out_dir,
        } => build::build(
            &dir,
            &build::Overrides {
                target_dir,
                out_dir,
            },
        )
        .map(|built| {
            print!("{}", build::summary(&built));
            // Compiled to machine code for the host's cache, so the first
            // start or hot swap after a build does not compile.
            let components: Vec<PathBuf> = built.iter().map(|b| b.path.clone()).collect();
            print!(
                "{}",
                precompile::summary(&precompile::precompile(&components))
            );
            Exit::Done.into()
        }),
        PluginCommand::Run {
            file,
            message,
            body,
            headers,
            config,
            publish_to,
            content_type,
            exchange,
            routing_key,
            message_id,
            deadline,
        } => run_once(run_one::RunRequest {
            plugin: file,
            message,
            body,
            headers,
            config,
            content_type,
            exchange,
            routing_key,
            message_id,
            publish_to,
            deadline,
        }),
    };
    result.unwrap_or_else(|failure| fail(failure.code, &failure.error))
}

/// `plugin new`: the crate, and what to do next.
fn create(request: new::NewRequest) -> Result<ExitCode, Failure> {
    new::create(&request).map(|created| {
        print!(
            "{}",
            new::next_steps(&created, &request.name, request.codec)
        );
        Exit::Done.into()
    })
}

/// `plugin run`: what the host would do; [`Exit::Failed`] when the call
/// did not complete.
fn run_once(request: run_one::RunRequest) -> Result<ExitCode, Failure> {
    run_one::run(&request).map(|report| {
        print!("{}", run_one::render(&report));
        match report.completed() {
            true => Exit::Done.into(),
            false => Exit::Failed.into(),
        }
    })
}

fn componentize(input: &Path, output: &Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let core = std::fs::read(input).with_context(|| format!("cannot read {}", input.display()))?;
    let component = plugin::componentize::componentize(&core)
        .with_context(|| format!("{}", input.display()))?;
    std::fs::write(output, component)
        .with_context(|| format!("cannot write {}", output.display()))?;
    Ok(())
}
