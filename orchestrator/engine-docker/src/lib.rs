//! The Docker engine adapter: the core's `ContainerEngine` port over the
//! Engine API (bollard), the sandbox image's recipe and loading
//! ([`image`]), the lease's host-side end ([`lease`]), and the sandboxes'
//! cap figures from their cgroups ([`stats`]). The only crate
//! that names bollard (`scripts/check-layers.py`), and in it the only
//! module is [`engine`] (`scripts/check-layers.py` too).

pub mod engine;
pub mod hosted_image;
pub mod image;
pub mod lease;
pub mod podman;
pub mod stats;
