//! The delayed-publishing example: publishes each message's body again,
//! later, through the AceMQ scheduler.
//!
//! - To the exchange in the consumer's `[consumers.config] to` (required: a
//!   consumer without it retries, naming the key, until an operator sets it).
//! - With the routing key in the input's text header `remind-key`, default
//!   `reminder`.
//! - Delayed by the input's header `delay-ms`: an integer header (any AMQP
//!   integer width) or decimal text, in milliseconds from now. Absent: the
//!   reminder is published now, without a due time. Negative, or not a whole
//!   number: reject, naming the header and its value.
//! - The body unchanged, with the input's content type (none when the input
//!   has none: the host then labels it `application/json`).
//!
//! Then it accepts. The host publishes a delayed reminder into the
//! scheduler and acks the input once the broker confirms it there; the
//! consumer needs `publish_delayed = true`, or the publish is refused and
//! the input retried with the host's reason.

use std::time::Duration;

use acemq_guest::HeaderValue;
use acemq_guest::prelude::*;

/// Consumer config key naming the exchange reminders go to.
const TO_KEY: &str = "to";
/// Input header with the reminder's routing key.
const KEY_HEADER: &str = "remind-key";
const DEFAULT_ROUTING_KEY: &str = "reminder";
/// Input header with the delay, in milliseconds.
const DELAY_HEADER: &str = "delay-ms";

acemq_guest::config_keys!["to"];

struct Reminder;

impl Handler for Reminder {
    fn handle(msg: Message) -> Result {
        let exchange = config(TO_KEY).or_retry(format_args!(
            "the consumer's config sets no `{TO_KEY}`, the exchange reminders go to"
        ))?;
        let routing_key = match msg.headers().get(KEY_HEADER) {
            None => DEFAULT_ROUTING_KEY.to_string(),
            Some(HeaderValue::Text(key)) => key.clone(),
            Some(other) => {
                return reject(format_args!(
                    "header `{KEY_HEADER}` must be text (a routing key), got {}",
                    describe(other)
                ));
            }
        };
        let delay = delay(msg.headers().get(DELAY_HEADER))?;

        let mut out = publish(&exchange, &routing_key);
        if let Some(content_type) = msg.content_type() {
            out = out.content_type(content_type);
        }
        if let Some(delay) = delay {
            out = out.delay(delay);
        }
        let sent = out.body(msg.into_body()).send()?;
        match delay {
            Some(delay) => info!(
                "reminder {} to {exchange} with {routing_key} in {} ms",
                sent.id,
                delay.as_millis()
            ),
            None => info!("reminder {} to {exchange} with {routing_key} now", sent.id),
        }
        accept()
    }
}

/// The delay `delay-ms` asks for; `None` when the header is absent.
fn delay(header: Option<&HeaderValue>) -> Result<Option<Duration>> {
    let Some(value) = header else {
        return Ok(None);
    };
    let ms = match value {
        HeaderValue::Int(ms) => u64::try_from(*ms).ok(),
        // Decimal digits only ("1500"); `u64::from_str` would also take a
        // leading `+`, which no publisher means.
        HeaderValue::Text(text) if text.bytes().all(|b| b.is_ascii_digit()) => text.parse().ok(),
        _ => None,
    };
    let ms = ms.or_reject(format_args!(
        "header `{DELAY_HEADER}` must be a whole number of milliseconds, 0 or more \
         (an integer, or decimal text), got {}",
        describe(value)
    ))?;
    Ok(Some(Duration::from_millis(ms)))
}

/// A header value as a reason shows it: its kind and its value.
fn describe(value: &HeaderValue) -> String {
    match value {
        HeaderValue::Text(text) => format!("the text {text:?}"),
        HeaderValue::Int(n) => format!("the integer {n}"),
        HeaderValue::Float(f) => format!("the float {f}"),
        HeaderValue::Boolean(b) => format!("the boolean {b}"),
        HeaderValue::Bytes(bytes) => format!("{} bytes", bytes.len()),
    }
}

acemq_guest::export_handler!(Reminder);

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::log::Level;
    use acemq_guest::testing::{self, Handled, TestHost};

    const NOW: u64 = 1_000_000;

    fn host() -> TestHost {
        TestHost::new()
            .now_ms(NOW)
            .config(TO_KEY, "reminders")
            .publish_to(["reminders"])
    }

    /// A message with `body`, content type `text/plain` and `headers`.
    fn input(headers: &[(&str, HeaderValue)]) -> Message {
        let mut msg = testing::message("call the dentist");
        *msg.content_type_mut() = Some("text/plain".into());
        for (name, value) in headers {
            msg.headers_mut().insert(*name, value.clone());
        }
        msg
    }

    fn remind(host: &TestHost, msg: Message) -> Handled {
        host.handle::<Reminder>(msg)
    }

    fn rejected(msg: Message) -> String {
        let done = remind(&host(), msg);
        assert!(done.published.is_empty(), "nothing published on a reject");
        match done.outcome {
            Outcome::Reject(reason) => reason,
            other => panic!("a reject expected, got {other:?}"),
        }
    }

    #[test]
    fn an_integer_delay_publishes_the_body_that_much_later() {
        let done = remind(&host(), input(&[(DELAY_HEADER, 90_000.into())]));
        assert_eq!(done.outcome, Outcome::Accept);
        let [reminder] = &done.published[..] else {
            panic!("one reminder expected: {:?}", done.published)
        };
        assert_eq!(
            (reminder.exchange.as_str(), reminder.routing_key.as_str()),
            ("reminders", "reminder")
        );
        assert_eq!(reminder.body, b"call the dentist");
        assert_eq!(reminder.content_type.as_deref(), Some("text/plain"));
        assert_eq!(reminder.deliver_at_ms, Some(NOW + 90_000));
        assert_eq!(reminder.due_in, Some(Duration::from_secs(90)));
        // The input's headers (the delay among them) are not carried over.
        assert!(reminder.headers.is_empty());
        assert_eq!(
            done.logs,
            [(
                Level::Info,
                format!(
                    "reminder {} to reminders with reminder in 90000 ms",
                    reminder.sent.id
                )
            )]
        );
    }

    #[test]
    fn long_delays_are_read_whole() {
        // The host widens every AMQP integer header to 64 bits; a delay that
        // needs a long (over 16 bits) or a long long (30 days, over 31 bits)
        // must not be cut to a narrower width on the way.
        for ms in [40_000_i64, 2_592_000_000] {
            let done = remind(&host(), input(&[(DELAY_HEADER, ms.into())]));
            assert_eq!(done.outcome, Outcome::Accept, "{ms}");
            assert_eq!(done.published[0].deliver_at_ms, Some(NOW + ms as u64));
        }
    }

    #[test]
    fn a_decimal_text_delay_is_read_as_milliseconds() {
        let done = remind(&host(), input(&[(DELAY_HEADER, "1500".into())]));
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(done.published[0].deliver_at_ms, Some(NOW + 1_500));
    }

    #[test]
    fn a_zero_delay_still_goes_through_the_scheduler_due_now() {
        let done = remind(&host(), input(&[(DELAY_HEADER, 0.into())]));
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(done.published[0].deliver_at_ms, Some(NOW));
        assert_eq!(done.published[0].due_in, Some(Duration::ZERO));
    }

    #[test]
    fn without_a_delay_the_reminder_is_published_now() {
        let done = remind(&host(), input(&[]));
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(done.published[0].deliver_at_ms, None);
        assert_eq!(done.published[0].due_in, None);
        assert_eq!(
            done.logs[0].1,
            format!(
                "reminder {} to reminders with reminder now",
                done.published[0].sent.id
            )
        );
    }

    #[test]
    fn remind_key_sets_the_routing_key() {
        let msg = input(&[
            (KEY_HEADER, "dentist.call".into()),
            (DELAY_HEADER, 10.into()),
        ]);
        let done = remind(&host(), msg);
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(done.published[0].routing_key, "dentist.call");
    }

    #[test]
    fn a_remind_key_that_is_not_text_is_rejected_naming_it() {
        assert_eq!(
            rejected(input(&[(KEY_HEADER, 7.into())])),
            "header `remind-key` must be text (a routing key), got the integer 7"
        );
    }

    #[test]
    fn the_content_type_is_the_inputs_even_when_it_has_none() {
        let mut msg = input(&[(DELAY_HEADER, 5.into())]);
        *msg.content_type_mut() = None;
        let done = remind(&host(), msg);
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(done.published[0].content_type, None);

        let done = remind(&host(), testing::json_message(&json!({"a": 1})));
        assert_eq!(
            done.published[0].content_type.as_deref(),
            Some("application/json")
        );
        assert_eq!(done.published[0].body, br#"{"a":1}"#);
    }

    #[test]
    fn a_negative_delay_is_rejected_naming_the_header_and_value() {
        let expected = |got: &str| {
            format!(
                "header `delay-ms` must be a whole number of milliseconds, 0 or more \
                 (an integer, or decimal text), got {got}"
            )
        };
        assert_eq!(
            rejected(input(&[(DELAY_HEADER, (-5).into())])),
            expected("the integer -5")
        );
        assert_eq!(
            rejected(input(&[(DELAY_HEADER, "-5".into())])),
            expected("the text \"-5\"")
        );
    }

    #[test]
    fn a_delay_that_is_not_a_whole_number_is_rejected_naming_it() {
        for (value, shown) in [
            (HeaderValue::from("soon"), "the text \"soon\""),
            (HeaderValue::from("1.5"), "the text \"1.5\""),
            (HeaderValue::from(" 15"), "the text \" 15\""),
            (HeaderValue::from("+15"), "the text \"+15\""),
            (HeaderValue::from(""), "the text \"\""),
            // More milliseconds than 64 bits hold.
            (
                HeaderValue::from("18446744073709551616"),
                "the text \"18446744073709551616\"",
            ),
            (HeaderValue::Float(1.5), "the float 1.5"),
            (HeaderValue::Boolean(true), "the boolean true"),
            (HeaderValue::Bytes(vec![1, 2]), "2 bytes"),
        ] {
            let reason = rejected(input(&[(DELAY_HEADER, value)]));
            assert!(
                reason.starts_with("header `delay-ms` must be a whole number")
                    && reason.ends_with(&format!("got {shown}")),
                "{reason}"
            );
        }
    }

    #[test]
    fn without_a_to_exchange_it_retries_naming_the_key() {
        let done = remind(&TestHost::new(), input(&[(DELAY_HEADER, 5.into())]));
        assert_eq!(
            done.outcome,
            Outcome::Retry(
                "the consumer's config sets no `to`, the exchange reminders go to".into()
            )
        );
        assert!(done.published.is_empty());
    }

    #[test]
    fn a_consumer_without_publish_delayed_retries_with_the_hosts_reason() {
        let host = host().publish_delayed(false);
        let done = remind(&host, input(&[(DELAY_HEADER, 5.into())]));
        let Outcome::Retry(reason) = done.outcome else {
            panic!("a retry expected, got {:?}", done.outcome)
        };
        assert!(reason.contains("set publish_delayed = true"), "{reason}");
        assert!(done.published.is_empty());

        // A reminder due now needs no scheduler.
        let done = remind(&host, input(&[]));
        assert_eq!(done.outcome, Outcome::Accept);
    }

    #[test]
    fn a_delay_beyond_the_hosts_max_delay_retries_naming_the_limit() {
        let host = host().max_delay(Duration::from_secs(60));
        let done = remind(&host, input(&[(DELAY_HEADER, 60_001.into())]));
        let Outcome::Retry(reason) = done.outcome else {
            panic!("a retry expected, got {:?}", done.outcome)
        };
        assert!(reason.ends_with("([scheduler] max_delay = 1m)"), "{reason}");
    }
}
