//! One consumer: subscribe with manual acks and a prefetch, run the handler
//! for each delivery, and carry out the settlement `dispatch` decided.
//!
//! Every delivery ends in exactly one of: ack after its work is done (sent
//! together with others, see acks.rs), a republish (retry, dead letter,
//! park) followed by an ack, or a nack with requeue when that republish could
//! not be confirmed. Nothing is dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::acks::AckBatcher;
use super::publisher::{Publication, PublishError, Publisher};
use crate::dispatch::{self, DeliveryFacts, Settlement};
use crate::envelope::{self, Envelope};
use crate::plugin::{CodecSet, HandlerSlot, Input, Outgoing};
use crate::retry::RetryPolicy;
use crate::telemetry::{Metrics, PluginFaultLabels, QueueLabel, QueueRung, QueueTarget};

/// What one consumer needs for its whole life.
pub struct ConsumerSpec {
    pub queue: String,
    pub prefetch: u16,
    pub concurrency: usize,
    pub policy: RetryPolicy,
    pub handler: Arc<HandlerSlot>,
    pub codecs: Arc<CodecSet>,
}

/// Shared by every consumer of the host.
#[derive(Clone)]
pub struct ConsumerEnv {
    pub publisher: Arc<Publisher>,
    pub metrics: Arc<Metrics>,
    /// Cancelled when the host shuts down.
    pub shutdown: CancellationToken,
    pub drain_timeout: Duration,
    /// How many consumers hold a subscription (consume-ok received, not yet
    /// cancelled): `/health` is UP only when all of them do.
    pub consuming: Arc<AtomicUsize>,
}

struct Context {
    spec: ConsumerSpec,
    env: ConsumerEnv,
    acks: Arc<AckBatcher>,
}

/// A delivery's envelope, read once, and its body, taken out of the
/// delivery: both are shared with the handler call without a copy.
struct Incoming {
    envelope: Arc<Envelope>,
    body: Bytes,
}

impl Incoming {
    fn read(delivery: &mut Delivery) -> Self {
        Self {
            envelope: Arc::new(Envelope::read(
                &delivery.properties,
                delivery.routing_key.as_str(),
                now_ms(),
            )),
            body: std::mem::take(&mut delivery.data).into(),
        }
    }

    /// The message as the handler is given it.
    fn input(&self, delivery: &Delivery) -> Input {
        Input::of_delivery(
            self.envelope.clone(),
            &delivery.properties,
            delivery.exchange.as_str(),
            delivery.routing_key.as_str(),
            delivery.redelivered,
            self.body.clone(),
        )
    }
}

/// Subscribes and consumes until shutdown or until the subscription fails.
pub async fn run(
    connection: &Connection,
    spec: ConsumerSpec,
    env: ConsumerEnv,
) -> anyhow::Result<()> {
    let queue = spec.queue.clone();
    let channel = connection.create_channel().await?;
    // Quorum queues and streams refuse global QoS: prefetch is per consumer.
    channel
        .basic_qos(spec.prefetch, BasicQosOptions { global: false })
        .await?;
    let tag = format!("acemq-host.{}.{}", queue, uuid::Uuid::new_v4().simple());
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| anyhow::anyhow!("cannot consume from queue '{queue}': {e}"))?;
    env.consuming.fetch_add(1, Ordering::SeqCst);
    tracing::info!(queue = %queue, prefetch = spec.prefetch, concurrency = spec.concurrency, "consuming");

    let permits = Arc::new(Semaphore::new(spec.concurrency));
    let acks = Arc::new(AckBatcher::new(channel.clone(), spec.prefetch));
    let linger_stop = CancellationToken::new();
    let linger = tokio::spawn({
        let acks = acks.clone();
        let stop = linger_stop.clone();
        async move { acks.run_linger(stop).await }
    });
    let ctx = Arc::new(Context {
        spec,
        env: env.clone(),
        acks: acks.clone(),
    });
    let mut running = JoinSet::new();
    let mut failure = None;

    loop {
        let next = tokio::select! {
            biased;
            _ = env.shutdown.cancelled() => break,
            next = deliveries.next() => next,
        };
        match next {
            Some(Ok(delivery)) => {
                acks.received(delivery.delivery_tag).await;
                // Wait for a free handler slot. A delivery that shutdown
                // overtakes never starts: it is left unsettled, and closing
                // the channel gives it back (see below).
                let permit = tokio::select! {
                    biased;
                    _ = env.shutdown.cancelled() => break,
                    permit = permits.clone().acquire_owned() => permit.expect("semaphore never closed"),
                };
                let ctx = ctx.clone();
                running.spawn(async move {
                    handle(&ctx, delivery, permit).await;
                });
            }
            Some(Err(e)) => {
                failure = Some(anyhow::anyhow!(
                    "consuming from queue '{queue}' failed: {e}"
                ));
                break;
            }
            None => {
                if !env.shutdown.is_cancelled() {
                    failure = Some(anyhow::anyhow!(
                        "the broker cancelled the consumer of queue '{queue}'"
                    ));
                }
                break;
            }
        }
        while running.try_join_next().is_some() {}
    }

    env.consuming.fetch_sub(1, Ordering::SeqCst);

    // Shutdown, in the order that keeps every settlement. Nothing new starts
    // (the loop above is left); deliveries that arrive meanwhile wait unread.
    //
    // 1. The running deliveries finish, up to the drain timeout; their acks
    //    and republishes go out on this channel.
    let drained = tokio::time::timeout(env.drain_timeout, async {
        while running.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            queue = %queue,
            stranded = running.len(),
            drain_timeout = %humantime::format_duration(env.drain_timeout),
            "deliveries still running at the drain timeout; the broker requeues them"
        );
        running.abort_all();
    }
    // The acks of everything that finished go out now, not after the linger.
    linger_stop.cancel();
    let _ = linger.await;
    acks.flush(true).await;
    // 2. Only then is the consumer cancelled. An ack written to the socket is
    //    not yet an ack applied by the queue: RabbitMQ's quorum-queue client
    //    holds settlements back while 32 or more of its commands are in
    //    flight, and a channel closed meanwhile loses them, so the messages
    //    come back although they were handled. basic.cancel is synchronous:
    //    newer brokers send what they held back before cancelling, and on
    //    3.10 the round trip gives the queue time to apply it (the SIGTERM
    //    test in tests/skeleton.rs checks exactly-once).
    if let Err(e) = channel
        .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
        .await
    {
        tracing::warn!(queue = %queue, error = %e, "cancelling the consumer failed");
    }
    // 3. Closing the channel gives back, in one step, every delivery that
    //    arrived and never started. (One nack each would be the same
    //    requeue, as a burst of commands that could hold back the acks.)
    if let Err(e) = channel.close(200, "acemq-host shutting down".into()).await {
        tracing::warn!(queue = %queue, error = %e, "closing the consumer's channel");
    }
    tracing::info!(queue = %queue, "consumer stopped");
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// One delivery, from handler call to settlement.
async fn handle(ctx: &Context, mut delivery: Delivery, permit: tokio::sync::OwnedSemaphorePermit) {
    let metrics = &ctx.env.metrics;
    let queue = ctx.spec.queue.as_str();
    let gauge = metrics
        .in_flight
        .get_or_create(&QueueLabel {
            queue: queue.to_string(),
        })
        .clone();
    gauge.inc();

    let incoming = Incoming::read(&mut delivery);
    let input = incoming.input(&delivery);
    let handler = ctx.spec.handler.clone();
    let codecs = ctx.spec.codecs.clone();
    // Handler calls are synchronous wasm: run them where they cannot stall
    // the runtime's workers (a call may run up to its deadline).
    let called =
        tokio::task::spawn_blocking(move || dispatch::run_plugins(&handler, &codecs, input)).await;
    drop(permit);
    let handled = called.unwrap_or_else(|join_error| {
        // The host's own code panicked around the call. The delivery is
        // still ours: it fails like any other, and the policy decides.
        tracing::error!(queue, message_id = %incoming.envelope.id, error = %join_error, "handler task failed");
        dispatch::Handled::host_failed(&join_error.to_string())
    });
    if let dispatch::Step::Handled {
        result: Err(fault), ..
    } = &handled.step
    {
        metrics
            .plugin_faults
            .get_or_create(&PluginFaultLabels {
                queue: queue.to_string(),
                fault: fault.kind.label().to_string(),
            })
            .inc();
        tracing::warn!(queue, message_id = %incoming.envelope.id, version = %handled.version, fault = %fault, "handler failed");
    }
    if let Some(fuel) = handled.fuel {
        metrics
            .plugin_fuel
            .get_or_create(&QueueLabel {
                queue: queue.to_string(),
            })
            .inc_by(fuel);
    }
    let facts = DeliveryFacts {
        queue,
        envelope: &incoming.envelope,
        now_ms: now_ms(),
    };
    let settlement = dispatch::settle(facts, handled.step, &ctx.spec.policy);
    settle(ctx, &delivery, &incoming, settlement).await;
    gauge.dec();
}

/// Carries out a settlement. Every path ends in one ack or one nack.
async fn settle(ctx: &Context, delivery: &Delivery, incoming: &Incoming, settlement: Settlement) {
    let queue = ctx.spec.queue.as_str();
    let metrics = &ctx.env.metrics;
    let id = incoming.envelope.id.as_str();
    match settlement {
        Settlement::Accept { outputs } => {
            let publications: Result<Vec<_>, String> = outputs
                .into_iter()
                .map(|o| output_publication(&incoming.envelope, o))
                .collect();
            let published = match publications {
                Ok(publications) => ctx
                    .env
                    .publisher
                    .publish_all(publications)
                    .await
                    .map_err(|e| e.to_string()),
                Err(refused) => Err(refused),
            };
            match published {
                Ok(()) => {
                    ctx.acks.ready(delivery.delivery_tag).await;
                    metrics.consumed(queue, dispatch::Outcome::Acked.as_str());
                    tracing::debug!(queue, message_id = id, "acked");
                }
                Err(e) => {
                    tracing::warn!(queue, message_id = id, error = %e, "outputs were not confirmed");
                    let facts = DeliveryFacts {
                        queue,
                        envelope: &incoming.envelope,
                        now_ms: now_ms(),
                    };
                    // Never an Accept again, so this recursion ends.
                    let instead = dispatch::outputs_failed(facts, &e, &ctx.spec.policy);
                    Box::pin(settle(ctx, delivery, incoming, instead)).await;
                }
            }
        }
        Settlement::RetryInConsumer { delay, reason } => {
            retry_after_consumer_wait(ctx, delivery, incoming, delay, &reason).await;
        }
        Settlement::RetryInBroker {
            rung,
            delay,
            reason,
        } => {
            let properties = envelope::retry_properties(&delivery.properties, &incoming.envelope);
            match republish(ctx, &rung, incoming, properties).await {
                Ok(()) => {
                    ctx.acks.ready(delivery.delivery_tag).await;
                    metrics.retried(queue, "broker");
                    metrics.consumed(queue, dispatch::Outcome::Retried.as_str());
                    tracing::info!(queue, message_id = id, rung = %rung, reason = %reason, "retrying through the broker");
                }
                Err(PublishError::Unroutable { .. }) => {
                    // The rung is gone (deleted, or never declared by whoever
                    // owns the queue): wait here instead, as every AceMQ library does.
                    metrics
                        .rung_missing
                        .get_or_create(&QueueRung {
                            queue: queue.to_string(),
                            rung: rung.clone(),
                        })
                        .inc();
                    tracing::warn!(queue, rung = %rung, "retry rung missing; waiting in the consumer instead");
                    retry_after_consumer_wait(ctx, delivery, incoming, delay, &reason).await;
                }
                Err(e) => {
                    tracing::warn!(queue, message_id = id, error = %e, "retry republish failed; requeueing");
                    requeue_counted(ctx, delivery).await;
                }
            }
        }
        Settlement::DeadLetter {
            queue: target,
            reason,
            outcome,
        } => {
            set_aside(ctx, delivery, incoming, &target, &reason, outcome).await;
        }
        Settlement::Park {
            queue: target,
            reason,
        } => {
            set_aside(
                ctx,
                delivery,
                incoming,
                &target,
                &reason,
                dispatch::Outcome::Parked,
            )
            .await;
        }
    }
}

/// Holds the delivery unacked for the jittered delay, then republishes it to
/// its own queue with the attempt advanced. Shutdown during the wait requeues
/// it without advancing the attempt.
async fn retry_after_consumer_wait(
    ctx: &Context,
    delivery: &Delivery,
    incoming: &Incoming,
    delay: Duration,
    reason: &str,
) {
    let queue = ctx.spec.queue.as_str();
    let wait = ctx.spec.policy.jittered(delay, rand::random::<f64>());
    tokio::select! {
        _ = tokio::time::sleep(wait) => {}
        _ = ctx.env.shutdown.cancelled() => {
            requeue_counted(ctx, delivery).await;
            return;
        }
    }
    let properties = envelope::retry_properties(&delivery.properties, &incoming.envelope);
    match republish(ctx, queue, incoming, properties).await {
        Ok(()) => {
            ctx.acks.ready(delivery.delivery_tag).await;
            ctx.env.metrics.retried(queue, "consumer");
            ctx.env
                .metrics
                .consumed(queue, dispatch::Outcome::Retried.as_str());
            tracing::info!(queue, message_id = %incoming.envelope.id, wait = %humantime::format_duration(wait), reason, "retried after waiting in the consumer");
        }
        Err(e) => {
            tracing::warn!(queue, message_id = %incoming.envelope.id, error = %e, "retry republish failed; requeueing");
            requeue_counted(ctx, delivery).await;
        }
    }
}

/// Republishes a copy to `.dlq` or `.parked` with `x-acemq-error`, then acks;
/// if the copy is not confirmed, the original goes back to its queue.
async fn set_aside(
    ctx: &Context,
    delivery: &Delivery,
    incoming: &Incoming,
    target: &str,
    reason: &str,
    outcome: dispatch::Outcome,
) {
    let queue = ctx.spec.queue.as_str();
    let properties =
        envelope::set_aside_properties(&delivery.properties, &incoming.envelope, reason);
    match republish(ctx, target, incoming, properties).await {
        Ok(()) => {
            ctx.acks.ready(delivery.delivery_tag).await;
            let word = if outcome == dispatch::Outcome::Parked {
                "parked"
            } else {
                "dead_lettered"
            };
            ctx.env.metrics.set_aside(queue, word);
            ctx.env.metrics.consumed(queue, outcome.as_str());
            tracing::warn!(queue, message_id = %incoming.envelope.id, to = target, reason, "set aside");
        }
        Err(e) => {
            ctx.env
                .metrics
                .set_aside_failed
                .get_or_create(&QueueTarget {
                    queue: queue.to_string(),
                    target: target.to_string(),
                })
                .inc();
            tracing::error!(queue, message_id = %incoming.envelope.id, to = target, error = %e, "set-aside publish failed; requeueing");
            requeue_counted(ctx, delivery).await;
        }
    }
}

/// Republishes the delivery's own body through the default exchange.
async fn republish(
    ctx: &Context,
    target_queue: &str,
    incoming: &Incoming,
    properties: BasicProperties,
) -> Result<(), PublishError> {
    ctx.env
        .publisher
        .publish(Publication {
            exchange: String::new(),
            routing_key: target_queue.to_string(),
            body: incoming.body.to_vec(),
            properties,
        })
        .await
}

/// A plugin's output as a new AceMQ message caused by `parent`.
fn output_publication(parent: &Envelope, output: Outgoing) -> Result<Publication, String> {
    let message_type = output
        .message_type
        .clone()
        .unwrap_or_else(|| output.routing_key.clone());
    let child = Envelope::child_of(parent, message_type, envelope::default_origin(), now_ms());
    let properties = envelope::outgoing_properties(
        &child,
        output.content_type.as_deref(),
        output.persistent,
        &output.headers,
    )
    .map_err(|e| e.to_string())?;
    Ok(Publication {
        exchange: output.exchange,
        routing_key: output.routing_key,
        body: output.body,
        properties,
    })
}

/// Gives the delivery back to its queue now, without advancing the attempt:
/// it comes back as a fresh delivery. Only once the nack is written may a
/// `multiple` ack pass over it (see acks.rs).
async fn requeue_counted(ctx: &Context, delivery: &Delivery) {
    let options = BasicNackOptions {
        multiple: false,
        requeue: true,
    };
    if let Err(e) = delivery.acker.nack(options).await {
        tracing::warn!(error = %e, "requeue failed; the broker will redeliver");
    }
    ctx.acks.forget(delivery.delivery_tag).await;
    let queue = ctx.spec.queue.as_str();
    ctx.env.metrics.retried(queue, "requeued");
    ctx.env
        .metrics
        .consumed(queue, dispatch::Outcome::Retried.as_str());
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
