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

pub mod admin;
pub mod app;
pub mod broker;
pub mod cli;
pub mod config;
pub mod config_watch;
pub mod delivery;
pub mod dlq;
pub mod envelope;
pub mod fs_trust;
pub mod logging;
pub mod plugin;
pub mod plugin_dev;
pub mod replay;
pub mod retry;
pub mod telemetry;
pub mod topology;
pub mod trace;
