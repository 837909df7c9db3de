//! Declarations, each on a short-lived channel of its own (why:
//! `topology::apply`, which decides what to declare and in which order).
use std::future::Future;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Connection, ExchangeKind};

use super::lost::until_lost;

pub async fn exchange(
    connection: &Connection,
    name: ShortString,
    kind: ExchangeKind,
    options: ExchangeDeclareOptions,
    arguments: FieldTable,
) -> lapin::Result<()> {
    on_own_channel(connection, |channel| async move {
        channel
            .exchange_declare(name, kind, options, arguments)
            .await
    })
    .await
}

pub async fn queue(
    connection: &Connection,
    name: ShortString,
    options: QueueDeclareOptions,
    arguments: FieldTable,
) -> lapin::Result<()> {
    on_own_channel(connection, |channel| async move {
        channel
            .queue_declare(name, options, arguments)
            .await
            .map(drop)
    })
    .await
}

pub async fn binding(
    connection: &Connection,
    queue: ShortString,
    exchange: ShortString,
    routing_key: ShortString,
    arguments: FieldTable,
) -> lapin::Result<()> {
    on_own_channel(connection, |channel| async move {
        channel
            .queue_bind(
                queue,
                exchange,
                routing_key,
                QueueBindOptions::default(),
                arguments,
            )
            .await
    })
    .await
}

/// Runs `declare` on a new channel, then closes it unless the broker
/// already did (a refusal closes it), and passes the declaration's own
/// result on. A failed close after a declaration succeeded does not undo
/// it, so it is only logged.
async fn on_own_channel<F, D>(connection: &Connection, declare: D) -> lapin::Result<()>
where
    D: FnOnce(Channel) -> F,
    F: Future<Output = lapin::Result<()>>,
{
    // Raced against the connection's end: see `lost.rs`.
    until_lost(connection, async {
        let channel = connection.create_channel().await?;
        let result = declare(channel.clone()).await;
        if channel.status().connected()
            && let Err(error) = channel.close(200, ShortString::from("OK")).await
        {
            tracing::debug!(%error, "closing a topology channel failed");
        }
        result
    })
    .await
}
