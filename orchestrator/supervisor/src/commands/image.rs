//! `nightshift image build --service` / `--postgres`: the hosted
//! deployment's images (`nightshift_engine_docker::hosted_image`), built in
//! the local engine; the service image holds the running binary (it is
//! one file; its libraries are Debian's, and the recipe runs it once inside
//! the image so a binary that cannot run there fails the build).

use nightshift_core::state_store::StatePaths;
pub use nightshift_engine_docker::hosted_image::Hosted;

use crate::api::{Api, ApiError, ErrorKind};

/// Builds `which` unless the engine holds it; returns its reference.
pub async fn build_hosted(
    api: &Api,
    mirror: &str,
    which: Hosted,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<String, ApiError> {
    let binary = std::env::current_exe().map_err(|e| {
        ApiError::new(
            ErrorKind::Internal,
            format!("finding the running binary to copy into the image: {e}"),
        )
    })?;
    let engine = nightshift_engine_docker::engine::Engine::connect().await?;
    let paths = StatePaths::new(api.root().to_path_buf());
    nightshift_engine_docker::hosted_image::build(
        &engine,
        &paths.image_build(),
        mirror,
        which,
        &binary,
        |l| progress(l),
    )
    .await
    .map_err(|e| {
        ApiError::of(e).doing(match which {
            Hosted::Service => "building the service image",
            Hosted::Postgres => "building the PostgreSQL image",
        })
    })
}
