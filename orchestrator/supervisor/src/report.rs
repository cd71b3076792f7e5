//! Dry-run records and reports.
//!
//! Invariants:
//! - A dry run's act is recorded once, with its audit entry in the same
//!   transaction ([`record_dry_act`]): the verdict it would have had, the
//!   deciding rule, the rules that stood aside, its label, its policy
//!   generation and request digest; never its content (no body, title or
//!   diff: the policy's args are routing only)
//!   (`orchestrator/supervisor/src/acts/mod.rs::a_dry_act_is_recorded_once_without_its_content`,
//!   `tests/tests/dry_run.rs::a_dry_run_answers_as_a_real_run_and_queues_nothing`).
//! - A report ([`build`]) is a function of the store: the runs, caps set
//!   against caps used, and every act (queued, carried out, refused, or a
//!   dry run's) grouped by door, destination and ref or endpoint, groups
//!   with a refusal first, then those a person would have had to review.
//! - Everything an agent chose (refs, endpoints) is data: the text report
//!   prints it through `terminal::line`, the HTML report escapes it
//!   ([`html_escape`]) and loads nothing from elsewhere (no script, no
//!   external style, no image).

use std::collections::BTreeMap;

use serde::Serialize;

use nightshift_core::state_store::{StateStore, Stores};

pub use crate::acts::dry::{destination_of, record_dry_act, target_of};

/// One act in a report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ReportAct {
    pub id: String,
    pub run: String,
    pub door: String,
    pub destination: String,
    /// The ref or endpoint.
    pub target: String,
    /// refused | asked | carried | pending | approved | done | rejected | ...
    pub outcome: String,
    /// A dry run's act.
    pub dry_run: bool,
    pub rule: Option<String>,
    pub reason: String,
}

impl ReportAct {
    fn refused(&self) -> bool {
        self.outcome == "refused"
    }

    /// Would a person have had to look at it? Everything but what was
    /// refused, carried out under a scope, or could not be taken.
    fn for_review(&self) -> bool {
        !matches!(self.outcome.as_str(), "refused" | "carried" | "error")
    }
}

/// Acts with the same door, destination and ref or endpoint.
#[derive(Debug, Clone, Serialize)]
pub struct ReportGroup {
    pub door: String,
    pub destination: String,
    pub target: String,
    pub count: usize,
    pub refused: usize,
    pub for_review: usize,
    pub acts: Vec<ReportAct>,
}

/// One run: its ending, caps set and caps used.
#[derive(Debug, Clone, Serialize)]
pub struct ReportRun {
    pub id: String,
    pub dry_run: bool,
    pub status: String,
    pub reason: Option<String>,
    pub repo: String,
    pub base_ref: String,
    /// Caps set (as the run recorded them).
    pub caps: serde_json::Value,
    /// Figures observed: duration, peak memory, CPU time, acts.
    pub used: serde_json::Value,
}

/// A whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub runs: Vec<ReportRun>,
    /// Groups with a refusal first, then those to review, then the rest.
    pub groups: Vec<ReportGroup>,
    /// How many acts a person would have had to review.
    pub for_review: usize,
    pub refused: usize,
}

fn state_outcome(state: &deferred_queue::State) -> &'static str {
    use deferred_queue::State as S;
    match state {
        S::Pending => "pending",
        S::Approved { .. } | S::Executing { .. } | S::AwaitingRetry { .. } => "approved",
        S::OutcomeUnknown { .. } => "approved",
        S::Stale { .. } => "stale",
        S::Rejected { .. } => "rejected",
        S::Expired { .. } => "expired",
        S::Done { .. } => "done",
        S::Failed { .. } => "failed",
    }
}

/// Builds the report of `runs` from the store.
pub fn build(
    store: &dyn StateStore,
    rules: &policies::RuleSet,
    runs: &[String],
) -> Result<Report, String> {
    let mut out_runs = Vec::new();
    let mut acts: Vec<ReportAct> = Vec::new();
    let rows = crate::acts::rows(store, None).map_err(|e| e.to_string())?;
    for id in runs {
        let run = store.run(id).map_err(|e| e.to_string())?;
        let entries = store.entries_for_run(id).map_err(|e| e.to_string())?;
        let caps = entries
            .iter()
            .find(|e| e.kind == "run_created")
            .and_then(|e| e.body.get("caps").cloned())
            .unwrap_or_default();
        let count = store.count_acts(id).map_err(|e| e.to_string())?;
        let calls: Vec<serde_json::Value> = entries
            .iter()
            .filter(|e| e.kind == "model_call")
            .map(|e| serde_json::Value::Object(e.body.clone()))
            .collect();
        out_runs.push(ReportRun {
            id: run.id.clone(),
            dry_run: run.dry_run,
            status: run.status.clone(),
            reason: run.reason.clone(),
            repo: run.repo.clone(),
            base_ref: run.base_ref.clone(),
            caps,
            used: serde_json::json!({
                "duration_ms": run.duration_ms,
                "peak_memory_bytes": run.peak_memory_bytes,
                "cpu_ns": run.cpu_ns,
                "acts": count,
                "acts_cap": crate::acts::MAX_ACTS_PER_RUN,
                "model": nightshift_gateway::summarize(&calls),
            }),
        });
        for row in rows.iter().filter(|r| &r.act.run == id) {
            let target = match &row.act.routing.target {
                deferred_queue::Target::Push { target_ref, .. } => target_ref.clone(),
                deferred_queue::Target::PullRequest { head_ref, .. } => head_ref.clone(),
                deferred_queue::Target::Message { endpoint } => endpoint.clone(),
            };
            let reason = match &row.state {
                deferred_queue::State::Stale { why } | deferred_queue::State::Expired { why } => {
                    why.clone()
                }
                deferred_queue::State::Rejected { why, .. } => format!("rejected: {why}"),
                deferred_queue::State::Failed { reason, .. } => reason.clone(),
                deferred_queue::State::Done { outcome, .. } => outcome.clone(),
                _ => String::new(),
            };
            acts.push(ReportAct {
                id: row.act.id.clone(),
                run: row.act.run.clone(),
                door: row.act.door.name().to_string(),
                destination: row.act.routing.destination.clone(),
                target,
                outcome: match (&row.state, row.act.deciding_rules.first()) {
                    (deferred_queue::State::Done { .. }, Some(rule))
                        if crate::scopes::was_scope(rules, rule) =>
                    {
                        "carried".to_string()
                    }
                    (state, _) => state_outcome(state).to_string(),
                },
                dry_run: false,
                rule: row.act.deciding_rules.first().cloned(),
                reason,
            });
        }
        // Requests refused at the door of a real run (no act exists).
        if !run.dry_run {
            for r in crate::acts::refusals(store, Some(id)).map_err(|e| e.to_string())? {
                acts.push(ReportAct {
                    id: format!("refused@{}", r.time),
                    run: r.run.clone(),
                    door: r.door.clone(),
                    destination: r.destination.clone().unwrap_or_default(),
                    target: String::new(),
                    outcome: if r.verdict == "error" {
                        "error".into()
                    } else {
                        "refused".into()
                    },
                    dry_run: false,
                    rule: r.rule.clone(),
                    reason: String::new(),
                });
            }
        }
        for d in store.dry_acts(Some(id)).map_err(|e| e.to_string())? {
            let text = |k: &str| {
                d.get(k)
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string()
            };
            acts.push(ReportAct {
                id: text("id"),
                run: text("run"),
                door: text("door"),
                destination: text("destination"),
                target: text("target"),
                outcome: text("would"),
                dry_run: true,
                rule: d.get("rule").and_then(|v| v.as_str()).map(str::to_string),
                reason: text("reason"),
            });
        }
    }
    let mut groups: BTreeMap<(String, String, String), Vec<ReportAct>> = BTreeMap::new();
    for a in acts {
        groups
            .entry((a.door.clone(), a.destination.clone(), a.target.clone()))
            .or_default()
            .push(a);
    }
    let mut groups: Vec<ReportGroup> = groups
        .into_iter()
        .map(|((door, destination, target), acts)| ReportGroup {
            door,
            destination,
            target,
            count: acts.len(),
            refused: acts.iter().filter(|a| a.refused()).count(),
            for_review: acts.iter().filter(|a| a.for_review()).count(),
            acts,
        })
        .collect();
    groups.sort_by_key(|g| (g.refused == 0, g.for_review == 0));
    Ok(Report {
        for_review: groups.iter().map(|g| g.for_review).sum(),
        refused: groups.iter().map(|g| g.refused).sum(),
        runs: out_runs,
        groups,
    })
}

/// Escapes text for HTML element content and attribute values.
pub fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() || nightshift_core::terminal::is_hidden(c) => {
                out.push_str(&format!("&#x{:x};", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

/// The report as text lines (untrusted values through `terminal::line`).
pub fn text(report: &Report) -> Vec<String> {
    use nightshift_core::terminal::line;
    let mut out = Vec::new();
    for r in &report.runs {
        out.push(format!(
            "run {}{}: {}{} (repo {} at {})",
            line(&r.id),
            if r.dry_run { " (dry run)" } else { "" },
            line(&r.status),
            r.reason
                .as_deref()
                .map(|w| format!(" - {}", line(w)))
                .unwrap_or_default(),
            line(&r.repo),
            line(&r.base_ref)
        ));
        out.extend(
            used_against_set(&r.caps, &r.used)
                .into_iter()
                .map(|l| format!("  {l}")),
        );
    }
    out.push(format!(
        "acts: {} refused, {} a person would have had to review",
        report.refused, report.for_review
    ));
    for g in &report.groups {
        out.push(format!(
            "{} to {} {}: {} act(s), {} refused, {} to review",
            line(&g.door),
            line(&g.destination),
            line(if g.target.is_empty() { "-" } else { &g.target }),
            g.count,
            g.refused,
            g.for_review
        ));
        for a in &g.acts {
            out.push(format!(
                "  {} {}{} [{}]{}",
                line(&a.id),
                line(&a.outcome),
                if a.dry_run { " (dry run)" } else { "" },
                line(a.rule.as_deref().unwrap_or("-")),
                if a.reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", line(&a.reason))
                }
            ));
        }
    }
    out
}

/// A span for people: `850 ms`, `12.3 s`, `4 min 05 s`, `2 h 00 min`.
pub fn duration_text(ms: u64) -> String {
    let s = ms / 1000;
    if ms < 1000 {
        format!("{ms} ms")
    } else if s < 60 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else if s < 3600 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else {
        format!("{} h {:02} min", s / 3600, (s % 3600) / 60)
    }
}

/// A count for people: `2,000,000`.
pub fn count_text(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A run's caps used against its caps set, one line each (time, memory,
/// CPU, model tokens, acts), in units people read. `caps` is the run's
/// recorded `Caps` (absent figures are left out), `used` the report's.
pub fn used_against_set(caps: &serde_json::Value, used: &serde_json::Value) -> Vec<String> {
    let num = |v: &serde_json::Value| v.as_u64();
    let mut out = Vec::new();
    let timeout_ms = num(&caps["timeout"]["secs"]).map(|s| s * 1000);
    if let Some(ms) = num(&used["duration_ms"]) {
        out.push(match timeout_ms {
            Some(t) => format!("time:   {} of {}", duration_text(ms), duration_text(t)),
            None => format!("time:   {}", duration_text(ms)),
        });
    }
    let memory = num(&caps["memory_bytes"]).map(nightshift_core::monitor::mib);
    if let Some(peak) = num(&used["peak_memory_bytes"]) {
        let peak = nightshift_core::monitor::mib(peak);
        out.push(match memory {
            Some(m) => format!("memory: peak {peak} of {m}"),
            None => format!("memory: peak {peak}"),
        });
    }
    if let Some(ns) = num(&used["cpu_ns"]) {
        let cpus = num(&caps["nano_cpus"])
            .map(|n| format!(" (cap {} cpus)", n as f64 / 1e9))
            .unwrap_or_default();
        out.push(format!("cpu:    {}{cpus}", duration_text(ns / 1_000_000)));
    }
    let model = &used["model"];
    if num(&model["calls"]).unwrap_or(0) > 0 || caps.get("max_tokens").is_some() {
        let cap = num(&caps["max_tokens"])
            .map(|c| format!(" of {}", count_text(c)))
            .unwrap_or_default();
        out.push(format!(
            "tokens: {}{cap} ({} calls, {} refused; input {}, output {}, cached {})",
            count_text(num(&model["charged_tokens"]).unwrap_or(0)),
            num(&model["calls"]).unwrap_or(0),
            num(&model["refused"]).unwrap_or(0),
            count_text(num(&model["input_tokens"]).unwrap_or(0)),
            count_text(num(&model["output_tokens"]).unwrap_or(0)),
            count_text(num(&model["cached_tokens"]).unwrap_or(0)),
        ));
    }
    if let Some(acts) = num(&used["acts"]) {
        out.push(format!(
            "acts:   {acts} of {}",
            num(&used["acts_cap"]).unwrap_or(0)
        ));
    }
    out
}

/// The report as one self-contained HTML page.
pub fn html(report: &Report) -> String {
    let e = html_escape;
    let mut h = String::from(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n\
         <title>nightshift report</title>\n<style>body{font-family:sans-serif;margin:2em}\
         table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}\
         .refused{background:#fdd}.review{background:#ffd}</style></head><body>\n<h1>nightshift report</h1>\n",
    );
    h.push_str(&format!(
        "<p>{} refused; {} a person would have had to review.</p>\n<h2>Runs</h2>\n<table><tr><th>run</th><th>status</th><th>repository</th><th>caps set</th><th>caps used</th></tr>\n",
        report.refused, report.for_review
    ));
    for r in &report.runs {
        h.push_str(&format!(
            "<tr><td>{}{}</td><td>{}</td><td>{} at {}</td><td>{}</td><td>{}</td></tr>\n",
            e(&r.id),
            if r.dry_run { " (dry run)" } else { "" },
            e(&r.status),
            e(&r.repo),
            e(&r.base_ref),
            e(&r.caps.to_string()),
            e(&used_against_set(&r.caps, &r.used).join("; "))
        ));
    }
    h.push_str("</table>\n<h2>Acts</h2>\n");
    for g in &report.groups {
        let class = if g.refused > 0 {
            "refused"
        } else if g.for_review > 0 {
            "review"
        } else {
            ""
        };
        h.push_str(&format!(
            "<h3 class=\"{class}\">{} to {} {}</h3>\n<table><tr><th>act</th><th>outcome</th><th>rule</th><th>reason</th></tr>\n",
            e(&g.door),
            e(&g.destination),
            e(&g.target)
        ));
        for a in &g.acts {
            h.push_str(&format!(
                "<tr><td>{}</td><td>{}{}</td><td>{}</td><td>{}</td></tr>\n",
                e(&a.id),
                e(&a.outcome),
                if a.dry_run { " (dry run)" } else { "" },
                e(a.rule.as_deref().unwrap_or("-")),
                e(&a.reason)
            ));
        }
        h.push_str("</table>\n");
    }
    h.push_str("</body></html>\n");
    h
}

/// The report's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
    Html,
}

/// `nightshift report RUN... [--format text|json|html]`.
pub fn cli(stores: &Stores, runs: &[String], format: Format) -> Result<i32, i32> {
    let fail = |code: i32, e: &dyn std::fmt::Display| {
        nightshift_core::terminal::err(format_args!("nightshift: {e}\n"));
        code
    };
    let store = stores
        .connect()
        .map_err(|e| fail(nightshift_core::exit::STATE, &e))?;
    for id in runs {
        store
            .run(id)
            .map_err(|e| fail(nightshift_core::exit::BAD_INPUT, &e))?;
    }
    let rules = nightshift_core::policy::load(&store, None)
        .map_err(|e| fail(nightshift_core::exit::STATE, &e))?;
    let report = build(&store, &rules, runs).map_err(|e| fail(nightshift_core::exit::STATE, &e))?;
    match format {
        Format::Json => nightshift_core::terminal::out(format_args!(
            "{}\n",
            nightshift_core::terminal::json(&report, true)
        )),
        Format::Html => nightshift_core::terminal::out(format_args!("{}", html(&report))),
        Format::Text => {
            for l in text(&report) {
                nightshift_core::terminal::out(format_args!("{l}\n"));
            }
        }
    }
    Ok(nightshift_core::exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Nothing an agent names can open a tag, an attribute or an entity.
        #[test]
        fn escaped_text_holds_no_markup(text in any::<String>()) {
            let out = html_escape(&text);
            prop_assert!(!out.contains('<') && !out.contains('>') && !out.contains('"') && !out.contains('\''));
            // Every `&` starts one of our entities.
            for (i, _) in out.match_indices('&') {
                let rest = &out[i..];
                prop_assert!(
                    rest.starts_with("&amp;") || rest.starts_with("&lt;") || rest.starts_with("&gt;")
                        || rest.starts_with("&quot;") || rest.starts_with("&#"),
                    "{}", rest
                );
            }
        }
    }

    #[test]
    fn durations_and_token_use_read_as_people_read_them() {
        assert_eq!(duration_text(850), "850 ms");
        assert_eq!(duration_text(12_345), "12.3 s");
        assert_eq!(duration_text(245_000), "4 min 05 s");
        assert_eq!(duration_text(7_200_000), "2 h 00 min");
        assert_eq!(count_text(0), "0");
        assert_eq!(count_text(999), "999");
        assert_eq!(count_text(2_000_000), "2,000,000");
        let caps = serde_json::json!({
            "timeout": {"secs": 7200, "nanos": 0}, "memory_bytes": 2u64 << 30,
            "nano_cpus": 1_000_000_000u64, "max_tokens": 2_000_000u64,
        });
        let used = serde_json::json!({
            "duration_ms": 245_000, "peak_memory_bytes": 3u64 << 20, "cpu_ns": 1_500_000_000u64,
            "acts": 2, "acts_cap": 200,
            "model": {"calls": 3, "refused": 1, "charged_tokens": 12_345, "input_tokens": 10_000,
                      "output_tokens": 2_345, "cached_tokens": 0},
        });
        let lines = used_against_set(&caps, &used);
        assert_eq!(
            lines,
            [
                "time:   4 min 05 s of 2 h 00 min",
                "memory: peak 3.0 MiB of 2048 MiB",
                "cpu:    1.5 s (cap 1 cpus)",
                "tokens: 12,345 of 2,000,000 (3 calls, 1 refused; input 10,000, output 2,345, cached 0)",
                "acts:   2 of 200",
            ]
        );
    }

    #[test]
    fn a_hostile_ref_is_shown_as_text() {
        let report = Report {
            runs: vec![],
            groups: vec![ReportGroup {
                door: "push".into(),
                destination: "origin".into(),
                target: "refs/heads/<script>alert(1)</script>".into(),
                count: 1,
                refused: 0,
                for_review: 1,
                acts: vec![],
            }],
            for_review: 1,
            refused: 0,
        };
        let page = html(&report);
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;"));
        assert!(!page.contains("src=") && !page.contains("href="));
    }
}
