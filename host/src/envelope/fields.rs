//! The envelope fields a plugin may choose for a message it sends (the WIT
//! `envelope-fields`, contract §4), checked strictly: a field the host
//! would have to alter, or that another library could not read back, is
//! refused with a sentence naming it, never silently replaced.

use super::{Envelope, MAX_SHORT_STRING, preview};

/// Most bytes of a chosen message type, correlation or causation id. Not
/// AMQP short strings (they travel as long-string headers), but names and
/// ids, and the bound keeps them within what every library stores.
pub const MAX_FIELD_BYTES: usize = MAX_SHORT_STRING;

/// The length of a UUID in its hyphenated text form
/// (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
const UUID_TEXT_LEN: usize = 36;

/// What a plugin chose; `None` is the host's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChosenFields {
    pub id: Option<String>,
    pub message_type: Option<String>,
    pub version: Option<u32>,
    pub correlation_id: Option<String>,
    pub causation_id: Option<String>,
}

/// The envelope fields of one output, its id settled when it was buffered
/// (the plugin's own, or the one the host derived), the rest still the
/// plugin's choice or `None` for the default (see [`Envelope::output_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputFields {
    pub id: String,
    pub message_type: Option<String>,
    pub version: Option<u32>,
    pub correlation_id: Option<String>,
    pub causation_id: Option<String>,
}

impl OutputFields {
    /// An output with id `id` and every other field the default.
    #[must_use]
    pub fn with_id(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            message_type: None,
            version: None,
            correlation_id: None,
            causation_id: None,
        }
    }
}

impl ChosenFields {
    /// Checks every field the plugin set, first refusal first.
    pub fn check(&self) -> Result<(), String> {
        if let Some(id) = &self.id {
            parse_id(id)?;
        }
        if let Some(message_type) = &self.message_type {
            check_text("message type", message_type)?;
        }
        if let Some(version) = self.version {
            check_version(version)?;
        }
        if let Some(correlation) = &self.correlation_id {
            check_text("correlation id", correlation)?;
        }
        if let Some(causation) = &self.causation_id {
            check_text("causation id", causation)?;
        }
        Ok(())
    }

    /// The fields of the output, with `id` as its id (the plugin's own,
    /// checked, or the host's).
    #[must_use]
    pub fn with_id(self, id: String) -> OutputFields {
        OutputFields {
            id,
            message_type: self.message_type,
            version: self.version,
            correlation_id: self.correlation_id,
            causation_id: self.causation_id,
        }
    }
}

/// `id` as a UUID, when it is one in its 36-character hyphenated text form
/// (either case); otherwise the refusal. Only that form: every AceMQ
/// library writes it, and a reader de-duplicating on the id compares text.
pub fn parse_id(id: &str) -> Result<uuid::Uuid, String> {
    let refusal = || {
        format!(
            "the id '{}' is not a UUID in its 36-character text form \
             (like 6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5f)",
            preview(id)
        )
    };
    if id.len() != UUID_TEXT_LEN {
        return Err(refusal());
    }
    uuid::Uuid::try_parse(id).map_err(|_| refusal())
}

/// The version, when it is one a reader accepts: at least 1 (0 reads as
/// absent and would become 1), and within the signed 32-bit integer it is
/// written as.
fn check_version(version: u32) -> Result<(), String> {
    if version == 0 {
        return Err("the version 0 is not allowed: versions start at 1".to_string());
    }
    if i32::try_from(version).is_err() {
        return Err(format!(
            "the version {version} is too large: at most {} (it is written as a signed 32-bit integer)",
            i32::MAX
        ));
    }
    Ok(())
}

/// A text field: not empty (an empty one reads as absent, and would be
/// replaced by the default), at most [`MAX_FIELD_BYTES`].
fn check_text(what: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!(
            "the {what} is empty: leave it unset for the default"
        ));
    }
    check_length(what, value, MAX_FIELD_BYTES)
}

/// `value` when it is at most `max` bytes; otherwise the plugin's refusal,
/// naming `what` was too long.
pub fn check_length(what: &str, value: &str, max: usize) -> Result<(), String> {
    if value.len() <= max {
        return Ok(());
    }
    Err(format!(
        "the {what} '{}' is {} bytes long; at most {max} are allowed",
        preview(value),
        value.len()
    ))
}

impl Envelope {
    /// The envelope of an output of `parent` published with `routing_key`:
    /// a child of it ([`Envelope::child_of`]) with the id of `fields`, and
    /// each other field the plugin's choice or the default: type = the
    /// routing key, version 1, correlation = the parent's, causation = the
    /// parent's id.
    #[must_use]
    pub fn output_of(
        parent: &Envelope,
        fields: &OutputFields,
        routing_key: &str,
        origin: &str,
        now_ms: u64,
    ) -> Self {
        let message_type = fields
            .message_type
            .clone()
            .unwrap_or_else(|| routing_key.to_string());
        // Made with the chosen ids: not with a fresh UUID and the parent's
        // ids, replaced at once.
        let mut child = Self::child_with(
            parent,
            fields.id.as_str().into(),
            fields.correlation_id.as_deref(),
            fields.causation_id.as_deref(),
            message_type,
            origin,
            now_ms,
        );
        if let Some(version) = fields.version {
            child.version = version;
        }
        child
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5f";

    fn chosen() -> ChosenFields {
        ChosenFields::default()
    }

    #[test]
    fn nothing_chosen_is_nothing_refused() {
        assert_eq!(chosen().check(), Ok(()));
    }

    #[test]
    fn an_id_must_be_a_uuid_in_its_hyphenated_text_form() {
        for good in [ID, &ID.to_uppercase()] {
            let fields = ChosenFields {
                id: Some(good.to_string()),
                ..chosen()
            };
            assert_eq!(fields.check(), Ok(()), "{good}");
        }
        for bad in [
            "order-1",
            "",
            "6f1c0c1e3b5a4c8e9d2f0a1b2c3d4e5f",
            "{6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5f}",
            "urn:uuid:6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5f",
            "6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5g",
        ] {
            let fields = ChosenFields {
                id: Some(bad.to_string()),
                ..chosen()
            };
            let err = fields.check().unwrap_err();
            assert!(
                err.starts_with(&format!(
                    "the id '{bad}' is not a UUID in its 36-character text form"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn a_version_starts_at_1_and_fits_a_signed_32_bit_integer() {
        let with = |version| ChosenFields {
            version: Some(version),
            ..chosen()
        };
        assert_eq!(
            with(0).check(),
            Err("the version 0 is not allowed: versions start at 1".to_string())
        );
        assert_eq!(with(1).check(), Ok(()));
        assert_eq!(with(i32::MAX as u32).check(), Ok(()));
        let err = with(i32::MAX as u32 + 1).check().unwrap_err();
        assert!(err.contains("is too large: at most 2147483647"), "{err}");
    }

    #[test]
    fn text_fields_are_not_empty_and_bounded() {
        let long = "c".repeat(MAX_FIELD_BYTES + 1);
        type Setter = fn(String) -> ChosenFields;
        let cases: [(&str, Setter); 3] = [
            ("message type", |v| ChosenFields {
                message_type: Some(v),
                ..ChosenFields::default()
            }),
            ("correlation id", |v| ChosenFields {
                correlation_id: Some(v),
                ..ChosenFields::default()
            }),
            ("causation id", |v| ChosenFields {
                causation_id: Some(v),
                ..ChosenFields::default()
            }),
        ];
        for (what, fields) in cases {
            assert_eq!(
                fields(String::new()).check(),
                Err(format!(
                    "the {what} is empty: leave it unset for the default"
                ))
            );
            assert_eq!(fields("c".repeat(MAX_FIELD_BYTES)).check(), Ok(()));
            let err = fields(long.clone()).check().unwrap_err();
            assert!(
                err.starts_with(&format!("the {what} 'ccc"))
                    && err.ends_with("is 256 bytes long; at most 255 are allowed"),
                "{err}"
            );
        }
    }

    #[test]
    fn an_output_takes_the_defaults_of_its_input_where_nothing_was_chosen() {
        let parent = Envelope::new("order.placed", "acemq@a", 1);
        let child = Envelope::output_of(
            &parent,
            &OutputFields::with_id(ID),
            "order.billed",
            "acemq@b",
            2,
        );
        assert_eq!(child.id, ID);
        assert_eq!(child.message_type, "order.billed");
        assert_eq!(child.version, 1);
        assert_eq!(child.correlation_id, parent.correlation_id);
        assert_eq!(child.causation_id.as_deref(), Some(parent.id.as_str()));
        assert_eq!((child.attempt, child.first_seen_ms), (1, 2));
        assert_eq!(child.origin.as_deref(), Some("acemq@b"));
    }

    #[test]
    fn an_output_carries_what_the_plugin_chose() {
        let parent = Envelope::new("order.placed", "acemq@a", 1);
        let fields = ChosenFields {
            id: None,
            message_type: Some("invoice.raised".into()),
            version: Some(3),
            correlation_id: Some("conversation-9".into()),
            causation_id: Some("cause-7".into()),
        }
        .with_id(ID.to_string());
        let child = Envelope::output_of(&parent, &fields, "order.billed", "acemq@b", 2);
        assert_eq!(child.id, ID);
        assert_eq!(child.message_type, "invoice.raised");
        assert_eq!(child.version, 3);
        assert_eq!(child.correlation_id, "conversation-9");
        assert_eq!(child.causation_id.as_deref(), Some("cause-7"));
    }
}
