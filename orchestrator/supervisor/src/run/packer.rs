//! The end-of-run packer: a run's result made where the run was, and taken
//! into the host as a pack (the door's side: `door.rs`, `landing.rs`).
//!
//! At a run's ordinary ending
//! (`tests/tests/result.rs::a_runs_result_arrives_as_a_pack_from_a_sandbox_of_its_own`),
//! once its agent's container is confirmed gone, the supervisor starts `nightshift-result` (a static client of this
//! binary, `sandbox-image/result`) in a sandbox of its own on the run's
//! worktree: the run's image, the run's Tier 0 spec and caps (its wall time
//! at most [`PACKER_BOUND`], its tmpfs as large as its memory cap), the
//! worktree mounted, the door its only way out. The packer imports the
//! worktree exactly as the host's import would into a scratch repository,
//! and sends the result and a pack of what it wrote through the door
//! (`orchestrator_git::pack_result`).
//!
//! Invariants:
//! - The supervisor does not read the worktree by path at such an ending:
//!   the result arrives as a pack and is taken through the act's checked
//!   pack path (`orchestrator_git::take_result`: every object's id
//!   recomputed, nothing referenced but the pack and the base's history,
//!   the claimed shape checked), so what the packer sends is as untrusted
//!   as anything an agent sends
//!   (`tests/tests/result.rs::a_runs_result_arrives_as_a_pack_from_a_sandbox_of_its_own`,
//!   `orchestrator/git/src/import/result.rs::tests::a_result_whose_claims_do_not_hold_is_refused_and_no_ref_is_made`).
//! - The packer's sandbox is attested before it starts, as the run's was;
//!   one that fails is removed unstarted and the import fails
//!   (`run.rs::lifecycle_tests::a_packer_that_fails_its_attestation_is_never_started`).
//! - Only the packer's door takes a result, and only one: an agent's door
//!   refuses a result and audits the attempt
//!   (`tests/tests/result.rs::an_agent_cannot_send_its_own_result`).
//! - Whatever goes wrong (the packer cannot be made or started, fails its
//!   attestation, sends nothing, sends what the host refuses), the import
//!   fails, named, and the worktree is kept: `nightshift import RUN` then
//!   reads it by the hardened host path, a person's choice. That path
//!   (`run::import_into`) also serves the endings where no new sandbox may
//!   start or no supervisor is left: a kill switch, a freeze,
//!   reconciliation of a dead supervisor's run
//!   (`tests/tests/result.rs::a_packer_that_sends_nothing_keeps_the_worktree_for_nightshift_import`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nightshift_core::audit_log::Event;
use nightshift_core::channel::Channels;
use nightshift_core::container_engine::ContainerEngine;
use nightshift_core::state_store::{RunRecord, StateStore};

use super::{chain, judge, land_audited, leave_out_of, Held, ImportFailure, Supervisor};
use crate::acts::RunDoor;
use crate::door::PACKER;
use crate::landing::{Landed, Slot};

/// The longest a packer runs (less when the run's own wall cap is less).
pub const PACKER_BOUND: Duration = Duration::from_secs(15 * 60);

/// Makes the run's result with the packer and lands it in the record (as
/// `run::import_into` does by path); on failure `import_failed` is audited
/// and the worktree is left as it is.
pub(super) async fn import<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    record: &mut RunRecord,
    held: &Held,
    worktree: &Path,
) -> Result<(), ImportFailure> {
    let Some(base) = record.base_commit.clone() else {
        return Ok(());
    };
    if !worktree.exists() {
        return Ok(());
    }
    let made = make(sup, record, held, worktree, &base).await;
    let landed = match made {
        Ok((landed, container, pack_bytes)) => {
            sup.audit(
                &record.id,
                Event::ResultPacked {
                    container,
                    pack_bytes,
                },
                false,
            )
            .map_err(|e| ImportFailure {
                kind: "state",
                message: format!("auditing the result: {e}"),
            })?;
            Ok(landed)
        }
        Err(failure) => Err(failure),
    };
    land_audited(&sup.store, record, worktree, landed).await
}

fn failed(kind: &'static str, message: String) -> ImportFailure {
    ImportFailure { kind, message }
}

/// The packer's channels, door and lease around its sandbox; the result its
/// door took.
async fn make<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    record: &RunRecord,
    held: &Held,
    worktree: &Path,
    base: &str,
) -> Result<(Landed, String, u64), ImportFailure> {
    let id = record.id.clone();
    let paths = sup.paths();
    let (channels, lease) = crate::channels::HostDir::open_leased(&paths, &id, held.caps.lease)
        .map_err(|e| failed("packer", format!("opening the packer's channels: {e}")))?;
    let slot = Arc::new(Slot::default());
    let door = channels.door().map(|listener| {
        crate::door::open(
            &sup.stores,
            RunDoor {
                run: id.clone(),
                repo: PathBuf::from(&record.repo),
                base_commit: base.to_string(),
                content: crate::acts::run_content_label(policies::Confidentiality::Private),
                dry_run: false,
                result: Some(slot.clone()),
            },
            listener,
        )
    });
    // The base the packer stands on, from the host, read-only in its door.
    let (repo, base_owned, dest) = (
        PathBuf::from(&record.repo),
        base.to_string(),
        channels.dir().join("base").join("objects"),
    );
    let based = tokio::task::spawn_blocking(move || {
        orchestrator_git::write_base_objects(&repo, &base_owned, &dest)
    })
    .await;
    let ran = match (&door, based) {
        (Ok(_), Ok(Ok(()))) => sandbox(sup, record, held, worktree, base, channels.as_ref()).await,
        (_, Ok(Err(e))) => Err(failed(
            orchestrator_git::import_failure_kind(&e),
            format!("writing the base's objects for the packer: {}", chain(&e)),
        )),
        (_, Err(e)) => Err(failed(
            "internal",
            format!("writing the base's objects: {e}"),
        )),
        (Err(e), _) => Err(failed("packer", format!("opening the packer's door: {e}"))),
    };
    lease.stop();
    if let Ok(door) = door {
        door.close();
    }
    channels.close();
    crate::door::remove_dir(&paths, &id);
    let (container, code) = ran?;
    match slot.take() {
        Some(Ok((landed, pack_bytes))) => Ok((landed, container, pack_bytes)),
        Some(Err((kind, why))) => Err(failed(
            kind,
            format!("the result the end-of-run packer sent was refused: {why}"),
        )),
        None => Err(failed(
            "packer",
            format!("the end-of-run packer sent no result (it ended with exit code {code})"),
        )),
    }
}

/// Creates, attests, starts and waits for the packer's sandbox, then
/// removes it: its container and exit code.
async fn sandbox<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    record: &RunRecord,
    held: &Held,
    worktree: &Path,
    base: &str,
    channels: &crate::channels::HostDir,
) -> Result<(String, i64), ImportFailure> {
    let id = &record.id;
    let mut caps = held.caps.clone();
    caps.timeout = caps.timeout.min(PACKER_BOUND);
    caps.tmpfs_bytes = caps.tmpfs_bytes.max(caps.memory_bytes);
    let mut command = vec![
        format!("{}/bin/{PACKER}", crate::door::MOUNT),
        "--run-id".into(),
        id.clone(),
        "--base".into(),
        base.to_string(),
    ];
    for glob in leave_out_of(&record.image) {
        command.push("--leave-out".into());
        command.push((*glob).to_string());
    }
    let spec = sup.sandbox_spec(
        channels,
        id,
        &record.image,
        &command,
        worktree.to_path_buf(),
        "",
        &caps,
    );
    let container = sup
        .engine
        .create(&spec)
        .await
        .map_err(|e| failed("packer", format!("creating the packer's sandbox: {e}")))?;
    let ran = async {
        let (attestation, unreadable, _) = judge(sup, &container, worktree, &spec, &held.image_env)
            .await
            .map_err(|e| failed("packer", format!("attesting the packer's sandbox: {e}")))?;
        if let Some(why) = unreadable {
            return Err(failed("packer_refused", why));
        }
        if !attestation.passed() {
            let failures: Vec<String> = attestation
                .failures()
                .map(|p| format!("{} (observed {})", p.name, p.observed))
                .collect();
            return Err(failed(
                "packer_refused",
                format!(
                    "the packer's sandbox failed its attestation: {}",
                    failures.join("; ")
                ),
            ));
        }
        sup.engine
            .start(&container)
            .await
            .map_err(|e| failed("packer", format!("starting the packer: {e}")))?;
        match tokio::time::timeout(caps.timeout, sup.engine.wait(&container)).await {
            Ok(Ok(code)) => Ok(code),
            Ok(Err(e)) => Err(failed("packer", format!("waiting for the packer: {e}"))),
            Err(_) => Err(failed(
                "packer",
                format!(
                    "the end-of-run packer did not finish within {}s",
                    caps.timeout.as_secs()
                ),
            )),
        }
    }
    .await;
    let removed = sup.engine.remove_confirmed(&container).await;
    if let (Ok(()), Some(fleet)) = (&removed, &sup.fleet) {
        sup.engine.release_stats(&fleet.scope(), id).await;
    }
    let code = ran?;
    removed.map_err(|e| failed("packer", format!("removing the packer's sandbox: {e}")))?;
    Ok((container, code))
}
