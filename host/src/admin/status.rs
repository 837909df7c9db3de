//! The status page: one host at a glance for a person with a browser, with
//! no Prometheus in between. `GET /` serves a page (`status/page.html`,
//! its script and style, all from this binary: the endpoint's
//! [`CONTENT_SECURITY_POLICY`] lets the page load nothing from elsewhere),
//! whose script reads `GET /status` every two seconds and redraws itself.
//!
//! `GET /status` is the JSON document [`document`] builds, pure, from what
//! the host knows: its health, its connections, and per consumer its
//! reading, plugin version, rates per outcome over the last minute and five
//! minutes, deliveries in flight, the oldest unacknowledged one, a stream's
//! lag, and the latest reasons it set messages aside for.
//!
//! Read-only: the page has no button, and the document needs the admin
//! token like every other read (the page asks for it, and keeps it in the
//! tab's session storage, when the endpoint has one).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::health::Assessment;
use crate::broker::{Phase, Reading, StreamProgress};
use crate::plugin::swap::PluginStatus;
use crate::telemetry::activity::{QueueReport, WINDOWS};

/// The page, its script and its style.
pub const PAGE: &str = include_str!("status/page.html");
pub const SCRIPT: &str = include_str!("status/status.js");
pub const STYLE: &str = include_str!("status/status.css");

/// What the page may load and do: its own script, style and `/status`,
/// nothing from elsewhere, no inline code, no framing, no form.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The paths of the page and its assets (served without the token: they
/// hold no data; `/status` does, and needs it).
pub const ASSETS: [&str; 3] = ["/", "/status.js", "/status.css"];

/// Everything the document is made of, as the host read it just now.
pub struct Parts<'a> {
    pub version: &'a str,
    pub commit: &'a str,
    pub started: SystemTime,
    pub now: SystemTime,
    pub health: &'a Assessment,
    pub links: &'a [(&'a str, Phase)],
    pub board: &'a [(String, Reading)],
    pub plugins: &'a [PluginStatus],
    pub activity: &'a [QueueReport],
    pub in_flight: &'a BTreeMap<String, i64>,
    pub oldest_unacked: &'a [(String, Option<Duration>)],
    pub streams: &'a [StreamProgress],
    pub rollouts: &'a [crate::rollout::live::RolloutView],
}

/// The `/status` document.
pub fn document(parts: &Parts<'_>) -> Value {
    let connections: Vec<Value> = parts
        .links
        .iter()
        .map(|(role, phase)| json!({"role": role, "state": phase.word(), "detail": phase.detail()}))
        .collect();
    let consumers: Vec<Value> = parts
        .board
        .iter()
        .map(|(queue, reading)| consumer(parts, queue, reading))
        .collect();
    json!({
        "host": {
            "version": parts.version,
            "commit": parts.commit,
            "started_at": rfc3339(parts.started),
            "uptime_s": parts.now.duration_since(parts.started).unwrap_or_default().as_secs(),
            "status": parts.health.status.as_str(),
            "details": parts.health.details,
            "consuming": format!("{}/{}", parts.health.consuming.0, parts.health.consuming.1),
        },
        "connections": connections,
        "consumers": consumers,
    })
}

fn consumer(parts: &Parts<'_>, queue: &str, reading: &Reading) -> Value {
    let plugin = parts.plugins.iter().find(|p| p.queue == queue);
    let activity = parts.activity.iter().find(|a| a.queue == queue);
    let oldest = parts
        .oldest_unacked
        .iter()
        .find(|(q, _)| q == queue)
        .and_then(|(_, age)| *age);
    let stream = parts.streams.iter().find(|s| s.queue == queue);
    let rollout = parts.rollouts.iter().find(|r| r.queue == queue);
    json!({
        "queue": queue,
        "reading": reading.word(),
        "reason": reading.reason(),
        "plugin": plugin.map(|p| json!({
            "role": "current",
            "path": p.path.display().to_string(),
            "sha256": p.sha256,
            "loaded_at": rfc3339(p.loaded_at),
            "faulting": p.faulting.as_ref().map(|f| f.sentence(queue)),
            "last_refused": p.last_refused.as_ref().map(|r| r.reason.clone()),
        })),
        "totals": activity.map(|a| a.totals.iter().map(|(word, n)| (word.to_string(), json!(n))).collect::<serde_json::Map<_, _>>()),
        "rates": activity.map(rates).unwrap_or_default(),
        "in_flight": parts.in_flight.get(queue).copied().unwrap_or(0),
        "oldest_unacked_s": oldest.map(|age| age.as_secs_f64()),
        "stream": stream.map(|s| json!({"position": s.position, "lag": s.lag})),
        "rollout": rollout.map(|r| json!({
            "mode": r.mode.to_string(),
            "status": r.status.word(),
            "share": r.share.map(|s| s.to_string()),
            "candidate_sha256": r.candidate_sha256,
            "candidate_path": r.candidate_path,
        })),
        "set_aside": activity.map(|a| a.set_asides.iter().map(|note| json!({
            "at": rfc3339(note.at),
            "outcome": note.outcome,
            "reason": note.reason,
            "message_id": note.message_id,
        })).collect::<Vec<_>>()).unwrap_or_default(),
    })
}

/// Per window: its length, the span measured, and each outcome's rate.
fn rates(activity: &QueueReport) -> Vec<Value> {
    WINDOWS
        .iter()
        .zip(&activity.rates)
        .map(|(window, rates)| match rates {
            Some((span, per_second)) => json!({
                "window_s": window.as_secs(),
                "measured_s": span.as_secs_f64(),
                "per_second": per_second.iter().map(|(word, rate)| (word.to_string(), json!(rate))).collect::<serde_json::Map<_, _>>(),
            }),
            None => json!({"window_s": window.as_secs(), "measured_s": null, "per_second": null}),
        })
        .collect()
}

fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::health::Status;
    use crate::telemetry::activity::SetAsideNote;

    #[test]
    fn a_consumer_row_joins_what_each_part_knows_of_its_queue() {
        let started = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let health = Assessment {
            status: Status::Degraded,
            details: vec!["publish connection: blocked".into()],
            consuming: (1, 2),
        };
        let links = [
            ("consume", Phase::Up),
            ("publish", Phase::Blocked { reason: None }),
        ];
        let board = [
            ("orders".to_string(), Reading::Consuming),
            (
                "events".to_string(),
                Reading::Stopped {
                    reason: "not subscribed yet".into(),
                },
            ),
        ];
        let activity = [QueueReport {
            queue: "orders".into(),
            totals: vec![("acked", 10), ("parked", 1)],
            rates: vec![
                Some((
                    Duration::from_secs(60),
                    vec![("acked", 2.5), ("parked", 0.0)],
                )),
                None,
            ],
            set_asides: vec![SetAsideNote {
                at: started,
                outcome: "parked",
                reason: "bad <b>order</b>".into(),
                message_id: "m-1".into(),
            }],
        }];
        let in_flight = BTreeMap::from([("orders".to_string(), 3)]);
        let oldest = [("orders".to_string(), Some(Duration::from_millis(1500)))];
        let document = document(&Parts {
            version: "0.1.0",
            commit: "abc",
            started,
            now: started + Duration::from_secs(90),
            health: &health,
            links: &links,
            board: &board,
            plugins: &[],
            activity: &activity,
            in_flight: &in_flight,
            oldest_unacked: &oldest,
            streams: &[],
            rollouts: &[],
        });
        assert_eq!(document["host"]["status"], "DEGRADED");
        assert_eq!(document["host"]["uptime_s"], 90);
        assert_eq!(document["connections"][1]["state"], "blocked");
        let orders = &document["consumers"][0];
        assert_eq!(orders["queue"], "orders");
        assert_eq!(orders["reading"], "consuming");
        assert_eq!(orders["totals"]["acked"], 10);
        assert_eq!(orders["rates"][0]["window_s"], 60);
        assert_eq!(orders["rates"][0]["per_second"]["acked"], 2.5);
        assert_eq!(orders["rates"][1]["per_second"], Value::Null);
        assert_eq!(orders["in_flight"], 3);
        assert_eq!(orders["oldest_unacked_s"], 1.5);
        // The reason as the plugin wrote it: the page puts it in as text.
        assert_eq!(orders["set_aside"][0]["reason"], "bad <b>order</b>");
        let events = &document["consumers"][1];
        assert_eq!(events["reading"], "stopped");
        assert_eq!(events["reason"], "not subscribed yet");
        assert_eq!(events["in_flight"], 0);
        assert_eq!(events["set_aside"], json!([]));
    }
}
