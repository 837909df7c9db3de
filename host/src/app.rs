//! The host process: from a checked config to consumers running, and back
//! down to a clean exit.
//!
//! Order matters for operators: everything that can be checked without a
//! broker (config, topology, retry policies, plugins) is checked first, so a
//! bad deploy fails before it connects, declares or consumes anything.

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::admin::health::Readiness;
use crate::broker::checkpoint::{BrokerCheckpoint, Cadence, Checkpoint, FileCheckpoint};
use crate::broker::stream::{StreamOffset, StreamPosition};
use crate::broker::stream_protocol::StreamEndpoints;
use crate::broker::{
    Addresses, Board, Link, OnConnected, OneOff, PublishLink, PublishSettings, Recovery,
    SubscriptionEnv, SubscriptionSpec, Tls, resubscribe,
};
use crate::config::{ConsumerConfig, LoadedConfig, SchedulerConfig, StreamProtocol};
use crate::delivery::{self, ConsumerRules, Pipeline};
use crate::plugin::capacity::{self, ConsumerDemand};
use crate::plugin::swap::{CodecSpec, PluginSpec, Reloader};
use crate::plugin::{
    CacheChoice, CodecSet, CodecVersion, Codecs, ConsumerContext, EngineSettings, HandlerSlot,
    HandlerVersion, Limits, PluginEngine,
};
use crate::retry::RetryPolicy;
use crate::rollout::live::Rollouts;
use crate::rollout::plan::Plan;
use crate::rollout::record::Records;
use crate::scheduler::control::Control;
use crate::service::liveness::{Heartbeat, Watchdog};
use crate::service::notify::Notifier;
use crate::state::consumer::{Claims, ConsumerState};
use crate::state::embedded::Opener;
use crate::state::{Backend, NamespaceAccess, Store, StoreHealth};
use crate::telemetry::{Metrics, NamespaceLabel, PluginVersionLabels, StateMetrics};
use crate::topology::{self, Topology};

/// Everything checked and loaded, ready to connect.
pub struct Prepared {
    pub config: LoadedConfig,
    pub topology: Topology,
    pub engine: Arc<PluginEngine>,
    /// Codecs shared by every consumer, in config order.
    pub codecs: Arc<Codecs>,
    pub consumers: Vec<PreparedConsumer>,
    /// The admin endpoint's settings (token read); none without `admin_listen`.
    pub admin: Option<crate::admin::Settings>,
    /// What each consumer's subscription is doing (for `/health`, and for
    /// whoever started the host to see it serving).
    pub board: Arc<Board>,
    /// Where spans are exported (nowhere unless configured).
    pub tracer: Arc<crate::trace::Tracer>,
    /// The state store, when a consumer keeps state or done records, and
    /// its health for `/health`.
    pub store: Option<(Arc<Store>, Arc<StoreHealth>)>,
}

/// One consumer: what it subscribes to, and what its pipeline runs.
pub struct PreparedConsumer {
    pub subscription: SubscriptionSpec,
    pub rules: ConsumerRules,
    pub handler: Arc<HandlerSlot>,
    pub plugin_path: std::path::PathBuf,
    /// Its namespace, done records and claims, if it keeps any.
    pub state: Option<Arc<ConsumerState>>,
    /// The rollout `[consumers.candidate]` asks for, its candidate loaded.
    pub rollout: Option<(Plan, Arc<HandlerVersion>)>,
    /// How a stream consumer asks to read (decided once the broker is
    /// reached: [`choose_stream_paths`]).
    pub stream_protocol: StreamProtocol,
}

/// Checks the config, builds the topology, opens the state store and loads
/// every plugin, without touching the network. Every problem found is
/// reported at once (each led by `file:line` where it has one), so one run
/// shows everything to fix. `metrics` is the registry the host will run
/// with (the state store's users count on it from the start).
pub fn prepare(config: LoadedConfig, metrics: &Metrics) -> anyhow::Result<Prepared> {
    prepare_with(config, Some(metrics.state.clone()))
}

/// [`prepare`] for `validate`: everything but the state store, which is
/// neither created nor opened (a running host may hold it).
pub fn prepare_to_validate(config: LoadedConfig) -> anyhow::Result<Prepared> {
    prepare_with(config, None)
}

/// [`prepare`], opening the state store with `state` its series, or not
/// opening it.
fn prepare_with(config: LoadedConfig, state: Option<StateMetrics>) -> anyhow::Result<Prepared> {
    // Only a host about to run opens the store (`validate` does not).
    let running = state.is_some();
    let mut problems: Vec<String> = Vec::new();
    let mut note = |e: anyhow::Error| problems.push(format!("{e:#}"));
    let topology = Topology::from_config(&config.config)
        .map_err(|found| {
            note(anyhow::anyhow!(
                "{}: {}",
                config.path.display(),
                found.located_in(&config)
            ))
        })
        .ok();
    let admin = crate::admin::Settings::from_config(&config)
        .map_err(|e| note(e.into()))
        .ok()
        .flatten();
    let untrusted = check_plugin_paths(&config);
    let trusted = untrusted.is_empty();
    untrusted.into_iter().for_each(&mut note);
    // Plugins are loaded only from paths that passed the check.
    let engine = Arc::new(PluginEngine::new(engine_settings(&config))?);
    let codecs = if trusted {
        load_codecs(&config, &engine).map_err(&mut note).ok()
    } else {
        None
    };
    let store = match &state {
        Some(_) => open_store(&config).map_err(&mut note).ok().flatten(),
        None => None,
    };
    let store = store.map(|store| (store, Arc::new(StoreHealth::default())));
    let state = StateSetup {
        store: store.clone(),
        metrics: state.unwrap_or_default(),
        holder: claim_holder(),
    };
    // A host about to run applies what its rollouts' records say; `validate`
    // reads none and writes none.
    let records = running.then(|| rollout_records(&config)).flatten();
    let mut consumers = Vec::new();
    if let (Some(topology), true) = (&topology, trusted) {
        for (index, consumer) in config.config.consumers.iter().enumerate() {
            let prepared = prepare_consumer(&config, topology, &engine, &state, index, consumer)
                .map(|prepared| match &records {
                    Some(records) => apply_record(&engine, records, prepared),
                    None => prepared,
                });
            match prepared {
                Ok(prepared) => consumers.push(prepared),
                Err(e) => note(e),
            }
        }
    }
    // Here, before any runtime: the exporter's HTTP client is a blocking one.
    let tracer = crate::trace::Tracer::from_config(&config.config.tracing)
        .map_err(|e| note(anyhow::anyhow!("{}: {e:#}", config.path.display())))
        .ok();
    let (Some(topology), Some(codecs), Some(tracer), true) =
        (topology, codecs, tracer, problems.is_empty())
    else {
        anyhow::bail!("{}", problems.join("\n"));
    };
    warn_of_unknown_exchanges(&config, &topology);
    warn_of_replica_arguments(&config);
    let codecs = Arc::new(Codecs::new(codecs));
    let tracer = Arc::new(tracer);
    if let Some(endpoint) = tracer.endpoint() {
        tracing::info!(endpoint, "exporting spans over OTLP");
    }
    let board = Arc::new(Board::default());
    for consumer in &consumers {
        board.expect(&consumer.subscription.queue);
    }
    // The scheduler's control consumer counts for `/health` like any other.
    if config.config.scheduler_enabled() {
        board.expect(crate::scheduler::DUE_QUEUE);
    }
    Ok(Prepared {
        config,
        topology,
        engine,
        codecs,
        consumers,
        admin,
        board,
        tracer,
        store,
    })
}

/// The state store's upkeep while the host runs: the embedded store's
/// sweep of what expired, every namespace's usage for `/metrics`, and a
/// probe of the store for `/health` (its usage, or a done record's check
/// when no consumer has a namespace).
fn spawn_store_upkeep(
    store: Arc<Store>,
    health: Arc<StoreHealth>,
    metrics: &Arc<Metrics>,
    config: &LoadedConfig,
    shutdown: CancellationToken,
) {
    let namespaces: BTreeSet<String> = config
        .config
        .consumers
        .iter()
        .filter_map(|c| c.state.as_ref().map(|n| n.get_ref().clone()))
        .collect();
    let state = metrics.state.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(crate::state::embedded::SWEEP_EVERY);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            let now_ms = crate::envelope::now_ms();
            if let Store::Embedded(embedded) = &*store {
                embedded.sweep(now_ms);
            }
            if namespaces.is_empty() {
                let probe = crate::state::InputKey {
                    queue: "-".into(),
                    id: "-".into(),
                };
                health.note(&store.is_done(&probe, now_ms).await);
            }
            for namespace in &namespaces {
                let usage = store.usage(namespace, now_ms).await;
                health.note(&usage);
                match usage {
                    Ok(usage) => {
                        let label = NamespaceLabel {
                            namespace: namespace.clone(),
                        };
                        state.keys.get_or_create(&label).set(usage.keys as i64);
                        state.bytes.get_or_create(&label).set(usage.bytes as i64);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the state store's usage could not be read")
                    }
                }
            }
        }
    });
}

/// What consumers with state are given.
struct StateSetup {
    store: Option<(Arc<Store>, Arc<StoreHealth>)>,
    metrics: StateMetrics,
    /// This host's name on its claims.
    holder: Arc<str>,
}

/// Opens the state store when a consumer needs one: the embedded file
/// (refused when another host holds it), or a Redis client (which connects
/// on first use and again after any failure).
fn open_store(config: &LoadedConfig) -> anyhow::Result<Option<Arc<Store>>> {
    if !config.state_needed() {
        return Ok(None);
    }
    let location = config.store_location();
    // The error names the store, and the key when one is at fault.
    let store = crate::state::open(&location, Opener::Host)
        .map_err(|e| anyhow::anyhow!("{}: [state]: {e}", config.path.display()))?;
    tracing::info!(store = %store.describe(), "state store opened");
    Ok(Some(Arc::new(store)))
}

/// The name this host's claims carry: its host name, process and a random
/// part, so that a restarted process never takes its predecessor's claims
/// for its own.
fn claim_holder() -> Arc<str> {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let random = uuid::Uuid::new_v4().simple().to_string();
    Arc::from(format!("{host}:{}:{}", std::process::id(), &random[..8]))
}

/// Loads the config's `[[codecs]]`, in order: for the host, and for a
/// shadow replay, which must decode as production does.
pub(crate) fn load_codecs(
    config: &LoadedConfig,
    engine: &PluginEngine,
) -> anyhow::Result<CodecSet> {
    let mut codecs = CodecSet::new();
    for (index, codec) in config.config.codecs.iter().enumerate() {
        if codec.content_types.is_empty() {
            return Err(config
                .error_at(
                    Some(codec.plugin.span().start),
                    format!("codecs[{index}].content_types: must name at least one content type"),
                )
                .into());
        }
        let path = config.resolve(codec.plugin.get_ref());
        let version = CodecVersion::load(engine, &path, Limits::default())
            .with_context(|| format!("codecs[{index}]"))?;
        tracing::info!(plugin = %path.display(), sha256 = %version.sha256, content_types = ?codec.content_types, "codec loaded");
        codecs.add(&codec.content_types, version);
    }
    Ok(codecs)
}

/// Refuses, before anything is loaded, a plugin file, its folder or any
/// folder above it that another user, or anyone but its owner, could write:
/// they could choose the code the host runs (hot swap picks up a replaced
/// file within a second). Hot swap checks a handler's again before every
/// reload (plugin/swap.rs).
fn check_plugin_paths(config: &LoadedConfig) -> Vec<anyhow::Error> {
    let c = &config.config;
    let handlers = c.consumers.iter().map(|consumer| &consumer.plugin);
    let candidates = c
        .consumers
        .iter()
        .filter_map(|consumer| consumer.candidate.as_ref())
        .map(|candidate| &candidate.plugin);
    let codecs = c.codecs.iter().map(|codec| &codec.plugin);
    handlers
        .chain(candidates)
        .chain(codecs)
        .filter_map(|plugin| {
            crate::fs_trust::check_plugin(&config.resolve(plugin.get_ref()))
                .map_err(|e| {
                    config
                        .error_at(Some(plugin.span().start), e.to_string())
                        .into()
                })
                .err()
        })
        .collect()
}

/// Warns of each `publish_to` exchange the config does not declare: a typo
/// there fails every output at run time ("reached no exchange"), unless
/// another service declares it. `amq.*` exchanges always exist.
fn warn_of_unknown_exchanges(config: &LoadedConfig, topology: &Topology) {
    for (index, consumer) in config.config.consumers.iter().enumerate() {
        for exchange in &consumer.publish_to {
            if exchange.is_empty()
                || exchange.starts_with("amq.")
                || topology.exchange(exchange).is_some()
            {
                continue;
            }
            let at = config.error_at(
                Some(consumer.queue.span().start),
                format!(
                    "consumers[{index}].publish_to names exchange '{exchange}', which this config does not declare; outputs to it fail unless another service declares it"
                ),
            );
            tracing::warn!("{at}");
        }
    }
}

/// Warns of each queue whose `replicas` is set: the argument it sends
/// becomes part of the queue's identity, and the broker refuses any later
/// declaration without it (`PRECONDITION_FAILED - inequivalent arg
/// 'x-quorum-initial-group-size'`), which is how every AceMQ library
/// declares the queue. Unset, nothing is sent and the broker puts a replica
/// on every node.
fn warn_of_replica_arguments(config: &LoadedConfig) {
    for queue in &config.config.queues {
        if let Some(replicas) = queue.replicas {
            let at = config.error_at(
                None,
                format!(
                    "queue '{}' sets replicas = {replicas}: the broker then refuses every declaration of it without the same argument, as the AceMQ libraries declare it; leave replicas unset for a queue they declare too",
                    queue.name
                ),
            );
            tracing::warn!("{at}");
        }
    }
}

/// Every exchange the host may publish to by its config: the declared ones
/// (with the contract's `acemq.retry` and `acemq.dlx`) and each consumer's
/// `publish_to`.
fn configured_exchanges(config: &LoadedConfig, topology: &Topology) -> Vec<String> {
    let declared = topology.exchanges.iter().map(|e| e.name.clone());
    let allowed = config
        .config
        .consumers
        .iter()
        .flat_map(|c| c.publish_to.iter().cloned());
    declared.chain(allowed).collect()
}

pub fn engine_settings(config: &LoadedConfig) -> EngineSettings {
    let consumers = &config.config.consumers;
    let host = &config.config.host;
    // Every instance that can be alive at once, handlers' and codecs'
    // (plugin/capacity.rs). A stream consumer's default concurrency is
    // lower; the larger one bounds it.
    let demand: Vec<ConsumerDemand> = consumers
        .iter()
        .map(|c| ConsumerDemand {
            concurrency: config.concurrency_of(c, false),
            shadow: c
                .candidate
                .as_ref()
                .and_then(|candidate| candidate.shadow_concurrency)
                .unwrap_or(0),
        })
        .collect();
    // Codecs run under the default limits (load_codecs), so their budget
    // bounds the pool's memory slots as much as any consumer's does.
    let codec_budget =
        (!config.config.codecs.is_empty()).then(|| Limits::default().max_memory_bytes);
    EngineSettings {
        max_instances: capacity::instance_slots(&demand, config.config.codecs.len()),
        max_memory_bytes: consumers
            .iter()
            .map(|c| c.max_memory_bytes)
            .chain(codec_budget)
            .max()
            .unwrap_or(64 << 20),
        cache: match (&host.plugin_cache_dir, host.caches_plugins()) {
            (_, false) => CacheChoice::Off,
            (Some(dir), true) => CacheChoice::Folder(config.resolve(dir)),
            (None, true) => CacheChoice::UserDefault,
        },
        cache_key_file: host
            .plugin_cache_key_file
            .as_ref()
            .map(|key| config.resolve(key.get_ref())),
        fuel_metering: host.fuel_metering,
    }
}

fn prepare_consumer(
    config: &LoadedConfig,
    topology: &Topology,
    engine: &PluginEngine,
    state: &StateSetup,
    index: usize,
    consumer: &ConsumerConfig,
) -> anyhow::Result<PreparedConsumer> {
    let queue = consumer.queue.get_ref().clone();
    let policy = retry_policy(config, index, consumer)?;
    let (namespace, consumer_state) = consumer_state(config, state, consumer);
    let context = consumer_context(consumer, &config.config.scheduler, namespace);
    let stream = stream_position(config, topology, index, consumer)?;
    let is_stream = stream.is_some();
    let plugin_path = config.resolve(consumer.plugin.get_ref());
    let version = HandlerVersion::load(engine, &plugin_path, context.clone())
        .with_context(|| format!("consumers[{index}] (queue '{queue}')"))?;
    tracing::info!(
        queue = %queue,
        plugin = %plugin_path.display(),
        sha256 = %version.sha256,
        from_cache = version.from_cache,
        "plugin loaded"
    );
    let rollout = match config.rollout_plan(index, consumer)? {
        Some(plan) => {
            let candidate = crate::rollout::live::load_candidate(engine, &plan, &context)
                .with_context(|| format!("consumers[{index}].candidate (queue '{queue}')"))?;
            tracing::info!(queue = %queue, candidate = %plan.candidate.display(), sha256 = %candidate.sha256, mode = %plan.mode, "rollout candidate loaded");
            Some((plan, candidate))
        }
        None => None,
    };
    Ok(PreparedConsumer {
        subscription: SubscriptionSpec {
            queue,
            prefetch: consumer.prefetch_for(is_stream),
            concurrency: config.concurrency_of(consumer, is_stream),
            ends_after: None,
            stream,
            consumer_tag: consumer.consumer_name.clone(),
            // Chosen once the broker is reached (choose_stream_paths).
            stream_protocol: None,
        },
        rules: ConsumerRules {
            policy,
            max_body_bytes: consumer.max_body_bytes,
            mandatory_outputs: consumer.mandatory_outputs,
        },
        handler: Arc::new(HandlerSlot::new(version)),
        plugin_path,
        state: consumer_state,
        rollout,
        stream_protocol: consumer.stream_protocol,
    })
}

/// What the consumer's rollout record says, applied before it consumes,
/// when no candidate is configured (a rollout started through the admin
/// endpoint): a promotion stands (the candidate, if its file still holds the
/// bytes promoted, serves as the version), and a rollout that was under way
/// is abandoned (its plan was the request's, which a restart does not keep).
/// A configured candidate's record is `Rollouts::configured`'s.
fn apply_record(
    engine: &PluginEngine,
    records: &Records,
    mut prepared: PreparedConsumer,
) -> PreparedConsumer {
    use crate::rollout::record::Status;
    let queue = prepared.subscription.queue.clone();
    let current = prepared.handler.current();
    let Some(mut record) = prepared
        .rollout
        .is_none()
        .then(|| records.load(&queue))
        .flatten()
        .filter(|record| record.current == *current.sha256)
    else {
        return prepared;
    };
    match record.status {
        Status::Promoted => {
            let path = record.candidate_path.clone();
            let loaded = crate::fs_trust::check_plugin(&path)
                .map_err(|refused| refused.to_string())
                .and_then(|()| {
                    HandlerVersion::load(engine, &path, current.context().clone())
                        .map_err(|e| e.to_string())
                })
                .and_then(|version| {
                    if *version.sha256 == record.candidate {
                        Ok(version)
                    } else {
                        Err(format!(
                            "it holds other bytes now (SHA-256 {})",
                            version.sha256
                        ))
                    }
                });
            match loaded {
                Ok(version) => {
                    tracing::info!(queue = %queue, candidate = %path.display(), sha256 = %version.sha256, "the candidate promoted before this start serves as the version (set plugin = to it in the config)");
                    prepared.handler = Arc::new(HandlerSlot::new(version));
                    prepared.plugin_path = path;
                }
                Err(why) => {
                    tracing::warn!(queue = %queue, candidate = %path.display(), reason = %why, "the candidate promoted before this start cannot serve; the configured plugin does");
                }
            }
        }
        Status::Running { .. } => {
            record.status = Status::Abandoned;
            record.reason = Some(
                "the host restarted during it; a rollout started through the admin endpoint is not resumed: start it again".to_string(),
            );
            tracing::warn!(queue = %queue, candidate = %record.candidate_path.display(), "a rollout started through the admin endpoint was under way when the host stopped; it is abandoned (start it again)");
            let _ = records.save(&record);
        }
        _ => {}
    }
    prepared
}

/// A consumer's namespace, as its plugin reaches it, and its use of the
/// store on the delivery path; neither without `state` or `idempotent`.
fn consumer_state(
    config: &LoadedConfig,
    setup: &StateSetup,
    consumer: &ConsumerConfig,
) -> (Option<Arc<NamespaceAccess>>, Option<Arc<ConsumerState>>) {
    let Some((store, health)) = &setup.store else {
        return (None, None);
    };
    let namespace = consumer.state.as_ref().map(|n| n.get_ref().clone());
    if namespace.is_none() && !consumer.idempotent {
        return (None, None);
    }
    let access = namespace.as_ref().map(|namespace| {
        Arc::new(NamespaceAccess {
            store: store.clone(),
            namespace: namespace.clone(),
            metrics: setup.metrics.clone(),
        })
    });
    let quota = config
        .config
        .state
        .quota(namespace.as_deref().unwrap_or_default());
    let claims = consumer.idempotent.then(|| Claims {
        holder: setup.holder.clone(),
        lease: consumer.claim_lease,
    });
    let state = ConsumerState::new(
        store.clone(),
        consumer.queue.get_ref(),
        namespace,
        quota,
        consumer.done_retention,
        claims,
        setup.metrics.clone(),
        health.clone(),
    );
    (access, Some(Arc::new(state)))
}

/// The consumer's `retry` policy, or the contract's default, none(): a
/// retry dead-letters.
fn retry_policy(
    config: &LoadedConfig,
    index: usize,
    consumer: &ConsumerConfig,
) -> anyhow::Result<RetryPolicy> {
    let Some(name) = &consumer.retry else {
        return Ok(RetryPolicy::none());
    };
    let policy_config = &config.config.retry[name.get_ref()];
    RetryPolicy::from_config(name.get_ref(), policy_config).map_err(|e| {
        let at = Some(name.span().start);
        anyhow::Error::from(config.error_at(at, format!("consumers[{index}].retry: {e}")))
    })
}

/// Where a stream consumer reads from, with its checkpoint and lease;
/// `None` for a consumer of a queue.
fn stream_position(
    config: &LoadedConfig,
    topology: &Topology,
    index: usize,
    consumer: &ConsumerConfig,
) -> anyhow::Result<Option<Arc<StreamPosition>>> {
    let queue = consumer.queue.get_ref();
    // A stream declared in this config; a stream declared elsewhere is one
    // when the consumer names an offset.
    let is_stream = topology
        .queue(queue)
        .is_some_and(|q| q.queue_type == crate::topology::QueueType::Stream);
    let offset = match &consumer.offset {
        Some(offset) if !is_stream && topology.queue(queue).is_some() => {
            return Err(config
                .error_at(
                    Some(offset.span().start),
                    format!("consumers[{index}].offset: queue '{queue}' is declared here as a queue, not a stream; an offset is for stream consumers"),
                )
                .into());
        }
        // Checked when the config was read.
        Some(offset) => Some(offset.get_ref().parse().map_err(|e| anyhow::anyhow!(e))?),
        None => is_stream.then_some(StreamOffset::Next),
    };
    let checkpoint = stream_checkpoint(config, index, consumer, is_stream || offset.is_some())?;
    if checkpoint.is_some() && offset.is_none() {
        let at = consumer.checkpoint.as_ref().map(|c| c.span().start);
        return Err(config
            .error_at(at, format!("consumers[{index}].checkpoint: only a stream consumer keeps a checkpoint; declare '{queue}' as a stream here or give the consumer an offset"))
            .into());
    }
    Ok(offset.map(|offset| {
        let mut position = StreamPosition::new(offset);
        if let Some(checkpoint) = checkpoint {
            position = position.with_checkpoint(checkpoint);
        }
        // A consumer name is one reader: across hosts, one at a time.
        if let Some(name) = &consumer.consumer_name {
            position = position.with_lease(name);
        }
        Arc::new(position)
    }))
}

/// The stream listeners of the configured brokers, for connections named
/// `{connection_name}.{purpose}`; why they cannot be used, when they cannot.
pub fn stream_endpoints(
    config: &LoadedConfig,
) -> anyhow::Result<Result<Arc<StreamEndpoints>, String>> {
    let urls = config.broker_urls()?;
    let tls = match config
        .tls_settings()
        .map(|settings| Tls::new(&settings))
        .transpose()
    {
        Ok(tls) => tls,
        Err(e) => return Ok(Err(format!("broker.tls: {e}"))),
    };
    Ok(StreamEndpoints::new(
        &urls,
        config.config.broker.stream_port,
        tls,
        config.config.broker.connection_name.clone(),
    )
    .map(Arc::new)
    .map_err(|e| e.to_string()))
}

/// Whether the broker offers the stream protocol to this configuration.
pub enum StreamOffer {
    /// Its listener answered.
    Answered(Arc<StreamEndpoints>),
    /// Its listener did not answer (why): the plugin is not enabled, or the
    /// broker is down.
    Silent(Arc<StreamEndpoints>, String),
    /// The configuration cannot use it: its TLS files cannot be loaded (why).
    Unusable(String),
}

/// Asks the configured brokers' stream listener once.
pub async fn stream_offer(config: &LoadedConfig) -> anyhow::Result<StreamOffer> {
    Ok(match stream_endpoints(config)? {
        Err(why) => StreamOffer::Unusable(why),
        Ok(endpoints) => match crate::broker::stream_protocol::offered(&endpoints).await {
            Ok(()) => StreamOffer::Answered(endpoints),
            Err(why) => StreamOffer::Silent(endpoints, why),
        },
    })
}

/// Decides, once the broker is reached, how each stream consumer reads: over
/// the stream protocol when it asks for it (`stream`), or when it leaves the
/// choice to the host (`auto`) and the stream listener answers; over AMQP
/// 0-9-1 otherwise. Each choice is logged with its reason. A consumer that
/// asks for the stream protocol with TLS settings its client cannot honour
/// fails the start; one whose listener does not answer yet keeps trying, as
/// for a broker that is down.
///
/// On the stream protocol a named consumer's checkpoint is the broker's
/// offset tracking; the checkpoint it was configured with (the queue
/// `acemq.checkpoint.{name}` by default, or a file) is read while the broker
/// tracks no offset for it yet.
async fn choose_stream_paths(
    config: &LoadedConfig,
    consumers: &mut [PreparedConsumer],
    metrics: &Metrics,
) -> anyhow::Result<()> {
    let chosen = choose_stream_protocols(config, consumers).await;
    for consumer in consumers.iter() {
        if consumer.subscription.stream.is_some() {
            let protocol = match consumer.subscription.stream_protocol {
                Some(_) => "stream",
                None => "amqp",
            };
            metrics
                .stream_protocol
                .get_or_create(&crate::telemetry::StreamProtocolLabels {
                    queue: consumer.subscription.queue.clone(),
                    protocol,
                })
                .set(1);
        }
    }
    chosen
}

/// [`choose_stream_paths`]' choices.
async fn choose_stream_protocols(
    config: &LoadedConfig,
    consumers: &mut [PreparedConsumer],
) -> anyhow::Result<()> {
    let mut wanting: Vec<&mut PreparedConsumer> = consumers
        .iter_mut()
        .filter(|c| c.subscription.stream.is_some())
        .filter(|c| c.stream_protocol != StreamProtocol::Amqp)
        .collect();
    if wanting.is_empty() {
        return Ok(());
    }
    let offer = stream_offer(config).await?;
    for consumer in wanting.iter_mut() {
        let queue = consumer.subscription.queue.clone();
        let setting = consumer.stream_protocol.word();
        let only_stream = consumer.stream_protocol == StreamProtocol::Stream;
        let endpoints = match &offer {
            StreamOffer::Answered(endpoints) => endpoints.clone(),
            StreamOffer::Silent(endpoints, why) if only_stream => {
                tracing::warn!(queue = %queue, error = %why, "the stream listener does not answer yet; this consumer reads over the stream protocol only (stream_protocol = \"stream\") and keeps trying");
                endpoints.clone()
            }
            StreamOffer::Unusable(why) if only_stream => anyhow::bail!(
                "{}: consumer of '{queue}': stream_protocol = \"stream\", but {why}",
                config.path.display()
            ),
            StreamOffer::Silent(_, why) | StreamOffer::Unusable(why) => {
                tracing::info!(queue = %queue, protocol = "amqp", setting, reason = %why, "this stream consumer reads over AMQP 0-9-1: the stream protocol is not available");
                continue;
            }
        };
        tracing::info!(queue = %queue, protocol = "stream", setting, listener = %endpoints.shown(), "this stream consumer reads over the stream protocol");
        use_stream_protocol(consumer, endpoints);
    }
    Ok(())
}

/// Moves `consumer` to the stream protocol, with the broker's offset
/// tracking as a named consumer's checkpoint.
fn use_stream_protocol(consumer: &mut PreparedConsumer, endpoints: Arc<StreamEndpoints>) {
    let subscription = &mut consumer.subscription;
    subscription.stream_protocol = Some(endpoints.clone());
    let (Some(name), Some(position)) = (&subscription.consumer_tag, &mut subscription.stream)
    else {
        return;
    };
    let position =
        Arc::get_mut(position).expect("a stream position is not shared before its consumer starts");
    position.replace_checkpoint(|earlier| {
        Checkpoint::Tracked(
            crate::broker::stream_protocol::tracking::TrackedCheckpoint::new(
                name,
                &subscription.queue,
                endpoints,
                earlier.cadence(),
                Some(earlier),
            ),
        )
    });
}

/// What a consumer's handler may see and do: its queue, its config table,
/// the exchanges it may publish to, its limits.
pub fn consumer_context(
    consumer: &ConsumerConfig,
    scheduler: &SchedulerConfig,
    state: Option<Arc<NamespaceAccess>>,
) -> Arc<ConsumerContext> {
    Arc::new(ConsumerContext {
        queue: consumer.queue.get_ref().clone(),
        config: consumer.config.clone(),
        publish_to: consumer.publish_to.iter().cloned().collect::<BTreeSet<_>>(),
        delayed: consumer.publish_delayed.then_some(scheduler.max_delay),
        state,
        limits: Limits {
            deadline: consumer.deadline,
            max_memory_bytes: consumer.max_memory_bytes,
            max_outputs: consumer.max_outputs(),
            isolation: consumer.isolation,
            ..Limits::default()
        },
    })
}

/// The checkpoint `[[consumers]] checkpoint` asks for: `"file:PATH"`,
/// `"broker"` (the default for a stream consumer with a `consumer_name`),
/// or `"none"`.
pub(crate) fn stream_checkpoint(
    config: &LoadedConfig,
    index: usize,
    consumer: &ConsumerConfig,
    is_stream: bool,
) -> anyhow::Result<Option<Checkpoint>> {
    let cadence = Cadence {
        every: consumer.checkpoint_every.max(1),
        interval: consumer.checkpoint_interval,
    };
    let named = consumer.consumer_name.as_deref();
    let at = consumer.checkpoint.as_ref().map(|c| c.span().start);
    let text = match &consumer.checkpoint {
        Some(setting) => setting.get_ref().trim().to_string(),
        None if is_stream && named.is_some() => "broker".to_string(),
        None => return Ok(None),
    };
    if text == "none" {
        return Ok(None);
    }
    if text == "broker" {
        let Some(name) = named else {
            return Err(config
                .error_at(at, format!("consumers[{index}].checkpoint: a checkpoint kept in the broker needs a consumer_name, which names it"))
                .into());
        };
        return Ok(Some(Checkpoint::Broker(BrokerCheckpoint::new(
            name, cadence,
        ))));
    }
    match text.strip_prefix("file:") {
        Some(path) if !path.trim().is_empty() => Ok(Some(Checkpoint::File(FileCheckpoint::new(
            config.resolve(std::path::Path::new(path.trim())),
            cadence,
        )))),
        _ => Err(config
            .error_at(
                at,
                format!("consumers[{index}].checkpoint: {text:?} is not a checkpoint: use \"broker\", \"file:PATH\" or \"none\""),
            )
            .into()),
    }
}

/// The configured broker addresses, with their TLS, for connections named
/// `{connection_name}.{role}`.
pub fn broker_addresses(config: &LoadedConfig, role: &str) -> anyhow::Result<Addresses> {
    let tls = config
        .tls_settings()
        .map(|settings| Tls::new(&settings))
        .transpose()
        .map_err(|e| anyhow::anyhow!("{}: broker.tls: {e}", config.path.display()))?;
    let name = format!("{}.{role}", config.config.broker.connection_name);
    Ok(Addresses::new(config.broker_urls()?, name).with_tls(tls))
}

/// The connection of a one-off command (`dlq`, `replay`, `stream reset`):
/// one round over the configured addresses, each attempt bounded by
/// `connect_timeout`.
pub async fn connect_once(config: &LoadedConfig, role: &'static str) -> anyhow::Result<OneOff> {
    let addresses = broker_addresses(config, role)?;
    Ok(OneOff::open(role, addresses, config.config.broker.connect_timeout).await?)
}

/// Runs the host until `shutdown` is cancelled, in four phases: start the
/// links ([`Links::start`]), start the consumers ([`start_consumers`]),
/// serve until they have drained ([`serve`]), shut down ([`shut_down`]).
///
/// Once started, nothing the broker does ends it: the two connections are
/// kept up by their links (`broker::link`), and each consumer is kept
/// subscribed on its own (`broker::resubscribe`). Only a start that cannot
/// succeed (refused credentials, a refused topology, no broker within
/// `connect_timeout`) returns an error.
pub async fn run(
    prepared: Prepared,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
) -> anyhow::Result<()> {
    let Prepared {
        config,
        topology,
        engine,
        codecs,
        consumers,
        admin,
        board,
        tracer,
        store,
    } = prepared;
    // Liveness first: the runtime's heartbeat and the thread that watches
    // it (and feeds systemd's watchdog) cover the whole run.
    let notifier = Arc::new(Notifier::new());
    let heartbeat = Heartbeat::new();
    let beat_stop = CancellationToken::new();
    heartbeat.spawn_beat(beat_stop.clone());
    tokio::spawn(sample_activity(metrics.clone(), beat_stop.clone()));
    let _watchdog = Watchdog::spawn(
        heartbeat.clone(),
        notifier.clone(),
        Notifier::watchdog_interval(),
    )
    .inspect_err(|e| tracing::warn!(error = %e, "cannot start the liveness watchdog thread"))
    .ok();
    if let Some((store, health)) = &store {
        spawn_store_upkeep(
            store.clone(),
            health.clone(),
            &metrics,
            &config,
            shutdown.clone(),
        );
    }
    // Publish series are labelled by exchange only for the exchanges the
    // config names (a routing slip names its next exchange: the producer's
    // choice).
    metrics.label_exchanges(configured_exchanges(&config, &topology));
    // Hot swap and the admin endpoint (plugin/swap.rs, admin/). The admin
    // address is bound first, so one in use fails the start before anything
    // is declared or consumed.
    let admin_bound = match admin {
        Some(settings) => Some(crate::admin::bind(settings).await?),
        None => None,
    };
    let rollout_engine = engine.clone();
    let codec_specs: Vec<CodecSpec> = config
        .config
        .codecs
        .iter()
        .enumerate()
        .map(|(index, codec)| CodecSpec {
            path: config.resolve(codec.plugin.get_ref()),
            index,
            codecs: codecs.clone(),
            // As load_codecs loaded them.
            limits: Limits::default(),
        })
        .collect();
    let reloader = Arc::new(
        Reloader::new(
            engine,
            metrics.clone(),
            consumers.iter().map(|c| PluginSpec {
                queue: c.subscription.queue.clone(),
                path: c.plugin_path.clone(),
                slot: c.handler.clone(),
            }),
        )
        .with_codecs(codec_specs),
    );
    // Each consumer's rollout slot, registered before the admin endpoint
    // answers for them.
    let mut rollouts = Rollouts::new(rollout_engine, rollout_records(&config), metrics.clone(), {
        let reloader = reloader.clone();
        Arc::new(move |queue: &str, path: &std::path::Path| reloader.set_path(queue, path))
    });
    let rollout_slots: Vec<_> = consumers
        .iter()
        .map(|c| {
            rollouts.add(
                &c.subscription.queue,
                c.handler.clone(),
                c.subscription.concurrency,
            )
        })
        .collect();
    let rollouts = Arc::new(rollouts);
    let links = Links::new(&config, Arc::new(topology), &metrics)?;
    // The admin endpoint answers from now on: DOWN, with what the host is
    // waiting for, until it connects.
    let admin = AdminTask::spawn(
        admin_bound,
        crate::admin::Admin {
            reloader: reloader.clone(),
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
            board: board.clone(),
            links: vec![links.consume.clone(), links.publish.clone()],
            store: store.as_ref().map(|(_, health)| health.clone()),
            heartbeat: heartbeat.clone(),
            started: std::time::SystemTime::now(),
            rollouts: rollouts.clone(),
        },
    );
    if let Err(e) = links.start(&shutdown).await {
        admin.stop().await;
        return Err(e);
    }
    let mut consumers = consumers;
    if let Err(e) = choose_stream_paths(&config, &mut consumers, &metrics).await {
        admin.stop().await;
        return Err(e);
    }
    // The links outlive the consumers: deliveries still draining at
    // shutdown publish and ack on them.
    let links_stop = CancellationToken::new();
    let supervisors = links.supervise(&links_stop);
    let shared = delivery::Shared {
        codecs,
        publish_link: PublishLink::new(
            links.publish.clone(),
            PublishSettings {
                max_unconfirmed: config.config.broker.max_unconfirmed,
                confirm_timeout: config.config.broker.confirm_timeout,
            },
            metrics.clone(),
        ),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
        tracer: tracer.clone(),
    };
    let env = SubscriptionEnv {
        shutdown: shutdown.clone(),
        drain_timeout: config.config.host.drain_timeout,
        board,
    };
    let scheduler = config.config.scheduler_enabled().then(|| {
        Arc::new(Control::new(
            shared.publish_link.clone(),
            metrics.clone(),
            shutdown.clone(),
        ))
    });
    let announcing = tokio::spawn(announce_to_service_manager(
        notifier.clone(),
        env.board.clone(),
        vec![links.consume.clone(), links.publish.clone()],
        shutdown.clone(),
    ));
    let (mut running, savers) = start_consumers(
        consumers,
        rollout_slots,
        &rollouts,
        &links,
        &shared,
        env.clone(),
        &links_stop,
    );
    if let Some(control) = scheduler {
        // The scheduler's control consumer, kept subscribed like any
        // consumer (and drained with them at shutdown).
        running.spawn(resubscribe::keep_subscribed(
            links.consume.clone(),
            Control::subscription(),
            env,
            links.apply_topology.clone(),
            move |received| control.clone().handle(received),
        ));
    }
    let reloads = serve(running, &reloader, &config, &shutdown).await;
    let background = supervisors.into_iter().chain(savers).collect();
    shut_down(reloads, admin, &links, links_stop, background, &tracer).await;
    announcing.abort();
    beat_stop.cancel();
    Ok(())
}

/// Where rollout records are kept: `[host] rollout_state_dir`, else the
/// user's cache folder; without either, rollouts are not kept across
/// restarts (said once).
fn rollout_records(config: &LoadedConfig) -> Option<Records> {
    let dir = match &config.config.host.rollout_state_dir {
        Some(dir) => Some(config.resolve(dir)),
        None => crate::user_cache::rollouts(),
    };
    if dir.is_none() {
        tracing::warn!(
            "rollout records are not kept: neither XDG_CACHE_HOME nor HOME is an absolute path (set [host] rollout_state_dir); a restart starts a rollout afresh"
        );
    }
    dir.map(Records::new)
}

/// Samples every consumer's counts for the status page's rates, until
/// `stop`.
async fn sample_activity(metrics: Arc<Metrics>, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(crate::telemetry::activity::SAMPLE_EVERY);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = ticks.tick() => metrics.activity.sample(std::time::Instant::now()),
        }
    }
}

/// Tells a service manager (systemd's `Type=notify`) that the host is
/// ready once it would answer `/health/ready` so (both connections up,
/// every consumer reading or standing by), and that it is stopping once
/// shutdown begins. Without `NOTIFY_SOCKET` it only logs that it is ready.
async fn announce_to_service_manager(
    notifier: Arc<Notifier>,
    board: Arc<Board>,
    links: Vec<Arc<Link>>,
    shutdown: CancellationToken,
) {
    let ready = async {
        loop {
            let phases: Vec<(&str, crate::broker::Phase)> =
                links.iter().map(|l| (l.role(), l.phase())).collect();
            let consumers = board.snapshot();
            if crate::admin::health::readiness(false, &phases, &consumers) == Readiness::Ready {
                return consumers.len();
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => {}
        consumers = ready => {
            tracing::info!(consumers, "ready: every consumer reads");
            notifier.ready(&format!("ready: {consumers} consumers reading"));
            shutdown.cancelled().await;
        }
    }
    notifier.stopping("stopping: finishing the deliveries in progress");
}

/// The host's two broker links. Two connections: a broker alarm blocks
/// publishing connections only, so acks keep flowing on the consume
/// connection while it lasts.
struct Links {
    consume: Arc<Link>,
    publish: Arc<Link>,
    recovery: Recovery,
    connect_timeout: std::time::Duration,
    topology: Arc<Topology>,
    /// The consume link applies the topology on each connection.
    apply_topology: OnConnected,
    nothing_to_set_up: OnConnected,
}

impl Links {
    fn new(
        config: &LoadedConfig,
        topology: Arc<Topology>,
        metrics: &Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let broker = &config.config.broker;
        let link = |role| {
            anyhow::Ok(Link::new(
                role,
                broker_addresses(config, role)?,
                metrics.clone(),
            ))
        };
        Ok(Self {
            consume: link("consume")?,
            publish: link("publish")?,
            recovery: Recovery {
                interval: broker.network_recovery_interval,
                backoff_max: broker.recovery_backoff_max,
                attempt_timeout: broker.connect_timeout,
            },
            connect_timeout: broker.connect_timeout,
            apply_topology: topology_hook(topology.clone()),
            topology,
            nothing_to_set_up: Arc::new(|_| Box::pin(async { Ok(()) })),
        })
    }

    /// The first connections: the consume link's, which applies the
    /// topology, then the publish link's. A shutdown meanwhile is no error.
    async fn start(&self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        let started = async {
            self.consume
                .connect_first(&self.recovery, &self.apply_topology, self.connect_timeout)
                .await?;
            tracing::info!(
                exchanges = self.topology.exchanges.len(),
                queues = self.topology.queues.len(),
                bindings = self.topology.bindings.len(),
                "topology applied"
            );
            self.publish
                .connect_first(
                    &self.recovery,
                    &self.nothing_to_set_up,
                    self.connect_timeout,
                )
                .await
        };
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => Ok(()),
            started = started => started,
        }
    }

    /// Keeps both links up until `stop` is cancelled.
    fn supervise(&self, stop: &CancellationToken) -> [JoinHandle<()>; 2] {
        [
            tokio::spawn(self.consume.clone().supervise(
                self.recovery.clone(),
                self.apply_topology.clone(),
                stop.clone(),
            )),
            tokio::spawn(self.publish.clone().supervise(
                self.recovery.clone(),
                self.nothing_to_set_up.clone(),
                stop.clone(),
            )),
        ]
    }

    /// Closes both connections at once, each waiting at most `limit` for
    /// the broker's confirmation.
    async fn close(&self, limit: std::time::Duration) {
        let closing = [&self.consume, &self.publish].map(|link| async move {
            let Some(connection) = link.state().connection else {
                return;
            };
            let close = connection.close(200, "acemq-host stopped".into());
            match tokio::time::timeout(limit, close).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(connection = link.role(), error = %e, "closing the connection")
                }
                Err(_) => tracing::warn!(
                    connection = link.role(),
                    "the broker did not confirm the close in time"
                ),
            }
        });
        futures::future::join_all(closing).await;
    }
}

/// The admin endpoint's task, when it has one, and what stops it.
struct AdminTask {
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl AdminTask {
    fn spawn(bound: Option<crate::admin::Bound>, admin: crate::admin::Admin) -> Self {
        let stop = CancellationToken::new();
        let task = bound.map(|bound| crate::admin::spawn(bound, Arc::new(admin), stop.clone()));
        Self { stop, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        if let Some(task) = self.task {
            let _ = task.await;
        }
    }
}

/// Starts every consumer: its pipeline, its stream's saver and lag probe,
/// and its subscription, kept up by `resubscribe`. Returns the consumers'
/// tasks and the savers' (which outlive them until `links_stop`).
fn start_consumers(
    consumers: Vec<PreparedConsumer>,
    rollout_slots: Vec<Arc<crate::rollout::live::RolloutSlot>>,
    rollouts: &Rollouts,
    links: &Links,
    shared: &delivery::Shared,
    env: SubscriptionEnv,
    links_stop: &CancellationToken,
) -> (JoinSet<()>, Vec<JoinHandle<()>>) {
    let mut running = JoinSet::new();
    let mut savers = Vec::new();
    for (consumer, rollout) in consumers.into_iter().zip(rollout_slots) {
        let queue = consumer.subscription.queue.as_str();
        if let Some((plan, candidate)) = consumer.rollout.clone() {
            rollouts.configured(queue, plan, candidate);
        }
        shared
            .metrics
            .plugin_version
            .get_or_create(&PluginVersionLabels {
                queue: queue.to_string(),
                sha256: consumer.handler.current().sha256.to_string(),
            })
            .set(1);
        let pipeline = Arc::new(
            Pipeline::new(queue, consumer.rules, consumer.handler, shared)
                .with_rollout(rollout)
                .with_stream(consumer.subscription.stream.clone())
                .with_state(consumer.state.clone()),
        );
        if let Some(position) = &consumer.subscription.stream {
            // One saver per consumer for the life of the host, over the
            // publish connection; it outlives the consumers, whose last
            // saves it stores at their stop.
            savers.extend(position.spawn_saver(Some(links.publish.clone()), links_stop.clone()));
            match &consumer.subscription.stream_protocol {
                Some(endpoints) => {
                    tokio::spawn(crate::broker::stream_protocol::probe::probe_newest(
                        endpoints.clone(),
                        queue.to_string(),
                        position.clone(),
                        env.shutdown.clone(),
                    ))
                }
                None => tokio::spawn(crate::broker::stream::probe_newest(
                    links.consume.clone(),
                    queue.to_string(),
                    position.clone(),
                    env.shutdown.clone(),
                )),
            };
        }
        let subscription = resubscribe::keep_subscribed(
            links.consume.clone(),
            consumer.subscription,
            env.clone(),
            links.apply_topology.clone(),
            {
                let pipeline = pipeline.clone();
                move |received| pipeline.clone().handle(received)
            },
        );
        running.spawn(async move {
            subscription.await;
            pipeline.close().await;
        });
    }
    (running, savers)
}

/// What reloads plugins while the host serves: the file watcher and SIGHUP
/// (the reloader's task), and the config watcher.
struct Reloads {
    stop: CancellationToken,
    tasks: [JoinHandle<()>; 2],
}

/// Serves until every consumer has ended (they drain and end once
/// `shutdown` is cancelled), reloading plugins meanwhile.
async fn serve(
    mut running: JoinSet<()>,
    reloader: &Arc<Reloader>,
    config: &LoadedConfig,
    shutdown: &CancellationToken,
) -> Reloads {
    // File watcher and SIGHUP stop reloading when shutdown begins; the admin
    // endpoint serves (health DOWN) until the consumers have drained.
    let stop = shutdown.child_token();
    let reloads = reloader.start(stop.clone());
    let config_watch = crate::config_watch::spawn(&config.path, &config.text, stop.clone());
    while let Some(joined) = running.join_next().await {
        if let Err(e) = joined {
            // A consumer's task cannot fail short of a bug; the others run on.
            tracing::error!(error = %e, "a consumer task ended unexpectedly");
        }
    }
    Reloads {
        stop,
        tasks: [reloads, config_watch],
    }
}

/// Once the consumers have drained: reloads and the admin endpoint stop,
/// then the links (their supervisors and the savers, which store the last
/// checkpoints), the connections close and the last spans are exported.
/// Every step is bounded: a broker that stops answering must not keep the
/// host from exiting.
async fn shut_down(
    reloads: Reloads,
    admin: AdminTask,
    links: &Links,
    links_stop: CancellationToken,
    background: Vec<JoinHandle<()>>,
    tracer: &Arc<crate::trace::Tracer>,
) {
    reloads.stop.cancel();
    admin.stop.cancel();
    for task in reloads.tasks {
        let _ = task.await;
    }
    admin.stop().await;
    links_stop.cancel();
    // Each wait is bounded, and the waits of one step run at once, so the
    // steps after the drain take at most a few of these limits in all.
    let limit = std::time::Duration::from_secs(5);
    let _ = tokio::time::timeout(limit, futures::future::join_all(background)).await;
    links.close(limit).await;
    // The last spans: the exporter's client blocks, so off the workers.
    let tracer = tracer.clone();
    let _ = tokio::task::spawn_blocking(move || tracer.shutdown(limit)).await;
    tracing::info!("stopped cleanly");
}

/// Applies the host's topology on a (new) connection.
fn topology_hook(topology: Arc<Topology>) -> OnConnected {
    Arc::new(move |connection| {
        let topology = topology.clone();
        Box::pin(async move {
            let report = topology::apply(&connection, &topology)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            for (action, reply) in report.unavailable {
                tracing::warn!(reply = %reply, "{action}: skipped, the queue exists but its node is down; declared again at the next connection, and what is set aside to it meanwhile is held and retried");
            }
            Ok(())
        })
    })
}
