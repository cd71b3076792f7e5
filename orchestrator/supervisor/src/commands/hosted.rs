//! Hosted mode's check before `serve` or `worker` starts: what the
//! configuration is, observed here (the store's setting, the listener, the
//! owner accounts in the store, the secret files' owner and mode), decided
//! by `nightshift_core::hosted::refusals` (pure).
//!
//! Invariants:
//! - Every refusal is said, not only the first, each naming what and where;
//!   any refusal stops the process before it listens, runs or starts a
//!   watchdog (`tests/tests/hosted.rs::the_hosted_binary_refuses_bad_configuration_naming_it`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nightshift_core::hosted::{refusals, FileSeen, Observed, SecretFile};
pub use nightshift_core::hosted::{Dashboard, Role, Setting};

use crate::api::{Api, ApiError, ErrorKind};

/// What the binary knows of how it was started.
#[derive(Debug, Clone)]
pub struct Start {
    pub role: Role,
    pub store: Option<Setting>,
    pub dashboard: Option<Dashboard>,
    /// `serve`'s `--tls-key`.
    pub tls_key: Option<PathBuf>,
    /// `NIGHTSHIFT_STORE_FILE`, when the store's URL came from a file.
    pub store_file: Option<PathBuf>,
}

fn seen(path: &Path) -> FileSeen {
    match std::fs::metadata(path) {
        Err(e) => FileSeen::Missing(e.to_string()),
        Ok(m) => FileSeen::Present {
            regular: m.is_file(),
            uid: m.uid(),
            gid: m.gid(),
            mode: m.mode(),
        },
    }
}

/// Checks the configuration a hosted process starts with; the error lists
/// every refusal, one a line.
pub fn check(api: &Api, start: Start) -> Result<(), ApiError> {
    let mut secrets = Vec::new();
    if let Some(key) = &start.tls_key {
        secrets.push(SecretFile {
            what: "the TLS key".into(),
            named_in: "--tls-key".into(),
            path: key.clone(),
            seen: seen(key),
        });
    }
    if let Some(file) = &start.store_file {
        secrets.push(SecretFile {
            what: "the store URL's file".into(),
            named_in: "NIGHTSHIFT_STORE_FILE".into(),
            path: file.clone(),
            seen: seen(file),
        });
    }
    let mut refused_files = Vec::new();
    let config = api
        .config_path()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| api.root().join("config.toml"));
    for file in [
        config,
        api.root().join("models.toml"),
        api.root().join("destinations.toml"),
    ] {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        match nightshift_core::hosted::secret_paths(&text) {
            Ok(found) => {
                for (key, path) in found {
                    let seen = seen(&path);
                    secrets.push(SecretFile {
                        what: "the secret file".into(),
                        named_in: format!("{} {key}", file.display()),
                        path,
                        seen,
                    });
                }
            }
            Err(e) => refused_files.push(format!("{}: {e}", file.display())),
        }
    }
    let owner_accounts = match start.role {
        Role::Worker => 0,
        Role::Serve => match &start.store {
            // No store: refused below without asking one.
            None => 0,
            Some(_) => api
                .open_store()?
                .users()
                .map_err(ApiError::of)?
                .iter()
                .filter(|(_, role, _)| role == "owner")
                .count(),
        },
    };
    let observed = Observed {
        role: start.role,
        store: start.store,
        dashboard: start.dashboard,
        owner_accounts,
        secrets,
        euid: nix::unistd::geteuid().as_raw(),
        egid: nix::unistd::getegid().as_raw(),
    };
    let mut lines: Vec<String> = refused_files;
    lines.extend(refusals(&observed).into_iter().map(|r| r.0));
    if lines.is_empty() {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorKind::BadInput,
        format!(
            "hosted mode (NIGHTSHIFT_HOSTED) refuses to start:\n  {}",
            lines.join("\n  ")
        ),
    ))
}
