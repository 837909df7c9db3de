//! `acemq-host state get|list|delete`: reads and edits a consumer's state
//! namespace in the store its config names (docs/state.md). The embedded
//! store is opened beside a running host (redb's multi-writer mode); Redis
//! at any time.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::{Exit, fail, with_broker_task};
use crate::config::LoadedConfig;
use crate::state::embedded::Opener;
use crate::state::{Backend, Entry, Store};

/// `state --help`: examples, and the exit codes it shares with the rest of
/// the CLI.
pub const STATE_HELP: &str = "Examples:
  acemq-host state list --config host.toml --namespace orders --prefix customer/
  acemq-host state get --config host.toml --namespace orders customer/c-42
  acemq-host state delete --config host.toml --namespace orders customer/c-42

Keys are given as text, or in hex with --hex. Values are printed as text when they are \
UTF-8, else in hex (0x...).

Exit codes: 0 done; 1 the store could not be used, or (get, delete) the key is not there; \
2 the config or an argument cannot be used.";

#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// Print one key's value, version and expiry.
    #[command(after_help = STATE_HELP)]
    Get {
        #[command(flatten)]
        at: Namespace,
        /// The key (text, or hex with --hex).
        key: String,
    },
    /// List a namespace's live keys in key order, with their values.
    #[command(after_help = STATE_HELP)]
    List {
        #[command(flatten)]
        at: Namespace,
        /// Only keys that start with this (text, or hex with --hex).
        #[arg(long, default_value = "")]
        prefix: String,
        /// At most this many keys.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Remove a key now, outside any input.
    #[command(after_help = STATE_HELP)]
    Delete {
        #[command(flatten)]
        at: Namespace,
        /// The key (text, or hex with --hex).
        key: String,
    },
}

/// Which namespace of which store.
#[derive(Debug, Args)]
pub struct Namespace {
    /// A host's config: its `[state]` says where the store is.
    #[arg(long, short)]
    config: PathBuf,
    /// The namespace (a consumer's `state = "NAME"`).
    #[arg(long, short)]
    namespace: String,
    /// Keys (and the prefix) are given in hex.
    #[arg(long)]
    hex: bool,
}

impl Namespace {
    fn key(&self, text: &str) -> Result<Vec<u8>, String> {
        if self.hex {
            hex::decode(text.trim_start_matches("0x"))
                .map_err(|e| format!("{text:?} is not hex: {e}"))
        } else {
            Ok(text.as_bytes().to_vec())
        }
    }
}

pub fn run(command: StateCommand) -> ExitCode {
    let at = match &command {
        StateCommand::Get { at, .. }
        | StateCommand::List { at, .. }
        | StateCommand::Delete { at, .. } => at,
    };
    if let Err(why) = crate::config::state::check_namespace(&at.namespace) {
        return fail(Exit::Invalid, &format!("--namespace: {why}"));
    }
    let config_path = at.config.clone();
    with_broker_task(&config_path, move |config| async move {
        let store = open(&config)?;
        let now_ms = crate::envelope::now_ms();
        let code = match command {
            StateCommand::Get { at, key } => {
                let key = at.key(&key).map_err(anyhow::Error::msg)?;
                match store.get(&at.namespace, &key, now_ms).await? {
                    Some(entry) => {
                        print!("{}", show_entry(&key, &entry, now_ms));
                        Exit::Done
                    }
                    None => {
                        eprintln!(
                            "{} is not in the namespace {:?} ({})",
                            show(&key),
                            at.namespace,
                            store.describe()
                        );
                        Exit::Failed
                    }
                }
            }
            StateCommand::List { at, prefix, limit } => {
                let prefix = at.key(&prefix).map_err(anyhow::Error::msg)?;
                let found = store.list(&at.namespace, &prefix, limit, now_ms).await?;
                let usage = store.usage(&at.namespace, now_ms).await?;
                println!(
                    "namespace {:?} in {}: {} keys, {} bytes; {} listed",
                    at.namespace,
                    store.describe(),
                    usage.keys,
                    usage.bytes,
                    found.len()
                );
                for (key, entry) in &found {
                    print!("{}", show_entry(key, entry, now_ms));
                }
                Exit::Done
            }
            StateCommand::Delete { at, key } => {
                let key = at.key(&key).map_err(anyhow::Error::msg)?;
                if store.delete_now(&at.namespace, &key, now_ms).await? {
                    println!("deleted {}", show(&key));
                    Exit::Done
                } else {
                    eprintln!("{} was not in the namespace {:?}", show(&key), at.namespace);
                    Exit::Failed
                }
            }
        };
        Ok(code.into())
    })
}

/// The config's store, opened as a tool (beside a running host).
fn open(config: &LoadedConfig) -> anyhow::Result<Store> {
    Ok(crate::state::open(&config.store_location(), Opener::Tool)?)
}

/// Bytes as text when they are UTF-8 without control characters, else hex.
fn show(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_string(),
        _ => format!("0x{}", hex::encode(bytes)),
    }
}

/// One entry: its key, then its version, expiry and value, indented.
fn show_entry(key: &[u8], entry: &Entry, now_ms: u64) -> String {
    let expires = match entry.expires_at_ms {
        None => "never".to_string(),
        Some(at) => format!(
            "in {}",
            humantime::format_duration(std::time::Duration::from_secs(
                at.saturating_sub(now_ms).div_ceil(1000)
            ))
        ),
    };
    format!(
        "{}\n  version {}, expires {expires}, {} bytes\n  {}\n",
        show(key),
        entry.version,
        entry.value.len(),
        show(&entry.value)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_text_when_they_can_be_read_as_text() {
        assert_eq!(show(b"customer/c-42"), "customer/c-42");
        assert_eq!(show(&[0xff, 0x01]), "0xff01");
        assert_eq!(show(b"a\nb"), "0x610a62");
        let entry = Entry {
            value: b"[1,2]".to_vec(),
            version: 7,
            expires_at_ms: Some(61_000),
        };
        assert_eq!(
            show_entry(b"k", &entry, 1_000),
            "k\n  version 7, expires in 1m, 5 bytes\n  [1,2]\n"
        );
    }

    #[test]
    fn hex_keys_are_read_with_or_without_0x() {
        let at = Namespace {
            config: "c.toml".into(),
            namespace: "n".into(),
            hex: true,
        };
        assert_eq!(at.key("0xff00"), Ok(vec![0xff, 0]));
        assert_eq!(at.key("ff00"), Ok(vec![0xff, 0]));
        assert!(at.key("zz").unwrap_err().contains("is not hex"));
    }
}
