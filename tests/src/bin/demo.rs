//! The README's main job: a throwaway RabbitMQ, acemq-host running the
//! order-router plugin with `host/examples/orders.toml`, a few sample orders,
//! and what happened to each of them. Run it with `scripts/demo`, which
//! builds the plugins and the host first. With `--keep` the broker is left
//! running at the end (the one `scripts/broker` starts, url and stops), with
//! the demo's exchanges and queues, to go on trying things against.
//!
//! The host's own log goes to a file (`target/demo/host.log`), not between
//! the lines of the report: the report says where it is.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use acemq_tests::Broker;
use acemq_tests::broker::dev;
use acemq_tests::host::{HostOptions, HostProcess, workspace_root};
use anyhow::{Context, Result};
use lapin::BasicProperties;
use lapin::types::AMQPValue;

/// Sample orders: three valid, two the router must refuse.
const ORDERS: &[(&str, &str)] = &[
    ("A-1001", r#"{"id":"A-1001","customer":"ada","total":42.5}"#),
    ("A-1002", r#"{"id":"A-1002","customer":"grace"}"#),
    ("A-1003", r#"{"id":"A-1003","customer":"alan","total":-3}"#),
    (
        "A-1004",
        r#"{"id":"A-1004","customer":"barbara","total":7}"#,
    ),
    (
        "A-1005",
        r#"{"id":"A-1005","customer":"edsger","total":1999.99}"#,
    ),
];

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let keep = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--keep") => true,
        Some(other) => {
            eprintln!("usage: scripts/demo [--keep]   (unknown argument {other:?})");
            std::process::exit(2);
        }
    };
    let config = workspace_root().join("host/examples/orders.toml");
    println!("== acemq-host demo ==\n");

    let started = Instant::now();
    let broker = match keep {
        true => Broker::start_kept(&dev::default_dir()),
        false => Broker::start(),
    }
    .context("starting a throwaway RabbitMQ")?;
    println!(
        "1. a throwaway RabbitMQ is up on 127.0.0.1:{} (in {:.1} s; its data lives in a temporary folder)\n",
        broker.amqp_port(),
        started.elapsed().as_secs_f64()
    );

    println!(
        "2. acemq-host run --config host/examples/orders.toml   (ACEMQ_URL points at that broker)"
    );
    let options = HostOptions {
        consumers: 1,
        url: Some(broker.amqp_url().to_string()),
        ..HostOptions::default()
    };
    let host_started = Instant::now();
    let host = HostProcess::start_with(&config, tempfile::tempdir()?, &options)?;
    println!(
        "   the host is consuming (in {:.1} s; its log goes to a file, shown at the end)\n",
        host_started.elapsed().as_secs_f64()
    );

    println!(
        "3. publishing {} orders to exchange 'orders' with routing key 'order.created'",
        ORDERS.len()
    );
    for (id, body) in ORDERS {
        let properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_message_id(format!("order-{id}").into());
        println!("   {id}  {body}");
        broker
            .publish("orders", "order.created", body.as_bytes(), properties)
            .await?;
    }
    println!();

    let valid = 3;
    let events = broker
        .drain("orders.accepted", valid, Duration::from_secs(30))
        .await?;
    let dead = broker
        .drain(
            "orders.new.dlq",
            ORDERS.len() - valid,
            Duration::from_secs(30),
        )
        .await?;
    let mut fate = BTreeMap::new();
    for event in &events {
        let cause = text(event.header("x-acemq-causation")).unwrap_or_default();
        fate.insert(
            cause.trim_start_matches("order-").to_string(),
            format!(
                "accepted  -> order.accepted event on queue orders.accepted: {}",
                event.body_str()
            ),
        );
    }
    for message in &dead {
        let id = message.message_id.clone().unwrap_or_default();
        let reason = text(message.header("x-acemq-error")).unwrap_or_default();
        fate.insert(
            id.trim_start_matches("order-").to_string(),
            format!("refused   -> orders.new.dlq, x-acemq-error: {reason}"),
        );
    }
    println!("4. what happened to each order:");
    for (id, _) in ORDERS {
        let what = fate
            .get(*id)
            .map(String::as_str)
            .unwrap_or("not settled yet (!)");
        println!("   {id}  {what}");
    }
    println!();

    println!("5. stopping: SIGTERM to the host");
    let (status, log) = host.terminate_with_log(Duration::from_secs(30))?;
    println!("   the host exited with {status}");
    let log_file = workspace_root().join("target/demo/host.log");
    std::fs::create_dir_all(log_file.parent().expect("a folder"))?;
    std::fs::write(&log_file, log.join("\n") + "\n")?;
    let warnings = log
        .iter()
        .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
        .count();
    println!(
        "   its log: target/demo/host.log ({} lines, {warnings} warnings or errors; a refused order is a warning)",
        log.len()
    );
    if keep {
        let kept = broker.leave_running()?;
        println!("   RabbitMQ left running (--keep):");
        println!("     amqp:       {}", kept.amqp_url);
        println!("     management: {} (guest / guest)", kept.mgmt_url);
        println!(
            "     run the host against it: ACEMQ_URL=$(scripts/broker url) target/debug/acemq-host run --config host/examples/orders.toml"
        );
        println!("     stop it: scripts/broker stop");
    } else {
        broker.stop()?;
        println!("   RabbitMQ stopped and its folder removed");
    }

    let all_settled = fate.len() == ORDERS.len();
    anyhow::ensure!(all_settled, "some orders were not settled");
    anyhow::ensure!(status.success(), "the host did not stop cleanly");
    Ok(())
}

fn text(value: Option<&AMQPValue>) -> Option<String> {
    match value? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        _ => None,
    }
}
