//! The deferred queue: acts whose verdict is *ask* wait here for a person,
//! and are carried out only as approved (the invariants on [`machine`], held
//! by `tests/model.rs::random_event_sequences_keep_the_invariants`).
//!
//! Invariants: pure and synchronous. No clock, no database, no network: the
//! supervisor stores [`ActRow`]s, feeds [`Event`]s to [`apply`] with the
//! time in them, writes each new state together with its audit entry in one
//! transaction, and then carries out the other [`Effect`]s.
//!
//! - [`act`]: the act, its parts, and [`act_digest`], the digest an
//!   approval binds to;
//! - [`owner`]: [`Owner`], the proof that the owner's credential was
//!   checked, without which nothing is approved or rejected;
//! - [`machine`]: the states, events and effects, and [`apply`];
//! - [`listing`]: the order of the morning queue.

#![forbid(unsafe_code)]

pub mod act;
pub mod listing;
pub mod machine;
pub mod owner;

pub use act::{act_digest, Act, ActError, Content, Door, Routing, Target};
pub use listing::{order_for_listing, ActRow};
pub use machine::{
    apply, owed_effects, Approval, AuditEntry, AuditKind, Backoff, Effect, Event, Found,
    QueuePolicy, State, TransitionError,
};
pub use owner::{CredentialCheck, Owner};
