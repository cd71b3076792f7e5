//! The dashboard's pages, rendered on the server with maud (every
//! interpolation is HTML-escaped unless marked, and nothing here marks
//! agent-written text).
//!
//! Invariants:
//! - Everything an agent wrote (commit messages, file names, branch names,
//!   diffs, output, act bodies), and the owner's task text, which may
//!   quote such text, goes through [`v`] or [`vb`] first: the
//!   terminal's visible escaping (bidi controls, zero-width and other
//!   invisible characters shown as `\u{...}`), then maud's HTML escaping.
//!   It is never markup, never an attribute but a `data-`/`value` one, and
//!   never a link target: links are built only from ids the supervisor
//!   made, checked by [`link_id`]
//!   (`tests/tests/dashboard_browser.rs::the_morning_review_in_a_real_browser`).
//! - No inline script or style: the one script and stylesheet are served
//!   from the binary (`/assets/`), as the Content-Security-Policy demands.

use maud::{html, Markup, DOCTYPE};

use super::backend::{
    ActView, ChainState, ContinueView, Diff, Morning, PolicyView, QueuePage, RefusalView, RunView,
};
use super::guard::Role;
use nightshift_core::state_store::RunRecord;
use nightshift_core::terminal;

/// Agent-written text on one line, visibly escaped.
pub fn v(s: &str) -> String {
    terminal::line(s)
}

/// An agent-written body, line structure kept, visibly escaped.
pub fn vb(b: &[u8]) -> String {
    terminal::block(b)
}

/// An id usable in a link: the supervisor's own ids are short and plain.
pub fn link_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The most of a task's first line a table shows.
const TASK_IN_TABLE: usize = 120;

/// A run's task in a table cell: its first line, escaped, cut at
/// [`TASK_IN_TABLE`] characters, with a mark when anything was left out
/// (the Run page shows it whole).
pub fn task_line(task: Option<&str>) -> String {
    let Some(task) = task else {
        return "-".into();
    };
    let first = task.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let mut shown: String = first.chars().take(TASK_IN_TABLE).collect();
    let more = shown.len() < first.len() || task.trim() != first.trim();
    shown = v(&shown);
    if more {
        shown.push_str(" …");
    }
    shown
}

/// Who is looking, for the header and the forms.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub user: String,
    pub role: Role,
    pub csrf: String,
}

fn layout(title: &str, who: Option<&Viewer>, frozen: Option<&str>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "nightshift: " (title) }
                link rel="stylesheet" href="/assets/app.css";
                script src="/assets/app.js" defer {}
            }
            body {
                @if let Some(who) = who {
                    nav {
                        a href="/" { "Morning" }
                        a href="/runs" { "Runs" }
                        a href="/queue" { "Queue" }
                        a href="/policy" { "Policy" }
                        a.stop href="/stop" { "Stop" }
                        span.who { (who.user) " (" (who.role.name()) ")" }
                        form method="post" action="/api/v1/logout" {
                            input type="hidden" name="csrf" value=(who.csrf);
                            button type="submit" id="logout" { "Log out" }
                        }
                    }
                    @if let Some(why) = frozen {
                        p.frozen id="frozen" { "FROZEN: " (v(why)) }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

pub fn login(error: Option<&str>) -> Markup {
    layout(
        "log in",
        None,
        None,
        html! {
            @if let Some(e) = error { p.error { (e) } }
            form method="post" action="/api/v1/login" id="login" {
                label { "Name " input type="text" name="name" id="name" autocomplete="username" required; }
                label { "Password " input type="password" name="password" id="password" autocomplete="current-password" required; }
                button type="submit" id="login-submit" { "Log in" }
            }
        },
    )
}

fn run_link(id: &str) -> Markup {
    html! {
        @if link_id(id) { a.run href={ "/runs/" (id) } { (id) } } @else { code { (v(id)) } }
    }
}

fn refusals_table(refusals: &[RefusalView]) -> Markup {
    html! {
        @if refusals.is_empty() { p { "No door request was refused." } }
        @else {
            table.refusals {
                tr { th { "time" } th { "run" } th { "door" } th { "destination" } th { "verdict" } th { "rule" } }
                @for r in refusals {
                    tr {
                        td { (v(&r.time)) } td { (run_link(&r.run)) } td { (v(&r.door)) }
                        td { (v(r.destination.as_deref().unwrap_or("(none)"))) }
                        td { (v(&r.verdict)) }
                        td.by { (v(&r.by)) }
                    }
                }
            }
        }
    }
}

fn runs_table(runs: &[(String, RunRecord)]) -> Markup {
    html! {
        table.runs {
            tr { th { "run" } th { "task" } th { "outcome" } th { "status" } th { "repository" } th { "changes" } th { "created" } }
            @for (outcome, r) in runs {
                tr data-outcome=(outcome) {
                    td { (run_link(&r.id)) }
                    td.task { (task_line(r.task.as_deref())) }
                    td { (outcome) }
                    td { (v(&r.status)) @if let Some(why) = &r.reason { br; small { (v(why)) } } }
                    td { (v(&r.repo)) }
                    td {
                        @match (r.files_changed, r.insertions, r.deletions) {
                            (Some(f), Some(i), Some(d)) => { (f) " files +" (i) " -" (d) }
                            _ => { "-" }
                        }
                    }
                    td { (v(&r.created_at)) }
                }
            }
        }
    }
}

/// A supervisor-made outcome's colour (never anything an agent wrote).
fn outcome_fill(outcome: &str) -> &'static str {
    match outcome {
        "finished" => "#2e7d32",
        "killed" => "#c62828",
        "failed" => "#ef6c00",
        "import failed" => "#6a1b9a",
        "running" => "#1565c0",
        _ => "#616161",
    }
}

/// The night: one bar per run across the hours (server-rendered SVG, no
/// script), coloured by outcome, cap kills and acts marked, each bar a
/// link to its run; the task only as a `<title>`'s escaped text.
fn night_svg(m: &Morning) -> Markup {
    let now = time::OffsetDateTime::now_utc();
    let Some(n) = super::night::layout(
        &m.runs,
        &|id| m.acts_by_run.get(id).copied().unwrap_or(0),
        now,
    ) else {
        return html! { p { "No run to draw." } };
    };
    let tasks: std::collections::HashMap<&str, Option<&str>> = m
        .runs
        .iter()
        .map(|(_, r)| (r.id.as_str(), r.task.as_deref()))
        .collect();
    let w = super::night::WIDTH;
    html! {
        svg #night xmlns="http://www.w3.org/2000/svg" width=(w + 80.0) height=(n.height) viewBox={ "-40 0 " (w + 80.0) " " (n.height) } role="img" {
            title { "the night: one bar per run" }
            @for (x, label) in &n.ticks {
                line x1=(x) x2=(x) y1="12" y2=(n.height) stroke="#bbb" stroke-width="1" {}
                text x=(x) y="10" font-size="10" text-anchor="middle" fill="#444" { (label) }
            }
            @for b in &n.bars {
                @let title = format!("{} · {}{}{}", b.run, b.outcome,
                    if b.capped { " · killed by a cap" } else { "" },
                    if b.acts > 0 { format!(" · {} acts", b.acts) } else { String::new() });
                @let bar = html! {
                    title { (v(&title)) @if let Some(Some(t)) = tasks.get(b.run.as_str()) { " · " (task_line(Some(t))) } }
                    rect.bar x=(b.x) y=(b.y) width=(b.w) height=(super::night::ROW - 4.0) fill=(outcome_fill(&b.outcome)) data-outcome=(b.outcome) {}
                    @if b.capped {
                        path.cap d={ "M" (b.x + b.w) " " (b.y) " l6 " ((super::night::ROW - 4.0) / 2.0) " l-6 " ((super::night::ROW - 4.0) / 2.0) " z" } fill="#000" {}
                    }
                    @for i in 0..b.acts.min(10) {
                        circle.act cx=(b.x + b.w - 4.0 - i as f64 * 6.0) cy=(b.y + (super::night::ROW - 4.0) / 2.0) r="2.5" fill="#fff" stroke="#000" {}
                    }
                };
                @if link_id(&b.run) { a href={ "/runs/" (b.run) } { (bar) } } @else { g { (bar) } }
            }
        }
        p.legend {
            @for o in ["finished", "killed", "failed", "import failed", "running"] {
                span.legend-item { svg width="10" height="10" { rect width="10" height="10" fill=(outcome_fill(o)) {} } " " (o) " " }
            }
            "· ▶ killed by a cap · ○ an act it queued"
        }
    }
}

/// The run's memory and CPU over time, from its `resources` samples.
fn usage_svg(audit: &[serde_json::Value]) -> Markup {
    let samples: Vec<(String, serde_json::Value)> = audit
        .iter()
        .filter(|e| e["kind"] == "resources")
        .map(|e| {
            (
                e["time"].as_str().unwrap_or("").to_string(),
                e["body"].clone(),
            )
        })
        .collect();
    let Some(u) = super::night::usage(&samples) else {
        return html! { p #resources-none { "Fewer than two resource samples were recorded." } };
    };
    let (w, h) = (super::night::WIDTH, super::night::USAGE_H);
    let points = |ps: &[(f64, f64)]| {
        ps.iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    html! {
        svg #resources xmlns="http://www.w3.org/2000/svg" width=(w) height=(h + 20.0) viewBox={ "0 0 " (w) " " (h + 20.0) } role="img" {
            title { "memory and CPU over the run" }
            rect x="0" y="0" width=(w) height=(h) fill="none" stroke="#bbb" {}
            polyline.memory points=(points(&u.memory)) fill="none" stroke="#1565c0" stroke-width="2" {}
            polyline.cpu points=(points(&u.cpu)) fill="none" stroke="#c62828" stroke-width="2" {}
            text x="4" y=(h + 14.0) font-size="11" fill="#1565c0" { "memory (peak " (format!("{:.1}", u.peak_memory as f64 / 1048576.0)) " MiB)" }
            text x="260" y=(h + 14.0) font-size="11" fill="#c62828" { "CPU (peak " (format!("{:.2}", u.peak_cpu)) " cores)" }
            text x=(w - 4.0) y=(h + 14.0) font-size="11" text-anchor="end" fill="#444" { (format!("{:.0}", u.seconds)) " s" }
        }
    }
}

pub fn morning(who: &Viewer, m: &Morning) -> Markup {
    layout(
        "Morning",
        Some(who),
        m.frozen.as_deref(),
        html! {
            form method="get" action="/" {
                label { "Since " input type="text" name="since" value=(m.since); }
                button type="submit" { "Show" }
            }
            @if !m.capped.is_empty() {
                section #capped {
                    h2 { "Runs a cap ended (" (m.capped.len()) ")" }
                    table.capped {
                        tr { th { "run" } th { "task" } th { "status" } th { "continue" } }
                        @for c in &m.capped {
                            tr data-run=(c.run) {
                                td { (run_link(&c.run)) }
                                td.task { (task_line(c.task.as_deref())) }
                                td { (v(&c.status)) }
                                td {
                                    @if let Some(why) = &c.not_now { small { (v(why)) } }
                                    @else { (continue_form(who, &c.run)) }
                                }
                            }
                        }
                    }
                }
            }
            section #night-picture {
                h2 { "The night" }
                (night_svg(m))
            }
            section #refusals {
                h2 { "Refused door requests (" (m.refusals.len()) ")" }
                (refusals_table(&m.refusals))
            }
            section #outcomes {
                h2 { "Runs by outcome" }
                ul { @for (o, n) in &m.by_outcome { li { (o) ": " strong { (n) } } } }
                p { "Acts waiting: " strong #acts-waiting { (m.acts_waiting) } " · carried out: " (m.acts_done) " · " a href="/queue" { "decide them" } }
            }
            section #tokens {
                h2 { "Model tokens" }
                @if m.tokens.calls == 0 {
                    p { "No model call in this period." }
                } @else {
                    p {
                        "Charged: " strong #tokens-charged { (m.tokens.charged_tokens) }
                        " (input " (m.tokens.input_tokens) ", output " (m.tokens.output_tokens)
                        ", cached " (m.tokens.cached_tokens) ") over " (m.tokens.calls) " calls; "
                        (m.tokens.refused) " refused, " (m.tokens.without_usage) " without usage (charged whole)."
                    }
                    table {
                        tr { th { "run" } th { "calls" } th { "charged" } th { "cap" } }
                        @for (run, t) in &m.tokens_by_run {
                            tr {
                                td { (run_link(run)) }
                                td { (t.calls) }
                                td { (t.charged_tokens) }
                                td { (t.token_cap.map(|c| c.to_string()).unwrap_or("-".into())) }
                            }
                        }
                    }
                }
            }
            section #chain {
                h2 { "Audit chain" }
                (chain_section(&m.chain))
            }
            section #runs {
                h2 { "Runs (" (m.runs.len()) ")" }
                (runs_table(&m.runs))
            }
        },
    )
}

/// Exactly what was verified and when: through which entry, what this
/// load walked, and the last walk of the whole chain.
fn chain_section(c: &ChainState) -> Markup {
    let walked = html! {
        @match (c.walked, c.why_whole, c.walked_from) {
            (Some(w), Some(why), _) => { "This load walked the " (w) " (" (c.walked_entries) " entries: " (why) "). " }
            (Some(_), None, Some(from)) if c.walked_entries > 0 => {
                "This load walked entries " (from) " to " (from + c.walked_entries - 1)
                " (the last verified again, and those appended since). "
            }
            _ => {}
        }
    };
    let whole = html! {
        @match (&c.whole_at, c.whole_through) {
            (Some(at), Some(n)) => { "Whole chain last verified at " span #chain-whole-at { (v(at)) } " (entries 1 to " (n) "); " }
            _ => { "The whole chain has not been verified yet; " }
        }
        "it is walked again every " (c.whole_every) " s."
    };
    html! {
        @if c.intact {
            p.ok #chain-verified {
                "verified through entry " strong { (c.entries) }
                @if let Some(at) = &c.verified_at { " at " (v(at)) }
                ", head " code { (c.head.as_deref().unwrap_or("-")) }
                @if let Some(cp) = c.last_checkpoint { ", last checkpoint #" (cp) }
            }
            p.detail { (walked) (whole) }
        } @else {
            p.error #chain-broken {
                "BROKEN: " (v(c.error.as_deref().unwrap_or("unknown")))
                @if let Some(at) = &c.broken_at {
                    " (found at " (v(at)) " by "
                    @if c.broken_by_whole_walk { "a walk of the whole chain" } @else { "a walk of the new entries" } ")"
                }
            }
            p.detail { (whole) }
        }
    }
}

pub fn runs(who: &Viewer, frozen: Option<&str>, runs: &[(String, RunRecord)]) -> Markup {
    layout("Runs", Some(who), frozen, runs_table(runs))
}

fn diff_block(d: &Diff) -> Markup {
    diff_block_with(d, true)
}

/// Most commits an act or a run lists by subject before the toggle.
const SUBJECTS_SHOWN: usize = 5;
/// Most characters of one subject shown before the toggle.
const SUBJECT_CHARS: usize = 100;
/// Most changed files listed before the toggle.
const FILES_SHOWN: usize = 8;

/// A `commit ID` / `    subject` log (the format `backend` and
/// `acts::publishes` ask git for) collapsed to one line per commit: the
/// first [`SUBJECTS_SHOWN`] short ids and subjects (cut at
/// [`SUBJECT_CHARS`]), the whole log behind a `<details>` toggle (no
/// script needed). `count` is the number of commits when known.
fn compact_log(log: &[u8], count: Option<u64>) -> Markup {
    let text = String::from_utf8_lossy(log);
    let mut commits: Vec<(&str, &str)> = Vec::new();
    for line in text.lines() {
        if let Some(id) = line.strip_prefix("commit ") {
            commits.push((id, ""));
        } else if let (Some(last), Some(subject)) = (commits.last_mut(), line.strip_prefix("    "))
        {
            if last.1.is_empty() {
                last.1 = subject;
            }
        }
    }
    let total = count.unwrap_or(commits.len() as u64);
    html! {
        ul.subjects {
            @for (id, subject) in commits.iter().take(SUBJECTS_SHOWN) {
                li {
                    code.commit { (v(&id.chars().take(12).collect::<String>())) } " "
                    (v(&subject.chars().take(SUBJECT_CHARS).collect::<String>()))
                    @if subject.chars().count() > SUBJECT_CHARS { " …" }
                }
            }
        }
        @if total > SUBJECTS_SHOWN as u64 || commits.iter().any(|(_, s)| s.chars().count() > SUBJECT_CHARS) {
            details.log {
                summary {
                    @if total > SUBJECTS_SHOWN as u64 { "and " (total - SUBJECTS_SHOWN as u64) " more commits; " }
                    "the whole log"
                }
                pre.log { (vb(log)) }
            }
        }
    }
}

/// The diff, with its commits after the base when `with_log`.
fn diff_block_with(d: &Diff, with_log: bool) -> Markup {
    html! {
        @if let Some(e) = &d.error { p.error { (v(e)) } }
        @else {
            @if with_log && !d.log.is_empty() { (compact_log(&d.log, None)) }
            @if let Some((f, i, del)) = d.stat { p.stat { (f) " files changed, +" (i) " -" (del) } }
            // Files the host may run first, then the first others; the
            // rest behind a toggle.
            @let (risky, plain): (Vec<_>, Vec<_>) = d.files.iter().partition(|f| f.risky.is_some());
            @let shown = FILES_SHOWN.saturating_sub(risky.len());
            ul.files {
                @for f in risky.iter().chain(plain.iter().take(shown)) {
                    li {
                        code.path { (v(&f.path)) }
                        @if let Some(why) = f.risky { " " span.risky title=(why) { "RUNS ON THE HOST: " (why) } }
                    }
                }
            }
            @if plain.len() > shown {
                details.files {
                    summary { "and " (plain.len() - shown) " more files" }
                    ul.files { @for f in plain.iter().skip(shown) { li { code.path { (v(&f.path)) } } } }
                }
            }
            details.diff {
                summary { "the diff, as text" @if d.truncated { " (cut at 256 KiB)" } }
                pre.diff { (vb(&d.patch)) }
            }
        }
    }
}

fn act_decisions(who: &Viewer, a: &ActView) -> Markup {
    html! {
        @if who.role == Role::Owner && (a.state == "pending") {
            form.decide method="post" action="/api/v1/acts/approve" {
                input type="hidden" name="csrf" value=(who.csrf);
                input type="hidden" name="act" value=(a.id);
                button.approve type="submit" { "Approve" }
            }
            form.decide method="post" action="/api/v1/acts/reject" {
                input type="hidden" name="csrf" value=(who.csrf);
                input type="hidden" name="act" value=(a.id);
                input.why type="text" name="why" placeholder="reason" required;
                button.reject type="submit" { "Reject" }
            }
        }
    }
}

fn act_block(who: &Viewer, a: &ActView, batch: bool) -> Markup {
    let risky = a
        .diff
        .as_ref()
        .is_some_and(|d| d.files.iter().any(|f| f.risky.is_some()));
    html! {
        div.act data-act=(a.id) data-state=(a.state) {
            p.head {
                @if batch && who.role == Role::Owner && a.state == "pending" {
                    input.pick type="checkbox" form="batch" name="act" value=(a.id);
                    " "
                }
                code.id { (a.id) } " " strong.door { (a.door) } " to " strong.dest { (v(&a.destination)) }
                @if a.target != a.destination { " " code.target { (v(&a.target)) } }
                " · " span.state { (a.state) }
                " · " span.age { (a.age) }
                @if a.state == "pending" { " · " span.expiry { (a.expiry) } }
                @if risky { " " span.risky { "changes files the host may run" } }
            }
            @if let Some(d) = &a.detail { p.detail { (v(d)) } }
            p.meta {
                "run " (run_link(&a.run))
                @if let Some(c) = &a.commit { " · commit " code.commit { (v(c)) } }
                " · asked by rule " @for r in &a.rules { code { (v(r)) } " " }
            }
            @if let Some(text) = &a.text { pre.body { (vb(text.as_bytes())) } }
            @if let Some(pubs) = &a.publishes {
                p.publishes {
                    "commits it would publish (" (pubs.count) ", " (v(&pubs.against)) "):"
                }
                div.publishes { (compact_log(&pubs.log, Some(pubs.count))) }
                @if pubs.count > nightshift_supervisor::acts::MAX_LISTED_COMMITS {
                    p.publishes { "(the whole log lists the first " (nightshift_supervisor::acts::MAX_LISTED_COMMITS) ")" }
                }
            }
            @if let Some(d) = &a.diff { (diff_block_with(d, a.publishes.is_none())) }
            p.outcome {}
            (act_decisions(who, a))
        }
    }
}

/// Approving every act on the page that carries commit `c`: a
/// confirmation step (a `<details>`, no script needed) that lists each act
/// it would carry out (door, destination, ref) before the click, each line
/// then showing that act's outcome; the approval names exactly those acts.
fn by_commit(who: &Viewer, c: &str, acts: &[&ActView]) -> Markup {
    html! {
        details.by-commit data-commit=(c) {
            summary { "Approve every act that carries " code { (v(c)) } " (" (acts.len()) @if acts.len() == 1 { " act" } @else { " acts" } ")" }
            p { "This carries out, each under its own approval:" }
            ol.planned-acts {
                @for a in acts {
                    li.planned data-act=(a.id) {
                        strong.door { (a.door) } " to " strong.dest { (v(&a.destination)) } " " code.target { (v(&a.target)) }
                        " · run " (run_link(&a.run)) " · act " code { (a.id) }
                        " · " span.state { (a.state) } " " span.outcome {}
                    }
                }
            }
            form.decide method="post" action="/api/v1/acts/approve" {
                input type="hidden" name="csrf" value=(who.csrf);
                @for a in acts { input type="hidden" name="act" value=(a.id); }
                button.approve-commit type="submit" data-commit=(c) {
                    "Carry out these " (acts.len()) @if acts.len() == 1 { " act" } @else { " acts" }
                }
            }
        }
    }
}

pub fn queue(who: &Viewer, frozen: Option<&str>, q: &QueuePage) -> Markup {
    // Every pending act on the page by the commit it carries: one
    // decision per content, listed whole before it is taken.
    let mut commits: Vec<(&str, Vec<&ActView>)> = Vec::new();
    for a in q.acts.iter().filter(|a| a.state == "pending") {
        let Some(c) = a.commit.as_deref() else {
            continue;
        };
        match commits.iter_mut().find(|(k, _)| *k == c) {
            Some((_, list)) => list.push(a),
            None => commits.push((c, vec![a])),
        }
    }
    commits.sort_by(|x, y| x.0.cmp(y.0));
    let pages = q.total.div_ceil(q.per_page.max(1));
    // Grouped by run, in the order of each run's oldest act on the page.
    let mut groups: Vec<(&str, Vec<&ActView>)> = Vec::new();
    for a in &q.acts {
        match groups.iter_mut().find(|(r, _)| *r == a.run) {
            Some((_, list)) => list.push(a),
            None => groups.push((&a.run, vec![a])),
        }
    }
    html! {
        (layout("Queue", Some(who), frozen, html! {
            p { (q.total) " acts waiting or stale; page " (q.page + 1) " of " (pages.max(1)) }
            @if who.role == Role::Owner && !q.acts.is_empty() {
                form #batch.decide method="post" action="/api/v1/acts/approve" {
                    input type="hidden" name="csrf" value=(who.csrf);
                    button #approve-selected type="submit" { "Approve the selected acts" }
                }
                @if !commits.is_empty() {
                    section #by-commit {
                        h2 { "One decision per content" }
                        @for (c, acts) in &commits { (by_commit(who, c, acts)) }
                    }
                }
            }
            @for (run, acts) in &groups {
                section.run-group {
                    h2 { "run " (run_link(run)) }
                    @for a in acts { (act_block(who, a, true)) }
                }
            }
            nav.pages {
                @if q.page > 0 { a href={ "/queue?page=" (q.page - 1) } { "previous" } " " }
                @if q.page + 1 < pages { a href={ "/queue?page=" (q.page + 1) } { "next" } }
            }
        }))
    }
}

/// The form that continues a capped run (owner only): new token and time
/// caps, empty for the same as before.
fn continue_form(who: &Viewer, run: &str) -> Markup {
    html! {
        @if who.role == Role::Owner && link_id(run) {
            form.continue method="post" action={ "/api/v1/runs/" (run) "/continue" } {
                input type="hidden" name="csrf" value=(who.csrf);
                label { "max tokens " input type="text" name="max_tokens" size="10" placeholder="as before"; }
                " "
                label { "timeout " input type="text" name="timeout" size="6" placeholder="as before"; }
                " "
                button.continue type="submit" { "Continue from its result" }
            }
        }
    }
}

/// A run's continuation: the choice when a cap ended it, and the links
/// both ways (from the audit).
fn continue_section(who: &Viewer, run: &str, c: &ContinueView) -> Markup {
    html! {
        @if c.offer.is_some() || c.continues.is_some() || !c.continued_as.is_empty() || !c.queued.is_empty() {
            section #continuation {
                h2 { "Continue in the morning" }
                @if let Some(from) = &c.continues { p.continues { "This run continues " (run_link(from)) "." } }
                @for to in &c.continued_as { p.continued-as { "Continued as " (run_link(to)) "." } }
                @for t in &c.queued { p.continue-queued { "Continuation queued as task " code { (v(t)) } "." } }
                @if let Some(cap) = c.offer {
                    p { "Its " (cap) " cap ended it: continue it from its result ref, with the same task and agent." }
                    (continue_form(who, run))
                }
            }
        }
    }
}

pub fn run(who: &Viewer, frozen: Option<&str>, r: &RunView) -> Markup {
    let run = &r.run;
    html! {
        (layout(&format!("Run {}", v(&run.id)), Some(who), frozen, html! {
            table.facts {
                tr { th { "task" } td { @if let Some(t) = &run.task { pre #task { (vb(t.as_bytes())) } } @else { "none given" } } }
                tr { th { "status" } td #status { (v(&run.status)) @if let Some(x) = &run.reason { " — " (v(x)) } } }
                tr { th { "repository" } td { (v(&run.repo)) " at " (v(&run.base_ref)) " " code { (v(run.base_commit.as_deref().unwrap_or("-"))) } } }
                tr { th { "image" } td { code { (v(&run.image)) } } }
                tr { th { "command" } td { code { (v(&run.command.join(" "))) } } }
                tr { th { "result" } td { (v(run.result_ref.as_deref().unwrap_or("-"))) " " code { (v(run.result_commit.as_deref().unwrap_or(""))) } } }
                tr { th { "resources" } td {
                    "peak memory " (run.peak_memory_bytes.map(|b| format!("{:.1} MiB", b as f64 / 1048576.0)).unwrap_or("-".into()))
                    " · cpu " (run.cpu_ns.map(|n| format!("{:.2} s", n as f64 / 1e9)).unwrap_or("-".into()))
                    " · duration " (run.duration_ms.map(|n| format!("{:.1} s", n as f64 / 1e3)).unwrap_or("-".into()))
                } }
                tr { th { "model tokens" } td #model-tokens {
                    @if r.model.calls == 0 { "no model call" } @else {
                        (r.model.charged_tokens) " charged"
                        @if let Some(cap) = r.model.token_cap { " of " (cap) }
                        " over " (r.model.calls) " calls (input " (r.model.input_tokens) ", output " (r.model.output_tokens)
                        "; " (r.model.refused) " refused, " (r.model.without_usage) " without usage)"
                    }
                } }
            }
            (continue_section(who, &run.id, &r.continuation))
            section #usage {
                h2 { "Memory and CPU" }
                (usage_svg(&r.audit))
            }
            section #attestation {
                h2 { "Attestation" }
                @if let Some(props) = run.attestation.as_ref().and_then(|a| a.as_array()) {
                    table { @for p in props { tr {
                        td { @if p["ok"].as_bool().unwrap_or(false) { span.ok { "ok" } } @else { span.error { "FAIL" } } }
                        td { (v(p["name"].as_str().unwrap_or("?"))) }
                        td { code { (v(p["observed"].as_str().unwrap_or(""))) } }
                    } } }
                } @else { p { "none recorded" } }
            }
            section #changes {
                h2 { "Changes against the base" }
                @if let Some(d) = &r.diff { (diff_block(d)) } @else { p { "no result commit" } }
            }
            section #acts {
                h2 { "Acts (" (r.acts.len()) ")" }
                @for a in &r.acts { (act_block(who, a, false)) }
            }
            section #run-refusals {
                h2 { "Refused door requests" }
                (refusals_table(&r.refusals))
            }
            section #output {
                h2 { "Output" @if r.output_truncated { " (the last 256 KiB)" } }
                @let live = !nightshift_core::state_store::is_final(&run.status) && link_id(&run.id);
                pre #live-output data-src=[live.then(|| format!("/api/v1/runs/{}/output", run.id))] { (vb(&r.output)) }
            }
            section #audit {
                h2 { "Audit entries (" (r.audit.len()) ")" }
                table { @for e in &r.audit { tr {
                    td { (e["seq"]) } td { (v(e["time"].as_str().unwrap_or(""))) } td { (v(e["kind"].as_str().unwrap_or(""))) }
                    td { code { (v(&e["body"].to_string())) } }
                } } }
            }
        }))
    }
}

/// A rule's fields as a JSON row holds them, shown as text.
fn field(r: &serde_json::Value, key: &str) -> String {
    match r.get(key) {
        None | Some(serde_json::Value::Null) => "-".into(),
        Some(serde_json::Value::String(s)) => v(s),
        Some(other) => v(&other.to_string()),
    }
}

fn rules_table(rules: &[serde_json::Value], id: &str) -> Markup {
    html! {
        table.rules id=(id) {
            tr { th { "effect" } th { "rule" } th { "subject" } th { "doors" } th { "reason" } th { "locked" } th { "author" } th { "authority" } th { "binds as" } }
            @for r in rules { tr {
                td { (field(r, "effect")) }
                td { code { (field(r, "id")) } }
                td { (field(r, "subject")) }
                td { (field(r, "doors")) }
                td { (field(r, "reason")) }
                td { (r["locked"].as_bool().unwrap_or(false)) }
                td.author { (field(r, "author")) }
                td.authority { (field(r, "authority")) }
                td.binds-as { (field(r, "binds_as")) }
            } }
        }
    }
}

/// One pending proposal, whole: the rule it declares (or what it retires
/// or unlocks), who proposed it and why, and what it would change.
fn proposal_block(who: &Viewer, p: &serde_json::Value) -> Markup {
    let id = p["id"].as_str().unwrap_or("?");
    let change = &p["change"];
    let rule = &change["rule"];
    let changes = p["would_change"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    html! {
        div.proposal data-proposal=(id) {
            p.head {
                code { (v(id)) } " proposed by " strong.author { (field(p, "author")) }
                ": " strong.change { (field(change, "change")) }
            }
            @if rule.is_object() {
                table.rule {
                    tr { th { "rule" } td { code { (field(rule, "id")) } } }
                    tr { th { "effect" } td.effect { strong { (field(rule, "effect")) } } }
                    tr { th { "subject" } td.subject { code { (field(rule, "subject")) } } }
                    tr { th { "doors" } td.doors { (field(rule, "doors")) } }
                    tr { th { "tools" } td { (field(rule, "tools")) } }
                    tr { th { "match clauses" } td.clauses {
                        @match rule.get("match").and_then(|m| m.as_array()).filter(|m| !m.is_empty()) {
                            Some(clauses) => { ul { @for c in clauses { li { code { (v(&c.to_string())) } } } } }
                            None => { "none: it matches every request of its subject and doors" }
                        }
                    } }
                    tr { th { "locked once ratified" } td.lock { "yes (ratification locks it)" } }
                    tr { th { "in force" } td.expiry {
                        @if rule["since"].is_null() { "from its ratification" } @else { "from " (field(rule, "since")) }
                        @if rule["until"].is_null() { ", with no expiry" } @else { " until " (field(rule, "until")) }
                    } }
                    @if !rule["scope"].is_null() { tr { th { "scope" } td { code { (field(rule, "scope")) } } } }
                    tr { th { "why (the proposer's words)" } td.reason { (field(rule, "reason")) } }
                }
            } @else {
                table.rule {
                    tr { th { "rule" } td { code { (field(change, "rule")) } } }
                    tr { th { "why (the proposer's words)" } td.reason { (field(change, "reason")) } }
                }
            }
            @if let Some(e) = p["error"].as_str() { p.error { (v(e)) } }
            @else {
                section.would-change {
                    h3 { "What ratifying it would change" }
                    @if changes.is_empty() {
                        p { "No recorded act or dry-run act would have been decided otherwise." }
                    } @else {
                        p { (changes.len()) " recorded acts and dry-run acts would have been decided otherwise:" }
                        table {
                            tr { th { "act" } th { "run" } th { "door" } th { "destination" } th { "target" } th { "now" } th { "under it" } }
                            @for c in changes { tr.changed {
                                td { code { (field(c, "act")) } } td { (run_link(c["run"].as_str().unwrap_or(""))) }
                                td { (field(c, "door")) } td { (field(c, "destination")) } td { code { (field(c, "target")) } }
                                td { (field(c, "before")) " (" (field(c, "before_rule")) ")" }
                                td { strong { (field(c, "after")) } " (" (field(c, "after_rule")) ")" }
                            } }
                        }
                    }
                    @if rule.is_object() {
                        p.beyond {
                            "Beyond these, it " (field(rule, "effect")) "s every future request of subject "
                            code { (field(rule, "subject")) } " at the doors " (field(rule, "doors"))
                            @if rule.get("match").and_then(|m| m.as_array()).is_some_and(|m| !m.is_empty()) { " that its match clauses take" }
                            @else { ", whatever it carries" }
                            ", for as long as it is in force."
                        }
                    }
                }
            }
            @if who.role == Role::Owner {
                form method="post" action="/api/v1/policy/ratify" {
                    input type="hidden" name="csrf" value=(who.csrf);
                    input type="hidden" name="proposal" value=(id);
                    button.ratify type="submit" { "Ratify this rule (and lock it)" }
                }
            }
        }
    }
}

pub fn policy(who: &Viewer, p: &PolicyView) -> Markup {
    layout(
        "Policy",
        Some(who),
        p.frozen.as_deref(),
        html! {
            p { "generation " code { (v(&p.generation)) } }
            (rules_table(&p.active, "active-rules"))
            @if !p.suspended.is_empty() {
                h2 { "Suspended by the freeze (" (p.suspended.len()) ")" }
                p { "Agents' rules do not bind while frozen; they bind again after a thaw." }
                (rules_table(&p.suspended, "suspended-rules"))
            }
            h2 { "Proposals awaiting ratification" }
            @if p.proposals.is_empty() { p { "none" } }
            @for prop in &p.proposals { (proposal_block(who, prop)) }
            @if who.role == Role::Owner && p.frozen.is_some() {
                form method="post" action="/api/v1/thaw" {
                    input type="hidden" name="csrf" value=(who.csrf);
                    button #thaw type="submit" { "Thaw" }
                }
            }
        },
    )
}

pub fn stop(who: &Viewer, frozen: Option<&str>) -> Markup {
    layout(
        "Stop",
        Some(who),
        frozen,
        html! {
            @if who.role == Role::Owner {
                p { "Kill every run of this supervisor at once and freeze: no run starts and no door answers until the owner thaws." }
                form #stop-form method="post" action="/api/v1/kill" {
                    input type="hidden" name="csrf" value=(who.csrf);
                    input type="hidden" name="freeze" value="true";
                    label { "Reason " input #stop-why type="text" name="why" required; }
                    label { input #stop-confirm type="checkbox" name="confirm" value="yes" required; " I mean it: kill all runs and freeze" }
                    button #stop-submit.stop type="submit" { "Kill all and freeze" }
                }
                p.outcome #stop-outcome {}
            } @else {
                p { "Only the owner can stop runs. From a terminal on the supervisor's machine: " code { "nightshift kill --all --freeze" } }
            }
        },
    )
}

pub fn error(who: Option<&Viewer>, status: u16, message: &str) -> Markup {
    layout(
        &format!("error {status}"),
        who,
        None,
        html! { p.error { (v(message)) } },
    )
}
