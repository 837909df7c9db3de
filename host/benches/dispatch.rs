//! In-process dispatch of one message through a no-op handler plugin, with no
//! broker: read the envelope, build the handler's message, run the plugins
//! (no codecs), decide the settlement; the consumer's own code for each step.
//!
//! Two figures, measured in the same run: reusing pooled instances (the
//! default) and a fresh instance per message (`isolation = "per-message"`).
//! Targets (docs/targets.md, Performance): at most 2 µs and 10 µs per message.
//!
//! Beside them, what the alternative design costs: the same reused call
//! handed to tokio's blocking pool and awaited from the runtime (one thread
//! hop there and back per delivery, as the host did before its plugin calls
//! became futures on the runtime; see `plugin/pool.rs`).
//!
//! And the plugin of the end-to-end benchmark's transform path (`stamp-v1`,
//! which reads a 1 KB body and publishes it stamped, as JSON): its call
//! alone, with no broker, to profile (`--profile-time` on
//! `dispatch/stamp-v1, reuse instance`; `ACEMQ_PERF_MAP=1` names the guest's
//! functions), and beside it the same work done natively, as the bare
//! transform loop of the end-to-end benchmark does it: what the sandbox
//! costs that path.
//!
//! Run: `scripts/build-plugins && cargo bench -p acemq-host --bench dispatch`

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_host::config::Isolation;
use acemq_host::delivery::{self, ConsumeOutcome, DeliveryFacts};
use acemq_host::envelope::{self, Envelope};
use acemq_host::plugin::{
    CodecSet, ConsumerContext, EngineSettings, HandlerSlot, HandlerVersion, Limits, PluginEngine,
};
use acemq_host::retry::RetryPolicy;
use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use futures::executor::block_on;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};

/// `target/plugins/NAME.wasm`, as scripts/build-plugins writes it.
fn plugin(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../target/plugins/{name}.wasm"))
}

/// A consumer's slot running `name` with `isolation`; the order routers
/// publish to `orders.events`.
fn slot(engine: &PluginEngine, name: &str, isolation: Isolation) -> HandlerSlot {
    // The stamp handler publishes to the exchange its config names.
    let config = if name.starts_with("stamp") {
        [("out_exchange".to_string(), "orders.events".to_string())].into()
    } else {
        Default::default()
    };
    let path = plugin(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/build-plugins first",
        path.display()
    );
    let context = Arc::new(ConsumerContext {
        queue: "bench".into(),
        publish_to: ["orders.events".to_string()].into(),
        config,
        limits: Limits {
            isolation,
            ..Limits::default()
        },
        ..ConsumerContext::default()
    });
    HandlerSlot::new(
        HandlerVersion::load(engine, &path, context)
            .unwrap_or_else(|e| panic!("{name} loads: {e}")),
    )
}

/// A delivery as the broker would hand it over: an AceMQ envelope and a
/// trace header, 1 KB of body.
fn delivery() -> (Arc<BasicProperties>, Bytes) {
    delivery_of(vec![b'x'; 1024])
}

/// A valid order, which an order router accepts and publishes an event for.
fn order() -> (Arc<BasicProperties>, Bytes) {
    delivery_of(br#"{"id":"o-1","customer":"acme","total":12.5}"#.to_vec())
}

fn delivery_of(body: Vec<u8>) -> (Arc<BasicProperties>, Bytes) {
    let envelope = Envelope::new(
        "order.created",
        envelope::default_origin(),
        1_700_000_000_000,
    );
    let mut app = FieldTable::default();
    app.insert(
        "traceparent".into(),
        AMQPValue::LongString(LongString::from(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )),
    );
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_headers(envelope.to_headers(&app));
    (Arc::new(properties), Bytes::from(body))
}

fn dispatch_one(
    handler: &HandlerSlot,
    codecs: &CodecSet,
    properties: &Arc<BasicProperties>,
    body: &Bytes,
    policy: &RetryPolicy,
) {
    let envelope = Arc::new(Envelope::read(
        properties,
        "order.created",
        1_700_000_000_001,
    ));
    let input = delivery::handler_input(
        envelope.clone(),
        properties.clone(),
        "orders",
        "order.created",
        false,
        body.clone(),
    );
    // The host awaits the call on its runtime; a call that never yields
    // (this one) completes in one poll, so the simplest executor measures it
    // (inside the runtime's context, which its deadline timer needs).
    let run = block_on(delivery::run_plugins(handler, codecs, input));
    let facts = DeliveryFacts {
        queue: "bench",
        envelope: &envelope,
        now_ms: 1_700_000_000_002,
        jitter_sample: 0.5,
        from_stream: false,
    };
    let settlement = delivery::decide::decide(facts, run, policy);
    assert_eq!(settlement.outcome(), ConsumeOutcome::Acked);
}

/// The host's side of a dispatch alone: reading the envelope and the
/// headers a plugin sees.
fn read_envelope_only(properties: &BasicProperties) {
    let envelope = Envelope::read(properties, "order.created", 1_700_000_000_001);
    let headers = envelope::split_headers(properties);
    std::hint::black_box((envelope, headers));
}

/// What `stamp-v1` does, done natively, for reference: the envelope read,
/// the body taken as text, and the stamped JSON made (the same fields, by
/// serde_json as the plugin uses it). Against the plugin's dispatch, what
/// the sandbox costs this work: the component boundary, the host calls the
/// guest makes, and the guest's code compiled from wasm.
fn stamp_natively(properties: &BasicProperties, body: &Bytes) {
    #[derive(serde::Serialize)]
    struct Stamped<'a> {
        input: &'a str,
        version: &'a str,
        input_id: &'a str,
    }
    let envelope = Envelope::read(properties, "order.created", 1_700_000_000_001);
    let input = std::str::from_utf8(body).expect("the bench's body is text");
    let stamped = serde_json::to_vec(&Stamped {
        input,
        version: "v1",
        input_id: envelope.id.as_str(),
    })
    .expect("a struct of strings serializes");
    std::hint::black_box(Bytes::from(stamped));
}

/// One measured loop: `per_round` calls of `one` make a sample.
struct Subject<'a> {
    per_round: u32,
    one: Box<dyn FnMut() + 'a>,
}

/// Median µs per call of each subject over `rounds` rounds. The subjects
/// take turns within every round, so a slower stretch of a noisy machine
/// slows all of them alike instead of whichever happened to run then.
fn interleaved_medians(rounds: usize, subjects: &mut [Subject<'_>]) -> Vec<f64> {
    let mut samples = vec![Vec::with_capacity(rounds); subjects.len()];
    for _ in 0..rounds {
        for (subject, samples) in subjects.iter_mut().zip(&mut samples) {
            let started = Instant::now();
            for _ in 0..subject.per_round {
                (subject.one)();
            }
            samples.push(started.elapsed().as_secs_f64() * 1e6 / f64::from(subject.per_round));
        }
    }
    samples
        .into_iter()
        .map(|mut samples| {
            samples.sort_by(f64::total_cmp);
            samples[samples.len() / 2]
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let engine = PluginEngine::new(EngineSettings::default()).expect("engine");
    let pooled = Arc::new(slot(&engine, "echo", Isolation::Pooled));
    let fresh = slot(&engine, "echo", Isolation::PerMessage);
    let stamp = slot(&engine, "stamp-v1", Isolation::Pooled);
    let codecs = CodecSet::new();
    let (properties, body) = delivery();
    let policy = RetryPolicy::none();
    // The host's runtime (`acemq_host::runtime`), a blocking pool beside it.
    let runtime = acemq_host::runtime::build(None).expect("runtime");
    // A call's deadline is also a tokio timer (plugin/pool.rs): calls need
    // the runtime's context, as the host's have.
    let _context = runtime.enter();

    let mut group = c.benchmark_group("dispatch");
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("reuse instance", |b| {
        b.iter(|| dispatch_one(&pooled, &codecs, &properties, &body, &policy))
    });
    group.bench_function("stamp-v1, reuse instance", |b| {
        b.iter(|| dispatch_one(&stamp, &codecs, &properties, &body, &policy))
    });
    group.bench_function("fresh instance", |b| {
        b.iter(|| dispatch_one(&fresh, &codecs, &properties, &body, &policy))
    });
    group.finish();

    // A profiling run (`--profile-time`) profiles one bench, nothing else.
    if std::env::args().any(|arg| arg == "--profile-time") {
        return;
    }
    // The summary the issue asks for, both figures side by side, each the
    // median of 15 interleaved rounds (2 noisy cores: medians, not means).
    let medians = interleaved_medians(
        15,
        &mut [
            Subject {
                per_round: 20_000,
                one: Box::new(|| dispatch_one(&pooled, &codecs, &properties, &body, &policy)),
            },
            Subject {
                per_round: 2_000,
                one: Box::new(|| dispatch_one(&fresh, &codecs, &properties, &body, &policy)),
            },
            Subject {
                per_round: 20_000,
                one: Box::new(|| read_envelope_only(&properties)),
            },
            Subject {
                per_round: 5_000,
                one: Box::new(|| dispatch_one(&stamp, &codecs, &properties, &body, &policy)),
            },
            Subject {
                per_round: 20_000,
                one: Box::new(|| stamp_natively(&properties, &body)),
            },
            Subject {
                per_round: 5_000,
                one: Box::new(|| {
                    let (pooled, properties, body) =
                        (pooled.clone(), properties.clone(), body.clone());
                    runtime.block_on(async move {
                        tokio::task::spawn_blocking(move || {
                            dispatch_one(
                                &pooled,
                                &CodecSet::new(),
                                &properties,
                                &body,
                                &RetryPolicy::none(),
                            )
                        })
                        .await
                        .expect("dispatch ran")
                    })
                }),
            },
        ],
    );
    let [reuse, per_message, envelope_only, stamped, native, hopped] = medians[..] else {
        unreachable!("one median per subject")
    };
    println!();
    println!(
        "dispatch of a no-op handler (1 KB body, envelope + trace header), median of 15 interleaved rounds:"
    );
    println!("  reuse instance : {reuse:8.2} µs/message   (target <= 2 µs)");
    println!("  fresh instance : {per_message:8.2} µs/message   (target <= 10 µs)");
    println!("  fresh / reuse  : {:8.2}x", per_message / reuse);
    println!("  of which the envelope read (no plugin): {envelope_only:.2} µs/message");
    println!(
        "  the transform path's plugin (stamp-v1: read the body, publish it stamped as JSON), reuse: {stamped:.2} µs/message"
    );
    println!(
        "    the same work done natively (reference): {native:.2} µs/message; the sandbox adds {:.2} µs ({:.1}x)",
        stamped - native,
        stamped / native
    );
    println!(
        "  reuse through a blocking-pool hop (the design not taken): {hopped:.2} µs/message ({:.1}x)",
        hopped / reuse
    );
    languages(&engine, &codecs, &policy);
}

/// The order router in Rust, Python and JavaScript: one valid order each
/// (parse, publish an event, accept), reusing an instance and with a fresh
/// one per message, interleaved in the same rounds.
fn languages(engine: &PluginEngine, codecs: &CodecSet, policy: &RetryPolicy) {
    let (properties, body) = order();
    let names = ["order-router", "order-router-py", "order-router-js"];
    let present: Vec<&str> = names
        .into_iter()
        .filter(|name| {
            let there = plugin(name).exists();
            if !there {
                println!("  {name}: skipped (target/plugins/{name}.wasm missing: scripts/build-plugins builds it when its toolchain installs)");
            }
            there
        })
        .collect();
    let slots: Vec<(HandlerSlot, HandlerSlot)> = present
        .iter()
        .map(|name| {
            (
                slot(engine, name, Isolation::Pooled),
                slot(engine, name, Isolation::PerMessage),
            )
        })
        .collect();
    let mut subjects: Vec<Subject<'_>> = Vec::new();
    for (name, (pooled, fresh)) in present.iter().zip(&slots) {
        // An interpreter's instance takes milliseconds to make: fewer calls.
        let rust = *name == "order-router";
        let (properties, body) = (&properties, &body);
        subjects.push(Subject {
            per_round: if rust { 20_000 } else { 200 },
            one: Box::new(move || dispatch_one(pooled, codecs, properties, body, policy)),
        });
        subjects.push(Subject {
            per_round: if rust { 2_000 } else { 5 },
            one: Box::new(move || dispatch_one(fresh, codecs, properties, body, policy)),
        });
    }
    let medians = interleaved_medians(9, &mut subjects);
    println!();
    println!(
        "the order router in three languages (a valid order: parse, publish, accept), median of 9 interleaved rounds:"
    );
    println!(
        "  {:<16} {:>14} {:>16} {:>16} {:>18}",
        "plugin", "reuse µs/msg", "fresh µs/msg", "instantiate ms", "memory/instance"
    );
    for ((name, pair), (pooled, fresh)) in present.iter().zip(medians.chunks(2)).zip(&slots) {
        // The memory a pooled instance keeps between calls; the time the
        // last fresh instance took to make.
        let memory = pooled.current().instance_cost().memory_bytes;
        let instantiation = fresh.current().instance_cost().instantiation;
        println!(
            "  {name:<16} {:>14.2} {:>16.2} {:>16.3} {:>14.2} MiB",
            pair[0],
            pair[1],
            instantiation.as_secs_f64() * 1e3,
            memory as f64 / f64::from(1 << 20)
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
