//! A dry run's acts, recorded as they would have gone (the gate calls
//! [`record_dry_act`] instead of queueing): the verdict, the deciding rule,
//! the rules that stood aside, the label, the policy generation and the
//! request's digest, with its audit entry in the same transaction; never
//! the act's content (`orchestrator/supervisor/src/acts/mod.rs::a_dry_act_is_recorded_once_without_its_content`).

use sandbox_image_door::message::{Request, Response};

use super::{label_text, repository_key, RunDoor, Seen};
use nightshift_core::audit_log::Event;
use nightshift_core::state_store::StoreError;

/// The ref or endpoint a request names.
pub fn target_of(req: &Request) -> String {
    match req {
        Request::Push { dst_ref, .. } => dst_ref.clone(),
        Request::PullRequest { head, .. } => head.clone(),
        Request::Notify { destination, .. } => destination.clone(),
        Request::Ask { .. } => "morning".into(),
        Request::PolicyCheck { .. } => "policy".into(),
        Request::Result { .. } => "result".into(),
    }
}

pub fn destination_of(req: &Request) -> String {
    match req {
        Request::Push { remote, .. } | Request::PullRequest { remote, .. } => remote.clone(),
        Request::Notify { destination, .. } => destination.clone(),
        Request::Ask { .. } => "morning".into(),
        Request::PolicyCheck { .. } => "policy".into(),
        Request::Result { .. } => "result".into(),
    }
}

/// Records one act of a dry run, as it would have gone. An error answer (a
/// malformed request, a pack that could not be taken) is no act: only its
/// door request is audited, as in a real run.
pub fn record_dry_act<S: nightshift_core::state_store::StateStore + ?Sized>(
    store: &mut S,
    door: &RunDoor,
    req: &Request,
    id: &str,
    seen: &Seen,
    answer: &Response,
) -> Result<(), StoreError> {
    let (would, rule, reason) = match answer {
        Response::Refused { rule, reason } => ("refused", Some(rule.clone()), reason.clone()),
        Response::Queued { .. } => (
            "asked",
            seen.deciding_rule.clone(),
            seen.judgement
                .as_ref()
                .and_then(|j| j.decision.as_ref())
                .map(|d| d.reason.clone())
                .unwrap_or_default(),
        ),
        Response::Done { .. } => (
            "carried",
            seen.deciding_rule.clone(),
            seen.judgement
                .as_ref()
                .and_then(|j| j.decision.as_ref())
                .map(|d| d.reason.clone())
                .unwrap_or_default(),
        ),
        Response::Error { .. } | Response::Asks { .. } => return Ok(()),
    };
    let decision = seen.judgement.as_ref().and_then(|j| j.decision.as_ref());
    let repository = repository_key(&door.repo);
    let args = seen
        .args
        .clone()
        .unwrap_or_else(|| crate::acts::policy_args(req, &repository));
    let stood_aside: Vec<serde_json::Value> = decision
        .map(|d| {
            d.stood_aside
                .iter()
                .map(|s| serde_json::json!({"rule": s.rule.to_string(), "effect": s.effect.to_string(), "missing": s.missing}))
                .collect()
        })
        .unwrap_or_default();
    let record = serde_json::json!({
        "id": id,
        "run": door.run,
        "at": time::OffsetDateTime::now_utc().unix_timestamp(),
        "actor": format!("run-{}", door.run),
        "door": req.door(),
        "repository": repository,
        "destination": destination_of(req),
        "target": target_of(req),
        "args": args,
        "would": would,
        "verdict": decision.map(|d| d.verdict.to_string()),
        "rule": rule,
        "reason": reason,
        "stood_aside": stood_aside,
        "label": label_text(door.content),
        "gate": seen.gate,
        "generation": decision.map(|d| d.generation.to_string()),
        "digest": decision.map(|d| d.digest.to_string()),
    });
    store.put_dry_act(
        id,
        &door.run,
        &record,
        &Event::DryRunAct {
            act: id.to_string(),
            door: req.door().to_string(),
            destination: Some(destination_of(req)),
            would: would.to_string(),
            verdict: decision.map(|d| d.verdict.to_string()),
            rule: record["rule"].as_str().map(str::to_string),
            stood_aside: decision
                .map(|d| {
                    d.stood_aside
                        .iter()
                        .map(|s| format!("{} ({})", s.rule, s.effect))
                        .collect()
                })
                .unwrap_or_default(),
            label: label_text(door.content),
            generation: decision.map(|d| d.generation.to_string()),
            digest: decision.map(|d| d.digest.to_string()),
        },
    )?;
    Ok(())
}
