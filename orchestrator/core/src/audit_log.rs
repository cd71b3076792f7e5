//! The typed audit events the supervisor records.
//!
//! Invariant: an event holds no content. Ids, digests, sizes, counts, labels,
//! rule ids, paths and the supervisor's own observations only; never file
//! contents, task text, agent output, or environment values. Each variant's
//! fields are the whole of what can reach the chain, so review happens here
//! (`tests::run_created_carries_digests_not_text`,
//! `tests/tests/run.rs::the_audit_holds_no_content`).

use serde::Serialize;

/// One observed fact, as it is written into the chain.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    RunCreated {
        repo: String,
        base_ref: String,
        base_commit: String,
        image: String,
        image_id: String,
        /// sha256 of the command's arguments (NUL-joined), never the arguments.
        command_digest: String,
        /// sha256 of the task text, and its size: the text itself stays out.
        task_digest: String,
        task_bytes: usize,
        caps: serde_json::Value,
    },
    WorktreeCreated {
        path: String,
        branch: String,
        base_commit: String,
        base_tree: String,
    },
    Attestation {
        passed: bool,
        container: String,
        /// The engine whose report was judged (`docker`, `podman`);
        /// absent in entries written before engines were named.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        engine: Option<String>,
        /// The OCI runtime the engine reported (empty: its default).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        runtime: Option<String>,
        properties: serde_json::Value,
        /// The setup cache mounted into the sandbox (docs/setup.md): its
        /// key, digest, and whether the engine reports the mount read-only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        setup_cache: Option<serde_json::Value>,
    },
    /// The run's setup phase (docs/setup.md): `built` (setup ran),
    /// `reused` (the key's cache existed: setup skipped), `last-trusted`
    /// (an agent-written base: the repository's last trusted cache,
    /// setup skipped), `failed`, `refused` or `interrupted` (the run was
    /// asked to stop while setup ran; setup killed): the agent never started.
    Setup {
        outcome: String,
        repository: String,
        command: String,
        key: Option<String>,
        digest: Option<String>,
        bytes: Option<u64>,
        /// The commit setup ran on (or the cache was built on).
        commit: Option<String>,
        trusted: Option<bool>,
        container: Option<String>,
        exit_code: Option<i64>,
        duration_ms: Option<i64>,
        output_bytes: Option<u64>,
    },
    /// Lockfiles the agent changed (paths): the cache was not refreshed
    /// during the night; the next run on a base holding them builds anew.
    DependenciesChanged {
        paths: Vec<String>,
    },
    Started {
        container: String,
    },
    Exited {
        exit_code: Option<i64>,
        oom_killed: bool,
        ended_by: String,
        duration_ms: i64,
        peak_memory_bytes: Option<i64>,
        cpu_ns: Option<i64>,
        output_bytes: u64,
        output_kept_bytes: u64,
    },
    ObservedState {
        agent_tip: String,
        observed_commit: Option<String>,
        tree: String,
        files_changed: u64,
        insertions: u64,
        deletions: u64,
        skipped: Vec<serde_json::Value>,
    },
    Imported {
        reference: String,
        commit: String,
    },
    /// The run's result was made by the end-of-run packer, in a sandbox of
    /// its own started after the agent's was gone, and taken from the pack
    /// it sent through the door: the packer's container and the pack's size.
    ResultPacked {
        container: String,
        pack_bytes: u64,
    },
    /// The agent's commits were left out of the import (its working files
    /// came back, observed on top of the base commit): why (a kind such as
    /// `object_too_large`), the object and the figures concerned.
    HistoryDropped {
        reason: String,
        object: Option<String>,
        size: Option<u64>,
        limit: Option<u64>,
    },
    /// The import could not complete (the host's side, a kind such as
    /// `host_locked`); the worktree is kept at `worktree` for `nightshift import`.
    ImportFailed {
        reason: String,
        worktree: String,
    },
    ContainerRemoved {
        container: String,
    },
    WorktreeRemoved {
        path: String,
    },
    RunEnded {
        status: String,
        reason: Option<String>,
    },
    /// Resource figures the supervisor sampled from the sandbox's cgroup.
    Resources {
        memory_bytes: Option<u64>,
        memory_peak_bytes: Option<u64>,
        cpu_ns: Option<u64>,
        pids: Option<u64>,
        max_open_files: Option<u64>,
        worktree_bytes: Option<u64>,
    },
    /// A cap was passed and the run killed for it.
    CapBreached {
        cap: String,
        limit: u64,
        observed: u64,
    },
    /// The kill switch was used on a run.
    KillRequested {
        by: String,
        container: Option<String>,
    },
    /// A run whose supervisor vanished was found and settled.
    Reconciled {
        by: String,
        containers: Vec<String>,
        status: String,
    },
    /// A request at a run's door, and what the gate answered.
    DoorRequest {
        door: String,
        destination: Option<String>,
        verdict: String,
        rule: Option<String>,
        act: Option<String>,
        /// sha256 of the request's canonical form, never its content.
        digest: String,
        bytes: u64,
        /// The label of the run's content (`untrusted, private`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        label: Option<String>,
        /// The label gate's reason (`clear`, `untrusted_content`, `refused`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gate: Option<String>,
        /// Why a request that never became one (verdict `error`) was
        /// refused: a fixed code (`malformed_json`, `oversized`,
        /// `too_slow`, `pack`, ...; `acts::REASONS`), never the request's text.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A transition of a queued act (content-free fields from the queue).
    Act {
        act: String,
        transition: String,
        fields: serde_json::Value,
    },
    /// A refuse or ask of the policy engine (allows are not audited by the hook).
    PolicyDecision {
        actor: Option<String>,
        door: String,
        verdict: String,
        rule: String,
        escalated: bool,
        stood_aside: Vec<String>,
        generation: String,
        /// sha256 of the request's canonical encoding, never its arguments.
        digest: String,
    },
    /// A dry run's act: what it would have had (no content).
    DryRunAct {
        act: String,
        door: String,
        destination: Option<String>,
        /// refused | asked | carried.
        would: String,
        /// allow | ask | refuse, the policy's (absent when refused before it).
        verdict: Option<String>,
        rule: Option<String>,
        stood_aside: Vec<String>,
        label: String,
        generation: Option<String>,
        /// sha256 of the policy request's canonical encoding.
        digest: Option<String>,
    },
    /// The owner adopted an autonomy-scope proposal: its rule rows follow.
    ScopeAdopted {
        proposal: String,
        door: String,
        repository: String,
        destination: String,
        pattern: Option<String>,
        retired: Vec<String>,
        declared: Vec<String>,
        evidence_acts: usize,
        evidence_approved: usize,
        delta: usize,
        generation: String,
    },
    /// The morning summary went out to the owner's notify alias, or failed
    /// to: the alias, how many runs it covered, the message's digest and
    /// size (never its text), and `sent` or `failed` (the reason stays in
    /// the supervisor's log: an endpoint's error may echo its URL).
    SummarySent {
        notify: String,
        runs: usize,
        outcome: String,
        message_digest: String,
        message_bytes: usize,
    },
    /// The owner refused an autonomy-scope proposal (not offered again).
    ScopeRefused {
        proposal: String,
        why: String,
    },
    /// A policy row written at run time (declare, retire, propose, ratify, freeze, thaw...).
    PolicyRow {
        row: String,
        subject: String,
        author: String,
        generation: String,
        /// Rules a freeze suspended, by id.
        suspended: Vec<String>,
    },
    /// The owner asked to continue this run, which a cap ended (`cap`: a
    /// fixed name, `tokens`, `wall-clock`, `output`, `worktree`): `task` is
    /// the queued task that will run the continuation, `by` who asked.
    ContinueQueued {
        task: String,
        cap: String,
        by: String,
    },
    /// This run continues `run` (a capped run), from its result ref.
    Continues {
        run: String,
    },
    /// `run` continues this run (written when `run` is created).
    ContinuedAs {
        run: String,
    },
    /// One call through the run's model gateway (`nightshift_gateway`): where it
    /// went and what it cost, never the request's or the response's text.
    /// `model` is set only for a call routed to a configured endpoint (so it
    /// matched one of the owner's globs); a refused request's model is not
    /// recorded, being the agent's text.
    ModelCall {
        endpoint: Option<String>,
        model: Option<String>,
        /// `chat`, `responses` or `messages`.
        shape: Option<String>,
        stream: bool,
        /// The HTTP status the sandbox got.
        status: u16,
        /// `ok`, `refused:<kind>`, `no_usage`, `idle_timeout`, `line_too_long`, ...
        outcome: String,
        input_tokens: Option<u64>,
        output_tokens: Option<u64>,
        cached_tokens: Option<u64>,
        /// Reserved before forwarding, and charged after (the usage, or the
        /// whole reservation when no usage came).
        reserved_tokens: u64,
        charged_tokens: u64,
        /// The run's tokens after this call, and its cap.
        run_tokens: u64,
        run_token_cap: u64,
        latency_ms: u64,
        first_byte_ms: Option<u64>,
        request_bytes: u64,
        request_digest: String,
        response_bytes: u64,
        response_digest: String,
        /// The label of the call's output: the join of the labels of what
        /// the run's context held (`acts::run_content_label`), as the
        /// run's acts carry it (`untrusted, private`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        label: Option<String>,
    },
}

impl Event {
    /// The entry's kind and its body (the event's fields without the tag).
    pub fn kind_and_body(&self) -> (String, serde_json::Value) {
        let mut value = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        let kind = value
            .as_object_mut()
            .and_then(|o| o.remove("kind"))
            .and_then(|k| k.as_str().map(str::to_string))
            .unwrap_or_else(|| "unknown".to_string());
        (kind, value)
    }
}

/// Hex sha256, the digest every content-bearing value is replaced by.
pub fn digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_no_tag_and_kind_is_snake_case() {
        let (kind, body) = Event::Started {
            container: "abc".into(),
        }
        .kind_and_body();
        assert_eq!(kind, "started");
        assert_eq!(body, serde_json::json!({"container": "abc"}));
    }

    #[test]
    fn run_created_carries_digests_not_text() {
        let task = "rewrite the parser; secret plan";
        let (_, body) = Event::RunCreated {
            repo: "/r".into(),
            base_ref: "HEAD".into(),
            base_commit: "c".into(),
            image: "i".into(),
            image_id: "sha256:x".into(),
            command_digest: digest(b"sh\0-c"),
            task_digest: digest(task.as_bytes()),
            task_bytes: task.len(),
            caps: serde_json::json!({}),
        }
        .kind_and_body();
        let text = body.to_string();
        assert!(!text.contains("secret plan"));
        assert!(text.contains(&digest(task.as_bytes())));
    }
}
