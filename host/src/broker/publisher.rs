//! Confirmed, mandatory publishing.
//!
//! Each batch (a handler's outputs, or one set-aside copy) borrows a channel
//! of its own from a pool for as long as its confirms are outstanding. Why:
//! lapin hands a `basic.return` to whichever confirm it resolves next, and
//! expands multiple-acks in no particular order, so on a shared channel a
//! return can land on another publisher's confirm. On a channel used by one
//! batch at a time, every return belongs to that batch and is matched to its
//! message by `message-id`. Batches on different channels still overlap, so
//! many deliveries can wait for their confirms at once.

use std::sync::{Arc, Mutex};

use futures::future::join_all;
use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Connection};

/// One message to publish.
#[derive(Debug, Clone)]
pub struct Publication {
    pub exchange: String,
    pub routing_key: String,
    pub body: Vec<u8>,
    pub properties: BasicProperties,
}

impl Publication {
    fn message_id(&self) -> String {
        self.properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default()
    }
}

/// Why a publish was not confirmed. Wordings follow the contract (§6).
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    #[error(
        "message {id} to exchange '{exchange}' with key '{routing_key}' reached no queue: {reason}"
    )]
    Unroutable {
        id: String,
        exchange: String,
        routing_key: String,
        reason: String,
    },
    #[error(
        "message {id} to exchange '{exchange}' with key '{routing_key}': the broker refused to confirm it. \
         The message reached the broker and the broker has not taken responsibility for it, so it must be treated as not sent"
    )]
    Refused {
        id: String,
        exchange: String,
        routing_key: String,
    },
    #[error(
        "message {id} to exchange '{exchange}' with key '{routing_key}' may not have been sent: {reason}"
    )]
    Unknown {
        id: String,
        exchange: String,
        routing_key: String,
        reason: String,
    },
    #[error(
        "{failed} of {total} messages were not confirmed; {confirmed} were. The first failure was: {first}"
    )]
    Batch {
        failed: usize,
        total: usize,
        confirmed: usize,
        first: Box<PublishError>,
    },
}

/// Publishes with confirms on pooled confirm-mode channels.
pub struct Publisher {
    connection: Arc<Connection>,
    idle: Mutex<Vec<Channel>>,
}

impl Publisher {
    pub fn new(connection: Arc<Connection>) -> Self {
        Self {
            connection,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Publishes one message, mandatory, and waits for its confirm.
    pub async fn publish(&self, publication: Publication) -> Result<(), PublishError> {
        self.publish_all(vec![publication]).await
    }

    /// Writes every message before awaiting any confirm, then waits for all
    /// of them, even after a failure (contract §6 batch semantics).
    pub async fn publish_all(&self, publications: Vec<Publication>) -> Result<(), PublishError> {
        if publications.is_empty() {
            return Ok(());
        }
        let channel = match self.channel().await {
            Ok(channel) => channel,
            Err(e) => return Err(unknown(&publications[0], &e)),
        };
        let mut pending = Vec::with_capacity(publications.len());
        for publication in &publications {
            let sent = channel
                .basic_publish(
                    publication.exchange.as_str().into(),
                    publication.routing_key.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &publication.body,
                    publication.properties.clone(),
                )
                .await;
            pending.push(sent);
        }
        let mut confirmations = Vec::with_capacity(pending.len());
        let mut waiting = Vec::new();
        for (index, sent) in pending.into_iter().enumerate() {
            match sent {
                Ok(confirm) => waiting.push((index, confirm)),
                Err(e) => confirmations.push((index, Err(unknown(&publications[index], &e)))),
            }
        }
        let (indices, confirms): (Vec<_>, Vec<_>) = waiting.into_iter().unzip();
        let results = join_all(confirms).await;
        let mut returned_ids = Vec::new();
        for (index, result) in indices.into_iter().zip(results) {
            let outcome = match result {
                Ok(Confirmation::Ack(returned)) => {
                    if let Some(ret) = returned {
                        returned_ids.push((returned_message_id(&ret), ret.reply_text.to_string()));
                    }
                    Ok(())
                }
                Ok(Confirmation::Nack(_)) => Err(refused(&publications[index])),
                Ok(Confirmation::NotRequested) => Ok(()),
                Err(e) => Err(unknown(&publications[index], &e)),
            };
            confirmations.push((index, outcome));
        }
        // Returns are matched by message id: within this batch, on this
        // channel, they can only be ours.
        for (id, reply_text) in returned_ids {
            let matching = confirmations
                .iter_mut()
                .find(|(i, outcome)| outcome.is_ok() && publications[*i].message_id() == id);
            if let Some((index, outcome)) = matching {
                let p = &publications[*index];
                *outcome = Err(PublishError::Unroutable {
                    id,
                    exchange: p.exchange.clone(),
                    routing_key: p.routing_key.clone(),
                    reason: if reply_text == "NO_ROUTE" {
                        "no queue is bound to receive it".to_string()
                    } else {
                        reply_text
                    },
                });
            }
        }
        confirmations.sort_by_key(|(index, _)| *index);
        self.give_back(channel);
        batch_result(confirmations)
    }

    async fn channel(&self) -> lapin::Result<Channel> {
        let idle = self.idle.lock().expect("publisher pool poisoned").pop();
        if let Some(channel) = idle {
            return Ok(channel);
        }
        let channel = self.connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(channel)
    }

    fn give_back(&self, channel: Channel) {
        // A channel the broker closed (it happens on a publish to a missing
        // exchange) is dropped rather than pooled.
        if channel.status().connected() {
            self.idle
                .lock()
                .expect("publisher pool poisoned")
                .push(channel);
        }
    }
}

fn returned_message_id(ret: &lapin::message::BasicReturnMessage) -> String {
    ret.delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.to_string())
        .unwrap_or_default()
}

fn batch_result(confirmations: Vec<(usize, Result<(), PublishError>)>) -> Result<(), PublishError> {
    let total = confirmations.len();
    let mut failures = confirmations
        .into_iter()
        .filter_map(|(_, r)| r.err())
        .peekable();
    let Some(first) = failures.next() else {
        return Ok(());
    };
    let failed = 1 + failures.count();
    if total == 1 {
        return Err(first);
    }
    Err(PublishError::Batch {
        failed,
        total,
        confirmed: total - failed,
        first: Box::new(first),
    })
}

fn refused(p: &Publication) -> PublishError {
    PublishError::Refused {
        id: p.message_id(),
        exchange: p.exchange.clone(),
        routing_key: p.routing_key.clone(),
    }
}

fn unknown(p: &Publication, error: &lapin::Error) -> PublishError {
    PublishError::Unknown {
        id: p.message_id(),
        exchange: p.exchange.clone(),
        routing_key: p.routing_key.clone(),
        reason: error.to_string(),
    }
}
