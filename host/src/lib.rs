//! acemq-host: a RabbitMQ message-processing host whose handler logic and
//! codecs run as sandboxed WebAssembly components.
//!
//! The data path reads top to bottom: a delivery enters [`broker::consumer`],
//! its envelope is read ([`envelope`]), the handler runs ([`plugin`]), and
//! [`dispatch`] decides its one settlement, which the consumer carries out.
//! Everything that needs no broker ([`topology`], [`retry`], [`envelope`],
//! the decisions in [`dispatch`]) is a pure function over plain data.

pub mod admin;
pub mod app;
pub mod broker;
pub mod cli;
pub mod config;
pub mod dispatch;
pub mod envelope;
pub mod plugin;
pub mod retry;
pub mod telemetry;
pub mod topology;
