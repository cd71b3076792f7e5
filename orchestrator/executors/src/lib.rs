//! Executors: the supervisor-side code that carries out an approved act,
//! with credentials that live only here.
//!
//! - [`push`] a commit of the host repository to a configured git remote,
//!   under a lease on the remote ref's old value ([`remote_ref`] reads it);
//! - [`open_pull_request`] through a forge's GitHub-shaped REST API;
//! - [`notify`]: an HTTP POST of a message body.
//!
//! Each takes the destination's config ([`Destinations`]), never a URL from
//! an act: the caller resolves the act's alias and must have rechecked the
//! act under its lock; an executor carries out exactly what it is given.
//!
//! Invariants held across the crate:
//! - credentials are read from the owner's files at the moment of use, kept
//!   as [`Secret`] (whose `Debug` is `***`), and appear in no log, no error
//!   and no audit text ([`ExecError::audit_reason`]);
//! - every network call has a time limit and follows no redirect;
//! - a failure is retryable ([`ExecError::retryable`]) only when a new
//!   attempt cannot do anything that was not approved.
//!
//! The forge and notify executors reach HTTP through the [`HttpPost`] trait
//! (real: [`UreqPost`]); the push executor is the crate's git2 adapter.
//! Only `http://` is compiled in: TLS would be a feature of `ureq` (rustls)
//! and of `git2` (`https`).

#![forbid(unsafe_code)]

mod config;
mod error;
mod forge;
mod http;
mod notify;
mod push;
mod secret;

pub use config::{
    ConfigError, Destinations, ForgeConfig, NotifyConfig, Readers, RemoteConfig, RemoteCredential,
    DEFAULT_HTTP_TIMEOUT_SECS, DEFAULT_PUSH_TIMEOUT_SECS, TOKEN_USERNAME,
};
pub use error::{ExecError, EXCERPT_CHARS};
pub use forge::{
    find_pull_request, find_pull_request_with, open_pull_request, open_pull_request_with, PrOutcome,
};
pub use http::{HttpPost, HttpRequest, HttpResponse, TransportError, UreqPost, MAX_RESPONSE_BYTES};
pub use notify::{notify, notify_with, NotifyOutcome};
pub use push::{extends, push, remote_ref, PushOutcome};
pub use secret::{Secret, SecretError};
