//! The scheduler's accuracy and rate (issue targets: a message delivered at
//! its due time within the contract's resolution of one rung, 1 s).
//!
//! ```text
//! scripts/build-plugins && cargo bench -p acemq-tests --bench scheduler_lateness
//! ACEMQ_BENCH_MESSAGES=2000 ACEMQ_BENCH_SPREAD_S=30 cargo bench -p acemq-tests --bench scheduler_lateness
//! ```
//!
//! A throwaway RabbitMQ node is started and the host runs in this process
//! with the scheduler on and no consumer of its own, on a vhost of its own.
//! Two runs:
//!
//! 1. **Lateness**: `ACEMQ_BENCH_MESSAGES` (10,000) messages are scheduled
//!    at once, in Java's style, with due times spread evenly over the next
//!    `ACEMQ_BENCH_SPREAD_S` (120) seconds, starting 5 s ahead. Each goes
//!    down the ladder (1 min, 10 s and 1 s rungs) and is delivered by the
//!    host's control consumer; this bench notes when each arrives. Printed:
//!    lateness (arrival - due) median, p99, max and min (a negative min
//!    would be a delivery before its due time), and the hops the host made.
//! 2. **Rate**: as many messages, already due, published straight to the
//!    control queue: how fast the control consumer delivers them (each one
//!    a confirmed publish, then an ack), against the bare lapin baseline at
//!    its best on the same work with the same prefetch (50): every
//!    delivery's publish pipelined, `multiple` acks once the confirms up to
//!    them are in.
//!
//! Prints figures and asserts nothing: broker, host and this bench share
//! the machine's 2 cores.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

use acemq_tests::host::{InProcessHost, metric_sum};
use acemq_tests::scheduler_peer::{
    Arrivals, DUE_QUEUE, Scheduled, Style, Vhost, now_ms, schedule_all, scheduler_only_config,
};
use acemq_tests::{Broker, env_or, median};

fn config(vhost: &Vhost<'_>) -> String {
    scheduler_only_config(&vhost.url, "due", "due.arrivals", "arrived")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn messages(count: usize, due: impl Fn(usize) -> u64) -> Vec<(String, u64)> {
    (0..count)
        .map(|i| (uuid::Uuid::new_v4().to_string(), due(i)))
        .collect()
}

async fn schedule(vhost: &Vhost<'_>, planned: &[(String, u64)]) -> Result<()> {
    let scheduled: Vec<Scheduled<'_>> = planned
        .iter()
        .map(|(id, due)| Scheduled {
            exchange: "due",
            routing_key: "arrived",
            due_at_ms: *due,
            body: b"{}",
            content_type: None,
            id,
        })
        .collect();
    schedule_all(&vhost.url, Style::Java, &scheduled, 500).await
}

/// Waits for every planned message; their arrival times by id.
async fn arrivals(
    arrivals: &mut Arrivals,
    count: usize,
    timeout: Duration,
) -> Result<HashMap<String, u64>> {
    let mut seen = HashMap::new();
    while seen.len() < count {
        let (at, message) = arrivals
            .next(timeout)
            .await
            .with_context(|| format!("{} of {count} arrived", seen.len()))?;
        seen.entry(message.message_id.unwrap_or_default())
            .or_insert(at);
    }
    Ok(seen)
}

async fn lateness(
    vhost: &Vhost<'_>,
    host: &InProcessHost,
    count: usize,
    spread_s: u64,
) -> Result<()> {
    let mut watch = Arrivals::watch(&vhost.url, "due.arrivals").await?;
    let start = now_ms() + 5_000;
    let spread_ms = spread_s * 1_000;
    let planned = messages(count, |i| start + (i as u64 * spread_ms) / count as u64);
    schedule(vhost, &planned).await?;
    println!(
        "lateness: {count} messages scheduled, due over {spread_s} s from 5 s ahead; waiting..."
    );
    let seen = arrivals(&mut watch, count, Duration::from_secs(spread_s + 60)).await?;
    let mut late: Vec<f64> = planned
        .iter()
        .map(|(id, due)| seen[id] as f64 - *due as f64)
        .collect();
    late.sort_by(f64::total_cmp);
    let rendered = host.metrics.render();
    let early = late.iter().filter(|l| **l < 0.0).count();
    println!(
        "lateness (ms): median {:.0}, p1 {:.0}, p99 {:.0}, max {:.0}, min {:.0}; early: {early} of {count} (negative: early)",
        median(&mut late.clone()),
        percentile(&late, 1.0),
        percentile(&late, 99.0),
        late[late.len() - 1],
        late[0]
    );
    println!(
        "hops made: {:.0} (1m {:.0}, 10s {:.0}, 1s {:.0}); delivered {:.0}",
        metric_sum(&rendered, "acemq_scheduler_hops_total", &[]),
        metric_sum(
            &rendered,
            "acemq_scheduler_hops_total",
            &[("rung", "acemq.schedule.1m")]
        ),
        metric_sum(
            &rendered,
            "acemq_scheduler_hops_total",
            &[("rung", "acemq.schedule.10s")]
        ),
        metric_sum(
            &rendered,
            "acemq_scheduler_hops_total",
            &[("rung", "acemq.schedule.1s")]
        ),
        metric_sum(&rendered, "acemq_scheduler_delivered_total", &[]),
    );
    Ok(())
}

/// Publishes `count` messages already due straight into the control queue
/// and times how long until all of them arrived.
async fn timed_delivery(vhost: &Vhost<'_>, count: usize) -> Result<f64> {
    let mut watch = Arrivals::watch(&vhost.url, "due.arrivals").await?;
    let planned = messages(count, |_| now_ms() - 1_000);
    schedule(vhost, &planned).await?;
    let started = Instant::now();
    arrivals(&mut watch, count, Duration::from_secs(120)).await?;
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// The bare library at its best on the control consumer's work: prefetch
/// 50, each delivery published on with its confirm pipelined, and acks
/// sent `multiple`: confirms are taken in publish order, and once every
/// publish up to a delivery is confirmed, one ack covers them all (at the
/// latest when nothing else is pending). Runs until `count` are done.
async fn bare_control_consumer(url: &str, count: usize) -> Result<()> {
    const ACK_EVERY: usize = 12;
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let consume = connection.create_channel().await?;
    consume.basic_qos(50, BasicQosOptions::default()).await?;
    let publish = connection.create_channel().await?;
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut deliveries = consume
        .basic_consume(
            DUE_QUEUE.into(),
            "bare".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut confirms = FuturesOrdered::new();
    let (mut done, mut unacked) = (0, 0);
    while done < count {
        tokio::select! {
            Some(delivery) = deliveries.next() => {
                let delivery = delivery?;
                let confirm = publish
                    .basic_publish(
                        "due".into(),
                        "arrived".into(),
                        BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() },
                        &delivery.data,
                        delivery.properties.clone(),
                    )
                    .await?;
                confirms.push_back(async move { (confirm.await, delivery.acker) });
            }
            Some((confirmed, acker)) = confirms.next() => {
                if !confirmed?.is_ack() {
                    bail!("a bare publish was not confirmed");
                }
                done += 1;
                unacked += 1;
                if unacked >= ACK_EVERY || confirms.is_empty() || done == count {
                    acker.ack(BasicAckOptions { multiple: true }).await?;
                    unacked = 0;
                }
            }
        }
    }
    let _ = connection.close(200, "done".into()).await;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let count: usize = env_or("ACEMQ_BENCH_MESSAGES", 10_000)?;
    let spread_s: u64 = env_or("ACEMQ_BENCH_SPREAD_S", 120)?;
    let broker = Broker::start()?;

    let vhost = Vhost::create(&broker, "bench.sched")?;
    let host = InProcessHost::start(&config(&vhost)).await?;
    lateness(&vhost, &host, count, spread_s).await?;
    let mut host_rates = Vec::new();
    for _ in 0..3 {
        host_rates.push(timed_delivery(&vhost, count).await?);
    }
    host.stop().await?;

    // The baseline on a vhost of its own, with the same topology (declared
    // by a host that is then stopped).
    let bare = Vhost::create(&broker, "bench.bare")?;
    InProcessHost::start(&config(&bare)).await?.stop().await?;
    let mut bare_rates = Vec::new();
    for _ in 0..3 {
        let url = bare.url.clone();
        let consumer = tokio::spawn(async move { bare_control_consumer(&url, count).await });
        bare_rates.push(timed_delivery(&bare, count).await?);
        consumer.await??;
    }
    let (host_rate, bare_rate) = (median(&mut host_rates), median(&mut bare_rates));
    println!(
        "control consumer, {count} due messages (median of 3): host {host_rate:.0} msg/s, bare lapin {bare_rate:.0} msg/s, ratio {:.2}",
        host_rate / bare_rate
    );
    // The vhosts go first: dropping one deletes it on the broker.
    drop((vhost, bare));
    broker.stop()?;
    Ok(())
}
