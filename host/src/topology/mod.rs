//! Topology per the AceMQ contract (§1 naming, §2 topology, §7 streams):
//! what the host declares on the broker, so that its queues are the very
//! queues the Java, Go, .NET, Python and Ruby libraries declare.
//!
//! Read in this order:
//! * [`naming`]: the cross-language names (`{q}.dlq`, `{q}.retry.40s`, ...);
//! * [`model`]: declarations as plain data, the exact argument tables sent;
//! * [`build`]: config to declarations (topology half and consumer half);
//! * [`validate`]: the problem list and every refusal's wording;
//! * [`plan`](mod@plan): the dry-run text;
//! * [`apply`](mod@apply): the only part that talks to the broker.

pub mod apply;
pub mod build;
pub mod model;
pub mod naming;
pub mod plan;
pub mod validate;

pub use apply::{ApplyError, ApplyReport, apply, to_field_table};
pub use model::{
    ArgValue, Arguments, BindingDecl, DeclaredBy, ExchangeDecl, ExchangeKind, QueueDecl, QueueType,
    Topology,
};
pub use plan::plan;
pub use validate::{Entry, Problem, Problems};
