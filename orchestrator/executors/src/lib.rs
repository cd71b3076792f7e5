//! Executors: the supervisor-side code that carries out an approved act,
//! with the destinations' credentials, which it reads from their files.
//!
//! - [`push`] a commit of the host repository to a configured git remote
//!   (HTTPS, SSH, loopback HTTP, `file://`), under a lease on the remote
//!   ref's old value that the push itself enforces ([`remote_ref`] reads it);
//! - [`open_pull_request`] through a forge's REST API (GitHub, GitLab's
//!   merge requests, Gitea/Forgejo);
//! - [`notify`] / [`send`]: an HTTP POST of a message: plain, a signed JSON
//!   webhook, or a Slack-compatible incoming webhook.
//!
//! Each takes the destination's config ([`Destinations`]), never a URL from
//! an act (their signatures take a config; an act names an alias, and the
//! door refuses a URL or a path there:
//! `sandbox-image/door/src/validate.rs::tests::urls_and_paths_are_refused_by_name`):
//! the caller resolves the act's alias and must have rechecked the act
//! under its lock; an executor carries out exactly what it is given.
//!
//! Invariants held across the crate:
//! - credentials are read from the owner's files at the moment of use, kept
//!   as [`Secret`] (whose `Debug` is `***`), and appear in no log, no error
//!   and no audit text ([`ExecError::audit_reason`]);
//! - every network call has a time limit and follows no redirect;
//! - a failure is retryable ([`ExecError::retryable`]) only when a new
//!   attempt cannot do anything that was not approved
//!   (`forge::tests::transport_failures_are_retryable_only_when_nothing_was_sent`,
//!   `tests/loopback.rs::servers_that_are_down_give_retryable_errors`).
//!
//! The forge and notify executors reach HTTP through the [`HttpPost`] trait
//! (real: [`UreqPost`], rustls); the push executor is the crate's git2
//! adapter (OpenSSL for HTTPS, libssh2 for SSH). [`tls`] says why two TLS
//! stacks, and whom each trusts.

#![forbid(unsafe_code)]

mod config;
mod error;
mod forge;
mod http;
pub mod known_hosts;
mod notify;
mod push;
mod secret;
pub mod tls;

pub use config::{
    parse_hhmm, ConfigError, Destinations, ForgeConfig, ForgeKind, Listed, Location, NotifyConfig,
    NotifyKind, Problem, Readers, RemoteConfig, RemoteCredential, SummaryConfig,
    DEFAULT_HTTP_TIMEOUT_SECS, DEFAULT_PUSH_TIMEOUT_SECS, TOKEN_USERNAME,
};
pub use error::{ExecError, EXCERPT_CHARS};
pub use forge::{
    find_pull_request, find_pull_request_with, open_pull_request, open_pull_request_with, PrOutcome,
};
pub use http::{HttpPost, HttpRequest, HttpResponse, TransportError, UreqPost, MAX_RESPONSE_BYTES};
pub use notify::{
    notify, notify_with, send, send_with, signature, standard_key, standard_signature, Message,
    NotifyOutcome, SIGNATURE_HEADER, WEBHOOK_ID_HEADER, WEBHOOK_SIGNATURE_HEADER,
    WEBHOOK_TIMESTAMP_HEADER,
};
pub use push::{extends, push, remote_heads, remote_ref, PushOutcome};
pub use secret::{Secret, SecretError};
