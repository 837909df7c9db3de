//! acemq-host: a RabbitMQ message-processing host whose handler logic and
//! codecs run as sandboxed WebAssembly components.
//!
//! The data path: a [`broker::subscription`] hands each delivery to its
//! consumer's [`delivery::Pipeline`], which reads the envelope
//! ([`envelope`]), runs the codecs and the handler ([`plugin`], through
//! [`delivery::plugins`]), decides the one settlement ([`delivery::decide`],
//! with the [`retry`] policy) and carries it out ([`delivery::settle`])
//! through the broker's publisher and the delivery's receipt. [`broker`]
//! knows AMQP and nothing of messages' meaning; [`plugin`] knows wasm and
//! nothing of AMQP.
//!
//! Everything that needs no broker ([`topology`]'s plan, [`retry`],
//! [`envelope`], [`delivery::decide`]) is a pure function over plain data;
//! what does ([`topology::apply`], [`delivery::settle`]) goes through a small
//! trait with a recording double in its tests.

// The model: what the host works with, as plain data checked by pure
// functions (a config, a topology and its plan, an envelope, a retry
// policy). It imports nothing of the layers below, with two exceptions
// named where they are: the config's values use the broker's address, TLS
// and stream-offset types and the log format's, and `topology::apply`
// hands each declaration to `broker::declare`.
pub mod config;
pub mod envelope;
pub mod retry;
pub mod topology;

// The running host: the broker conversations (`broker`, which knows AMQP
// and imports nothing of `delivery` or `plugin`), the plugins (`plugin`,
// which knows wasm and nothing of AMQP), the message path between them
// (`delivery`), the AceMQ scheduler's control consumer (`scheduler`), plugin state and
// idempotency (`state`), what an operator watches (`admin`, `telemetry`, `trace`,
// `logging`), what a service manager or an orchestrator is told (`service`),
// and `app`, which starts and stops it all.
pub mod admin;
pub mod app;
pub mod broker;
pub mod config_watch;
pub mod delivery;
pub(crate) mod logging;
// Its `contract_version!` macros name the contract in `build_info` too.
#[macro_use]
pub mod plugin;
pub mod rollout;
pub mod runtime;
pub mod scheduler;
pub mod service;
pub mod state;
pub mod telemetry;
pub mod trace;

// The operator tools: the command line (`cli`, with one file per command
// group) and the commands' own logic. They use the host and the model;
// nothing uses them but `main.rs`.
pub mod build_info;
pub mod cli;
pub(crate) mod dlq;
pub(crate) mod plugin_dev;
pub mod replay;

// Shared by the plugin loader and the commands: who may change a file, and
// the user's cache folder (compiled plugins, guest toolchains).
pub(crate) mod fs_trust;
pub mod user_cache;
