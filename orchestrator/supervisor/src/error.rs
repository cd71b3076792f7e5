//! One error type for every front end. An [`ApiError`] is a kind, a
//! lowercase message saying what was being done, and the typed error it
//! arose from (its `Error::source`). The kind alone decides the exit code of the
//! command line (README.md, "Exit codes") and the HTTP status of the JSON
//! API, through the two pure functions below, so the two front ends can
//! never disagree on what an error means
//! (`tests::every_kind_has_its_documented_exit_code_and_status`,
//! `tests::no_error_is_a_success_on_either_front_end`).
//!
//! Invariant: a kind is decided by type where the error arises (each typed
//! error's variant, through the `From<&E> for ErrorKind` impls below, or
//! the site that makes an [`ApiError::new`]), never by reading a message:
//! `the_kind_follows_the_type_not_the_words` holds it here, and
//! `api::tests::a_decision_is_barred_by_type_not_by_the_queues_words` for
//! the owner's decisions, whose queue answers in sentences.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::run::{RetryError, RunError, Stop};
use nightshift_core::accounts::UserError;
use nightshift_core::exit;
use nightshift_core::owner::OwnerError;
use nightshift_core::policy::PolicyError;
use nightshift_core::state_store::{StoreError, StoreErrorKind};
use nightshift_engine_docker::engine::EngineError;
use nightshift_engine_docker::image::ImageError;

/// What went wrong, as far as a caller needs to act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// A malformed request: bad argument, not a repository, unknown ref.
    BadInput,
    /// The request names something that does not exist (a run, an act, a task).
    NotFound,
    /// The request is well formed but the thing it names cannot take it now
    /// (an act not carried out, a running task cancelled, a rebind refused).
    Failed,
    /// The container engine is unreachable.
    Engine,
    /// The image is not in the local engine.
    ImageMissing,
    /// The sandbox failed the Tier 0 attestation; the run was refused.
    Refused,
    /// The state store could not be read or written.
    State,
    /// Anything else the supervisor could not do.
    Internal,
    /// The owner's credential is missing or wrong, or the policy refused the change.
    Denied,
    /// nightshift is frozen: nothing starts and nothing is approved.
    Frozen,
    /// The run's history was refused at import; its files arrived.
    NotWhole,
    /// The import failed; the worktree is kept.
    ImportFailed,
    /// Stopped by SIGINT.
    Interrupted,
    /// Stopped by SIGTERM.
    Terminated,
}

impl ErrorKind {
    /// Every kind, for tests and for documentation.
    pub const ALL: [ErrorKind; 14] = [
        ErrorKind::BadInput,
        ErrorKind::NotFound,
        ErrorKind::Failed,
        ErrorKind::Engine,
        ErrorKind::ImageMissing,
        ErrorKind::Refused,
        ErrorKind::State,
        ErrorKind::Internal,
        ErrorKind::Denied,
        ErrorKind::Frozen,
        ErrorKind::NotWhole,
        ErrorKind::ImportFailed,
        ErrorKind::Interrupted,
        ErrorKind::Terminated,
    ];

    /// The documented exit code of the `nightshift` binary for this kind.
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::BadInput | ErrorKind::NotFound => exit::BAD_INPUT,
            ErrorKind::Failed => exit::FAILED,
            ErrorKind::Engine => exit::ENGINE,
            ErrorKind::ImageMissing => exit::IMAGE_MISSING,
            ErrorKind::Refused => exit::REFUSED,
            ErrorKind::State => exit::STATE,
            ErrorKind::Internal => exit::INTERNAL,
            ErrorKind::Denied | ErrorKind::Frozen => exit::DENIED,
            ErrorKind::NotWhole => exit::NOT_WHOLE,
            ErrorKind::ImportFailed => exit::IMPORT_FAILED,
            ErrorKind::Interrupted => exit::SIGINT,
            ErrorKind::Terminated => exit::SIGTERM,
        }
    }

    /// The HTTP status of the JSON API for this kind.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::BadInput => 400,
            ErrorKind::Denied => 403,
            ErrorKind::NotFound => 404,
            ErrorKind::Failed => 409,
            ErrorKind::Refused => 422,
            ErrorKind::Frozen => 423,
            ErrorKind::ImageMissing => 424,
            ErrorKind::Internal | ErrorKind::NotWhole | ErrorKind::ImportFailed => 500,
            ErrorKind::Engine | ErrorKind::State => 503,
            ErrorKind::Interrupted | ErrorKind::Terminated => 503,
        }
    }
}

/// The cause an [`ApiError`] carries: the typed error it was made from.
/// Shared (`Arc`) so that a reply holding an error stays `Clone`.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

// The message is the whole sentence a person reads: the wire (the owner's
// socket, the JSON API, docs/openapi.json) carries only `{kind, message}`,
// never the cause; `source` keeps the typed error it arose from in process,
// for logs and for callers that look into it. Equality is by kind and
// message.
/// An error of any command: its kind and what was being done.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    #[serde(skip)]
    #[schema(ignore)]
    pub source: Option<Cause>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The source is the typed error itself, not its `Arc` (whose own
/// `source` would skip it): a caller can downcast it, and a chain walked
/// from here names each cause once.
impl std::error::Error for ApiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl PartialEq for ApiError {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.message == other.message
    }
}

impl Eq for ApiError {}

impl ApiError {
    /// An error that arises here, with no cause below it.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// An error of `kind` caused by `source`, whose own words are the message.
    pub fn caused(kind: ErrorKind, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self {
            kind,
            message: source.to_string(),
            source: Some(Arc::new(source)),
        }
    }

    /// An error made from a typed one: the kind its type decides, its
    /// words, and itself as the cause.
    pub fn of<E>(source: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
        for<'a> &'a E: Into<ErrorKind>,
    {
        let kind = (&source).into();
        Self::caused(kind, source)
    }

    /// The same error with what was being done said first
    /// (`building the image: ...`).
    pub fn doing(mut self, doing: impl std::fmt::Display) -> Self {
        self.message = format!("{doing}: {}", self.message);
        self
    }

    pub fn exit_code(&self) -> i32 {
        self.kind.exit_code()
    }

    pub fn http_status(&self) -> u16 {
        self.kind.http_status()
    }
}

// The kind of each typed error, decided by its variant where it arises;
// `From` for `ApiError` below keeps the error itself as the cause.

impl From<&StoreError> for ErrorKind {
    fn from(e: &StoreError) -> Self {
        match e.kind() {
            StoreErrorKind::NotFound => ErrorKind::NotFound,
            // A duplicate id: retrying the same request cannot help.
            StoreErrorKind::Conflict => ErrorKind::Failed,
            StoreErrorKind::Busy
            | StoreErrorKind::DiskFull
            | StoreErrorKind::Corrupt
            | StoreErrorKind::Backend => ErrorKind::State,
        }
    }
}

impl From<&EngineError> for ErrorKind {
    fn from(e: &EngineError) -> Self {
        match e {
            EngineError::ImageMissing(_) => ErrorKind::ImageMissing,
            EngineError::Unreachable { .. } | EngineError::Lost { .. } => ErrorKind::Engine,
            EngineError::Api { .. }
            | EngineError::RemovalInProgress(_)
            | EngineError::Refused(_) => ErrorKind::Internal,
        }
    }
}

impl From<&ImageError> for ErrorKind {
    fn from(e: &ImageError) -> Self {
        match e {
            ImageError::Engine(e) => e.into(),
            ImageError::Io { .. }
            | ImageError::Recipe { .. }
            | ImageError::Malicious { .. }
            | ImageError::IdMismatch { .. } => ErrorKind::Internal,
        }
    }
}

impl From<&PolicyError> for ErrorKind {
    fn from(e: &PolicyError) -> Self {
        match e {
            PolicyError::Refused(_) => ErrorKind::Denied,
            PolicyError::Store(e) => e.into(),
            PolicyError::Load(_) | PolicyError::Replay { .. } | PolicyError::Read { .. } => {
                ErrorKind::BadInput
            }
        }
    }
}

impl From<&OwnerError> for ErrorKind {
    fn from(e: &OwnerError) -> Self {
        match e {
            // The credential is not there, not the owner's, or not readable
            // where the caller said it is.
            OwnerError::NotConfigured
            | OwnerError::Missing
            | OwnerError::Wrong
            | OwnerError::Read { .. } => ErrorKind::Denied,
            OwnerError::Write { .. } => ErrorKind::State,
            OwnerError::Store(e) => e.into(),
        }
    }
}

impl From<&UserError> for ErrorKind {
    fn from(e: &UserError) -> Self {
        match e {
            UserError::Store(e) => e.into(),
            UserError::Hash(_) | UserError::Random(_) => ErrorKind::Internal,
            UserError::BadName(_)
            | UserError::BadRole(_)
            | UserError::ShortPassword(_)
            | UserError::LongPassword => ErrorKind::BadInput,
        }
    }
}

impl From<&RunError> for ErrorKind {
    fn from(e: &RunError) -> Self {
        match e {
            RunError::BadInput(_) | RunError::Policy(_) => ErrorKind::BadInput,
            RunError::Engine(e) => e.into(),
            RunError::Git(_) => ErrorKind::Internal,
            RunError::Refused { .. } => ErrorKind::Refused,
            RunError::Store(e) => e.into(),
            RunError::Frozen(_) => ErrorKind::Frozen,
            RunError::Interrupted { signal, .. } => match signal {
                Stop::Interrupt => ErrorKind::Interrupted,
                Stop::Terminate | Stop::Fenced => ErrorKind::Terminated,
            },
        }
    }
}

impl From<&RetryError> for ErrorKind {
    fn from(e: &RetryError) -> Self {
        match e {
            RetryError::NothingToRetry { .. } => ErrorKind::BadInput,
            RetryError::Store(e) => e.into(),
            RetryError::Failed { .. } => ErrorKind::ImportFailed,
            RetryError::WorktreeGone { .. } | RetryError::Lock { .. } => ErrorKind::Internal,
        }
    }
}

macro_rules! from_typed {
    ($($t:ty),* $(,)?) => {
        $(impl From<$t> for ApiError {
            fn from(e: $t) -> Self {
                ApiError::of(e)
            }
        })*
    };
}

from_typed!(
    StoreError,
    EngineError,
    ImageError,
    PolicyError,
    OwnerError,
    UserError,
    RunError,
    RetryError,
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The table README.md documents, kind by kind.
    #[test]
    fn every_kind_has_its_documented_exit_code_and_status() {
        let table = [
            (ErrorKind::BadInput, 3, 400),
            (ErrorKind::NotFound, 3, 404),
            (ErrorKind::Failed, 1, 409),
            (ErrorKind::Engine, 4, 503),
            (ErrorKind::ImageMissing, 5, 424),
            (ErrorKind::Refused, 6, 422),
            (ErrorKind::State, 7, 503),
            (ErrorKind::Internal, 8, 500),
            (ErrorKind::Denied, 9, 403),
            (ErrorKind::Frozen, 9, 423),
            (ErrorKind::NotWhole, 10, 500),
            (ErrorKind::ImportFailed, 11, 500),
            (ErrorKind::Interrupted, 130, 503),
            (ErrorKind::Terminated, 143, 503),
        ];
        assert_eq!(table.len(), ErrorKind::ALL.len());
        for (kind, code, status) in table {
            assert_eq!(kind.exit_code(), code, "{kind:?}");
            assert_eq!(kind.http_status(), status, "{kind:?}");
        }
    }

    #[test]
    fn no_error_is_a_success_on_either_front_end() {
        for kind in ErrorKind::ALL {
            assert_ne!(kind.exit_code(), exit::OK, "{kind:?}");
            assert_ne!(kind.exit_code(), exit::USAGE, "{kind:?}: 2 is clap's");
            assert!((400..600).contains(&kind.http_status()), "{kind:?}");
        }
    }

    #[test]
    fn the_client_side_and_the_server_side_are_told_apart() {
        // A caller retries a 5xx, never a 4xx: what the request got wrong is 4xx.
        for kind in [
            ErrorKind::BadInput,
            ErrorKind::NotFound,
            ErrorKind::Denied,
            ErrorKind::Frozen,
        ] {
            assert!(kind.http_status() < 500, "{kind:?}");
        }
        for kind in [ErrorKind::State, ErrorKind::Engine, ErrorKind::Internal] {
            assert!(kind.http_status() >= 500, "{kind:?}");
        }
    }

    #[test]
    fn errors_travel_as_json_and_back() {
        let e = ApiError::new(ErrorKind::Frozen, "frozen: maintenance");
        let text = serde_json::to_string(&e).unwrap();
        assert_eq!(text, r#"{"kind":"frozen","message":"frozen: maintenance"}"#);
        assert_eq!(serde_json::from_str::<ApiError>(&text).unwrap(), e);
    }

    /// The kind follows the type (and the site), never the words: each
    /// typed error below says "frozen" or "credential" where its kind is
    /// something else, or lacks them where it is frozen or denied. A kind
    /// read from the message would get every one of them wrong.
    #[test]
    fn the_kind_follows_the_type_not_the_words() {
        let io = || std::io::Error::other("frozen credential");
        let cases: Vec<(ApiError, ErrorKind, i32, u16)> = vec![
            // Frozen and denied without the words.
            (
                ApiError::new(ErrorKind::Frozen, "nothing moves tonight"),
                ErrorKind::Frozen,
                9,
                423,
            ),
            (
                RunError::Frozen("maintenance".into()).into(),
                ErrorKind::Frozen,
                9,
                423,
            ),
            (
                PolicyError::Refused("rule r1 is locked".into()).into(),
                ErrorKind::Denied,
                9,
                403,
            ),
            (
                OwnerError::Read {
                    path: "k".into(),
                    source: std::io::Error::other("gone"),
                }
                .into(),
                ErrorKind::Denied,
                9,
                403,
            ),
            // The words without frozen or denied.
            (
                RunError::BadInput("frozen credential".into()).into(),
                ErrorKind::BadInput,
                3,
                400,
            ),
            (
                StoreError::Conflict("act frozen-credential exists".into()).into(),
                ErrorKind::Failed,
                1,
                409,
            ),
            (
                StoreError::NoSuchRun("frozen".into()).into(),
                ErrorKind::NotFound,
                3,
                404,
            ),
            (
                StoreError::Busy {
                    doing: "reading the credential",
                    source: Box::new(io()),
                }
                .into(),
                ErrorKind::State,
                7,
                503,
            ),
            (
                OwnerError::Store(StoreError::DiskFull {
                    doing: "writing the credential",
                    source: Box::new(io()),
                })
                .into(),
                ErrorKind::State,
                7,
                503,
            ),
            (
                OwnerError::Write {
                    path: "credential".into(),
                    source: io(),
                }
                .into(),
                ErrorKind::State,
                7,
                503,
            ),
            (
                PolicyError::Store(StoreError::NoSuchRun("r".into())).into(),
                ErrorKind::NotFound,
                3,
                404,
            ),
            (
                PolicyError::Replay {
                    index: 3,
                    message: "frozen".into(),
                }
                .into(),
                ErrorKind::BadInput,
                3,
                400,
            ),
            (
                EngineError::Unreachable {
                    endpoint: "unix:///frozen".into(),
                    message: "credential".into(),
                }
                .into(),
                ErrorKind::Engine,
                4,
                503,
            ),
            (
                EngineError::ImageMissing("frozen".into()).into(),
                ErrorKind::ImageMissing,
                5,
                424,
            ),
            (
                EngineError::Refused("frozen".into()).into(),
                ErrorKind::Internal,
                8,
                500,
            ),
            (
                ImageError::Engine(EngineError::Lost {
                    doing: "building".into(),
                    source: Box::new(io()),
                })
                .into(),
                ErrorKind::Engine,
                4,
                503,
            ),
            (
                RunError::Engine(EngineError::ImageMissing("i".into())).into(),
                ErrorKind::ImageMissing,
                5,
                424,
            ),
            (
                RunError::Store(StoreError::NoSuchRun("r".into())).into(),
                ErrorKind::NotFound,
                3,
                404,
            ),
            (
                RunError::Refused {
                    run: "r".into(),
                    failures: "frozen".into(),
                }
                .into(),
                ErrorKind::Refused,
                6,
                422,
            ),
            (
                RunError::Interrupted {
                    run: "r".into(),
                    signal: Stop::Terminate,
                }
                .into(),
                ErrorKind::Terminated,
                143,
                503,
            ),
            (
                UserError::Store(StoreError::Conflict("credential".into())).into(),
                ErrorKind::Failed,
                1,
                409,
            ),
            (
                UserError::ShortPassword(3).into(),
                ErrorKind::BadInput,
                3,
                400,
            ),
            (
                RetryError::Store(StoreError::NoSuchRun("r".into())).into(),
                ErrorKind::NotFound,
                3,
                404,
            ),
        ];
        for (e, kind, code, status) in cases {
            assert_eq!(
                (e.kind, e.exit_code(), e.http_status()),
                (kind, code, status),
                "{e}"
            );
        }
    }

    /// The typed error travels with the kind: a caller in process can see
    /// what it was (and a log its chain), while the wire holds only the
    /// kind and the words.
    #[test]
    fn the_cause_is_kept_in_process_and_left_off_the_wire() {
        let e: ApiError = RunError::Store(StoreError::NoSuchRun("r9".into())).into();
        let source = std::error::Error::source(&e).expect("the cause is kept");
        assert!(matches!(
            source.downcast_ref::<RunError>(),
            Some(RunError::Store(StoreError::NoSuchRun(r))) if r == "r9"
        ));
        let text = serde_json::to_string(&e).unwrap();
        assert_eq!(
            text,
            r#"{"kind":"not_found","message":"no run with id r9"}"#
        );
        let back: ApiError = serde_json::from_str(&text).unwrap();
        assert!(back.source.is_none());
        assert_eq!(back, e, "equal by kind and message");
        assert_eq!(
            ApiError::of(OwnerError::Missing).doing("approving").message,
            format!("approving: {}", OwnerError::Missing)
        );
    }
}
