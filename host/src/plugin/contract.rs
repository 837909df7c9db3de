//! Which version of the plugin contract a component was built against.
//!
//! This host implements two: 0.4 (`wit/plugin.wit`, its own) and 0.3
//! (`wit/v0.3/plugin.wit`, frozen), so a platform team can upgrade the host
//! before every plugin is rebuilt. A 0.3 plugin's calls run on the same
//! internals through a thin adapter (`host/v0_3.rs`). Any other version is
//! refused at load, by name: left to the linker, the same plugin fails with
//! "instance export `log` has the wrong type", which sends an operator
//! looking in the wrong place.

use std::fmt;

/// A version of the contract this host implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    /// `acemq:plugin@0.4.0`, this host's own.
    V0_4,
    /// `acemq:plugin@0.3.0`: no replies, no state, no envelope fields but
    /// the message type on outputs.
    V0_3,
}

impl Contract {
    /// Every version this host implements, newest first.
    pub const SUPPORTED: [Contract; 2] = [Contract::V0_4, Contract::V0_3];

    /// The version, as the package names it (`0.4.0`).
    #[must_use]
    pub fn version(self) -> &'static str {
        match self {
            Contract::V0_4 => contract_version!(),
            Contract::V0_3 => legacy_contract_version!(),
        }
    }

    fn of_version(version: &str) -> Option<Self> {
        Self::SUPPORTED.into_iter().find(|c| c.version() == version)
    }

    /// The contract the `acemq:plugin/NAME@VERSION` names among a
    /// component's imports and exports belong to, or the sentence refusing
    /// it: a version this host does not implement (named, with the ones it
    /// does), or two versions in one component. A component naming none
    /// is taken as the current contract (its world check then says what it
    /// lacks).
    pub fn of_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut found: Option<Contract> = None;
        for name in names {
            let Some(version) = contract_version_of(name) else {
                continue;
            };
            let Some(contract) = Self::of_version(version) else {
                return Err(format!(
                    "was built against acemq:plugin@{version}, and this host implements {}: \
                     rebuild it with this host's guest SDK (wit/plugin.wit)",
                    supported_list()
                ));
            };
            match found {
                Some(other) if other != contract => {
                    return Err(format!(
                        "mixes two versions of the contract ({other} and {contract}): \
                         rebuild it with this host's guest SDK (wit/plugin.wit)"
                    ));
                }
                _ => found = Some(contract),
            }
        }
        Ok(found.unwrap_or(Contract::V0_4))
    }
}

impl fmt::Display for Contract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "acemq:plugin@{}", self.version())
    }
}

/// The versions this host implements, for a refusal: `acemq:plugin@0.4.0
/// and acemq:plugin@0.3.0`.
fn supported_list() -> String {
    Contract::SUPPORTED
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" and ")
}

/// The version in an `acemq:plugin/NAME@VERSION` name.
fn contract_version_of(name: &str) -> Option<&str> {
    let (interface, version) = name.strip_prefix("acemq:plugin/")?.split_once('@')?;
    (!interface.is_empty()).then_some(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_supported_version_is_recognised() {
        assert_eq!(
            Contract::of_names([contract!("host"), contract!("handler")]),
            Ok(Contract::V0_4)
        );
        assert_eq!(
            Contract::of_names([
                "wasi:cli/environment@0.2.0",
                "acemq:plugin/host@0.3.0",
                "acemq:plugin/handler@0.3.0"
            ]),
            Ok(Contract::V0_3)
        );
        // Nothing of the contract: the world check says what is missing.
        assert_eq!(
            Contract::of_names(["wasi:cli/environment@0.2.0", "acemq:plugin/host"]),
            Ok(Contract::V0_4)
        );
    }

    #[test]
    fn another_version_is_refused_with_both_supported_ones_named() {
        let err = Contract::of_names(["acemq:plugin/host@0.1.0"]).unwrap_err();
        assert_eq!(
            err,
            "was built against acemq:plugin@0.1.0, and this host implements \
             acemq:plugin@0.4.0 and acemq:plugin@0.3.0: rebuild it with this host's guest SDK \
             (wit/plugin.wit)"
        );
    }

    #[test]
    fn two_versions_in_one_component_are_refused() {
        let err =
            Contract::of_names(["acemq:plugin/host@0.3.0", contract!("handler")]).unwrap_err();
        assert!(
            err.contains(
                "mixes two versions of the contract (acemq:plugin@0.3.0 and acemq:plugin@0.4.0)"
            ),
            "{err}"
        );
    }
}
