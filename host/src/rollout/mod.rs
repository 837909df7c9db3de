//! Rolling out a new version of a consumer's handler safely, beside the
//! version that serves ([`docs/rollout.md`](../../../docs/rollout.md)):
//!
//! - **canary**: the candidate handles a share of deliveries for real
//!   (chosen by [`share`]), stepping up through the configured shares; each
//!   step is judged against the current version ([`judge`]), and the
//!   candidate is promoted after the last or rolled back as soon as it is
//!   worse beyond a threshold;
//! - **shadow**: the candidate runs on a copy of a share of deliveries,
//!   publishes nothing, changes no state, and its decisions are compared
//!   with the current version's, call by call.
//!
//! What to do is a [`plan::Plan`] (from `[consumers.candidate]` or the admin
//! endpoint); the pure parts are [`plan`], [`share`], [`judge`],
//! [`decision`] and [`record`]'s resumption; [`live`] runs it.

pub mod decision;
pub mod judge;
pub mod live;
pub mod plan;
pub mod record;
pub mod share;
