//! One error type for every front end. An [`ApiError`] is a kind and a
//! lowercase message saying what was being done; the kind alone decides the
//! exit code of the command line (README.md, "Exit codes") and the HTTP
//! status of the JSON API, through the two pure functions below, so the two
//! front ends can never disagree on what an error means.

use serde::{Deserialize, Serialize};

use crate::exit;

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

/// An error of any command: its kind and what was being done.
#[derive(
    Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize, utoipa::ToSchema,
)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn exit_code(&self) -> i32 {
        self.kind.exit_code()
    }

    pub fn http_status(&self) -> u16 {
        self.kind.http_status()
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        let kind = match e {
            crate::store::StoreError::NoSuchRun(_) => ErrorKind::NotFound,
            _ => ErrorKind::State,
        };
        ApiError::new(kind, e.to_string())
    }
}

impl From<crate::engine::EngineError> for ApiError {
    fn from(e: crate::engine::EngineError) -> Self {
        use crate::engine::EngineError;
        let kind = match e {
            EngineError::ImageMissing(_) => ErrorKind::ImageMissing,
            EngineError::Unreachable { .. } | EngineError::Lost { .. } => ErrorKind::Engine,
            _ => ErrorKind::Internal,
        };
        ApiError::new(kind, e.to_string())
    }
}

impl From<crate::policy::PolicyError> for ApiError {
    fn from(e: crate::policy::PolicyError) -> Self {
        use crate::policy::PolicyError;
        let kind = match e {
            PolicyError::Refused(_) => ErrorKind::Denied,
            PolicyError::Store(_) => ErrorKind::State,
            _ => ErrorKind::BadInput,
        };
        ApiError::new(kind, e.to_string())
    }
}

impl From<crate::run::RunError> for ApiError {
    fn from(e: crate::run::RunError) -> Self {
        use crate::engine::EngineError;
        use crate::run::{RunError, Stop};
        let kind = match &e {
            RunError::BadInput(_) | RunError::Policy(_) => ErrorKind::BadInput,
            RunError::Engine(EngineError::ImageMissing(_)) => ErrorKind::ImageMissing,
            RunError::Engine(EngineError::Unreachable { .. } | EngineError::Lost { .. }) => {
                ErrorKind::Engine
            }
            RunError::Engine(_) | RunError::Git(_) => ErrorKind::Internal,
            RunError::Refused { .. } => ErrorKind::Refused,
            RunError::Store(crate::store::StoreError::NoSuchRun(_)) => ErrorKind::NotFound,
            RunError::Store(_) => ErrorKind::State,
            RunError::Frozen(_) => ErrorKind::Frozen,
            RunError::Interrupted { signal, .. } => match signal {
                Stop::Interrupt => ErrorKind::Interrupted,
                Stop::Terminate => ErrorKind::Terminated,
            },
        };
        ApiError::new(kind, e.to_string())
    }
}

/// The queue adapter's errors are text; these words are how it says the
/// owner's credential or the freeze stopped it (`acts::approve`, `reject`,
/// `rebind`), which the command line has always answered with exit 9.
pub fn from_act_error(message: String) -> ApiError {
    let kind = if message.contains("frozen") {
        ErrorKind::Frozen
    } else if message.contains("credential") {
        ErrorKind::Denied
    } else {
        ErrorKind::Failed
    };
    ApiError::new(kind, message)
}

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

    #[test]
    fn the_queue_adapters_words_keep_their_exit_codes() {
        assert_eq!(
            from_act_error("nightshift is frozen: x".into()).exit_code(),
            9
        );
        assert_eq!(
            from_act_error("the owner's credential is wrong".into()).exit_code(),
            9
        );
        assert_eq!(from_act_error("act a: stale".into()).exit_code(), 1);
    }
}
