//! `nightshift execute`: the act executor in the foreground, one pass over
//! what is executable now or, with `watch`, passes until the process ends
//! (what `serve` runs in a task): see `acts::executor`'s note.

use std::sync::Arc;

use crate::acts::executor::Pass;
use crate::api::{Api, ApiError, ErrorKind};

/// Runs the executor over one connection to the store, with leases of
/// `lease_secs`; `report` is told each pass as it ends. A pass that cannot
/// claim from the store is the state's error.
pub async fn execute(
    api: &Api,
    watch: bool,
    lease_secs: i64,
    report: impl Fn(&Pass) + Send + Sync + 'static,
) -> Result<(), ApiError> {
    let store = api.open_store()?;
    let pass = crate::acts::passes(store, lease_secs, report);
    if watch {
        crate::acts::executor::run(Arc::new(pass)).await;
        return Ok(());
    }
    match tokio::task::spawn_blocking(pass).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(ApiError::new(ErrorKind::State, e)),
        Err(e) => Err(ApiError::new(
            ErrorKind::Internal,
            format!("the executor failed: {e}"),
        )),
    }
}
