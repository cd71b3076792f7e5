//! Tier 0 attestation: a pure verdict on a created (not yet started)
//! container, computed from the configuration the engine *reports*, never
//! from the one the supervisor asked for
//! (`orchestrator/supervisor/src/run.rs::tests::privileges_are_refused_before_the_start`,
//! `tests/tests/attestation.rs::a_container_that_breaks_tier0_never_starts`).
//!
//! Invariants:
//! - No I/O: the engine adapter inspects the container and hands the
//!   document here, and the supervisor hands what it read on the host (its
//!   accounts, its mount table) as text; this crate only reads data
//!   (`tests::the_crate_reads_data_and_does_no_io`).
//! - Every property is always listed, pass or fail, in a fixed order
//!   ([`PROPERTY_NAMES`]), so two attestations compare line by line and the
//!   audit entry has the same shape every time.
//! - Fail closed: a value that is absent where the engine always reports one,
//!   or that this crate cannot interpret, fails its property.
//! - `observed` strings are short and hold no secrets: environment variables
//!   are reported by key name only, never by value
//!   (`tests/random_mutations.rs::environment_values_never_reach_the_verdict`).

#![forbid(unsafe_code)]

mod attest;
mod host;
mod inspect;
mod observed;
mod pod;

pub use attest::{
    attest, seccomp_profile_digest, Attestation, Expectations, MountExpectation, Property, Refused,
    DEFAULT_MASKED_PATHS, LATER_ENGINE_MASKED_PATHS, NIGHTSHIFT_MASKED_PATHS, PROPERTY_NAMES,
};
pub use host::{mount_of, Account, HostAccounts, HostObserved, IdClash, MountEntry, SubRange};
pub use inspect::{parse_inspect, parse_inspect_slice, Inspected};
pub use observed::{
    from_docker_inspect, from_podman_inspect, observe, oci_seccomp_matches, parse_podman_inspect,
    EngineKind, ObservedLimits, ObservedMount, ObservedNamespaces, ObservedNetwork,
    ObservedSandbox, OciNamespace, OciSpec, PodmanExtra, PodmanHostConfig, RequestedMount, Rlimit,
    Seccomp, PODMAN_ENV, PODMAN_READ_ONLY_ROOT_TMPFS,
};
pub use pod::{
    attest_pod, denies_all, quantity, PodExpectations, POD_PROPERTY_NAMES, POD_RUN_LABEL,
};

/// Why an inspect document could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    /// The document is not a container-inspect object, or a field the
    /// attestation reads has the wrong type.
    #[error("reading container inspect document at {path}")]
    Malformed {
        /// Dotted path of the offending field (`.` for the document itself).
        path: String,
        #[source]
        source: serde_json::Error,
    },
    /// A Pod is not judged as a container document: `attest_pod` reads it.
    #[error("a Kubernetes Pod is judged by its own properties (attest_pod), not as a container")]
    NotAContainer,
}

#[cfg(test)]
mod tests {
    /// Reads the crate's code (before its tests, comments left out): no
    /// module names a file, a socket, a process, the environment or a clock.
    #[test]
    fn the_crate_reads_data_and_does_no_io() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut checked = 0;
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            checked += 1;
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for word in [
                    "std::fs",
                    "std::io",
                    "std::net",
                    "std::os",
                    "std::process",
                    "std::env",
                    "File::",
                    "OpenOptions",
                    "Instant",
                    "SystemTime",
                ] {
                    assert!(
                        !line.contains(word),
                        "{} names {word}: {line}",
                        path.display()
                    );
                }
            }
        }
        assert!(checked >= 4, "only {checked} modules were read");
    }
}
