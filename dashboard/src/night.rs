//! The night as a picture: the geometry of the Morning page's chart (one
//! bar per run across the hours, by outcome, cap kills marked) and of the
//! Run page's memory and CPU over time, as pure functions over the run
//! records and the audit's `resources` samples. `pages.rs` draws it as
//! server-rendered SVG with no script.
//!
//! Invariants:
//! - Nothing an agent wrote becomes geometry, a class or a link: bars are
//!   placed from the supervisor's times, coloured by the supervisor's
//!   outcome names, and linked only through `pages::link_id`; a run's task
//!   reaches the SVG only as escaped text of a `<title>`
//!   (`tests/tests/dashboard_browser.rs::the_morning_review_in_a_real_browser`).

use nightshift_core::state_store::RunRecord;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The chart's drawing width, px (the hours span it).
pub const WIDTH: f64 = 900.0;
/// One run's row, px.
pub const ROW: f64 = 16.0;
/// The axis's band above the rows, px.
pub const AXIS: f64 = 18.0;
/// Most runs drawn (the newest).
pub const MAX_BARS: usize = 200;

/// One run's bar.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub run: String,
    pub outcome: String,
    pub x: f64,
    pub w: f64,
    pub y: f64,
    /// Killed by a cap (its status names the cap).
    pub capped: bool,
    /// Acts it queued (marked on the bar).
    pub acts: usize,
}

/// The night's chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Night {
    pub bars: Vec<Bar>,
    /// Hour marks: x and the label (`HH:00` UTC).
    pub ticks: Vec<(f64, String)>,
    pub height: f64,
}

/// Was a run with this status killed by one of its caps (`killed: timeout
/// 2s`, `killed: memory cap …`), not by a person or a lapsed lease?
pub fn capped(status: &str) -> bool {
    status
        .strip_prefix("killed: ")
        .is_some_and(|why| !why.starts_with("by ") && !why.starts_with("lease"))
}

fn at(s: Option<&str>) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s?, &Rfc3339).ok()
}

/// Lays out `runs` (outcome, record) across their hours; `acts` counts
/// each run's acts; a run still going ends at `now`. `None` when no run
/// has a readable time.
pub fn layout(
    runs: &[(String, RunRecord)],
    acts: &dyn Fn(&str) -> usize,
    now: OffsetDateTime,
) -> Option<Night> {
    let spans: Vec<(&String, &RunRecord, OffsetDateTime, OffsetDateTime)> = runs
        .iter()
        .rev()
        .take(MAX_BARS)
        .rev()
        .filter_map(|(o, r)| {
            let start = at(r.started_at.as_deref()).or_else(|| at(Some(&r.created_at)))?;
            let end = at(r.ended_at.as_deref()).unwrap_or(now).max(start);
            Some((o, r, start, end))
        })
        .collect();
    let first = spans.iter().map(|s| s.2).min()?;
    let last = spans.iter().map(|s| s.3).max()?;
    // Whole hours around the night, at least one.
    let from = first
        .replace_minute(0)
        .ok()?
        .replace_second(0)
        .ok()?
        .replace_nanosecond(0)
        .ok()?;
    let hours = ((last - from).whole_seconds() as f64 / 3600.0)
        .ceil()
        .max(1.0) as i64;
    let span = (hours * 3600) as f64;
    let x_of = |t: OffsetDateTime| (t - from).whole_milliseconds() as f64 / 1000.0 / span * WIDTH;
    let ticks = (0..=hours)
        .map(|h| {
            let t = from + time::Duration::hours(h);
            (
                h as f64 / hours as f64 * WIDTH,
                format!("{:02}:00", t.hour()),
            )
        })
        .collect();
    let bars: Vec<Bar> = spans
        .iter()
        .enumerate()
        .map(|(i, (o, r, s, e))| {
            let x = x_of(*s);
            Bar {
                run: r.id.clone(),
                outcome: o.to_string(),
                x,
                w: (x_of(*e) - x).max(2.0),
                y: AXIS + i as f64 * ROW,
                capped: capped(&r.status),
                acts: acts(&r.id),
            }
        })
        .collect();
    let height = AXIS + bars.len() as f64 * ROW + 4.0;
    Some(Night {
        bars,
        ticks,
        height,
    })
}

/// The Run page's resource chart: memory (bytes) and CPU (share of one
/// core) over the run's seconds, from its `resources` audit entries
/// (time, body).
#[derive(Debug, Clone, PartialEq)]
pub struct Usage {
    /// (x px, y px) points of memory and of CPU, on a `WIDTH` × `USAGE_H` plot.
    pub memory: Vec<(f64, f64)>,
    pub cpu: Vec<(f64, f64)>,
    pub peak_memory: u64,
    pub peak_cpu: f64,
    pub seconds: f64,
}

/// The resource chart's plot height, px.
pub const USAGE_H: f64 = 120.0;

/// Lays out the samples; `None` with fewer than two readable ones.
pub fn usage(samples: &[(String, serde_json::Value)]) -> Option<Usage> {
    let points: Vec<(OffsetDateTime, Option<u64>, Option<u64>)> = samples
        .iter()
        .filter_map(|(t, b)| {
            Some((
                at(Some(t))?,
                b["memory_bytes"].as_u64(),
                b["cpu_ns"].as_u64(),
            ))
        })
        .collect();
    if points.len() < 2 {
        return None;
    }
    let t0 = points[0].0;
    let secs = |t: OffsetDateTime| (t - t0).whole_milliseconds() as f64 / 1000.0;
    let seconds = secs(points[points.len() - 1].0).max(1.0);
    let mem: Vec<(f64, u64)> = points
        .iter()
        .filter_map(|p| Some((secs(p.0), p.1?)))
        .collect();
    let mut cpu: Vec<(f64, f64)> = Vec::new();
    for w in points.windows(2) {
        if let (Some(a), Some(b)) = (w[0].2, w[1].2) {
            let dt = secs(w[1].0) - secs(w[0].0);
            if dt > 0.0 {
                cpu.push((secs(w[1].0), b.saturating_sub(a) as f64 / 1e9 / dt));
            }
        }
    }
    let peak_memory = mem.iter().map(|m| m.1).max().unwrap_or(0);
    let peak_cpu = cpu.iter().map(|c| c.1).fold(0.0, f64::max);
    let x = |s: f64| s / seconds * WIDTH;
    let y = |v: f64, top: f64| USAGE_H - if top > 0.0 { v / top * USAGE_H } else { 0.0 };
    Some(Usage {
        memory: mem
            .iter()
            .map(|(s, m)| (x(*s), y(*m as f64, peak_memory as f64)))
            .collect(),
        cpu: cpu
            .iter()
            .map(|(s, c)| (x(*s), y(*c, peak_cpu.max(1.0))))
            .collect(),
        peak_memory,
        peak_cpu,
        seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str, start: &str, end: &str, status: &str) -> (String, RunRecord) {
        (
            "finished".into(),
            RunRecord {
                id: id.into(),
                created_at: start.into(),
                started_at: Some(start.into()),
                ended_at: Some(end.into()),
                status: status.into(),
                ..Default::default()
            },
        )
    }

    #[test]
    fn bars_lie_in_their_hours_in_order_and_cap_kills_are_marked() {
        let runs = vec![
            run(
                "a",
                "2026-12-06T01:30:00Z",
                "2026-12-06T02:00:00Z",
                "exited 0",
            ),
            run(
                "b",
                "2026-12-06T02:00:00Z",
                "2026-12-06T03:00:00Z",
                "killed: timeout 2s",
            ),
        ];
        let now = OffsetDateTime::parse("2026-12-06T08:00:00Z", &Rfc3339).unwrap();
        let n = layout(&runs, &|id| usize::from(id == "b"), now).unwrap();
        assert_eq!(n.ticks.len(), 3, "01:00, 02:00, 03:00: {:?}", n.ticks);
        assert_eq!(n.ticks[0].1, "01:00");
        assert_eq!(n.bars[0].x, WIDTH / 4.0);
        assert_eq!(n.bars[0].w, WIDTH / 4.0);
        assert_eq!(n.bars[1].x, WIDTH / 2.0);
        assert!(!n.bars[0].capped && n.bars[1].capped);
        assert_eq!((n.bars[0].acts, n.bars[1].acts), (0, 1));
        assert!(capped("killed: process cap 64 (70 running)"));
        assert!(!capped("killed: by dashboard:olivia") && !capped("killed: lease lapsed"));
        assert!(n.bars[1].y > n.bars[0].y);
    }

    #[test]
    fn no_readable_time_draws_nothing_and_few_samples_no_usage() {
        let mut r = run("a", "yesterday", "today", "exited 0");
        r.1.started_at = None;
        assert!(layout(&[r], &|_| 0, OffsetDateTime::now_utc()).is_none());
        assert!(usage(&[("2026-12-06T01:00:00Z".into(), serde_json::json!({}))]).is_none());
    }

    #[test]
    fn cpu_is_the_share_of_a_core_between_samples() {
        let s = |t: &str, cpu: u64, mem: u64| {
            (
                t.to_string(),
                serde_json::json!({"cpu_ns": cpu, "memory_bytes": mem}),
            )
        };
        let u = usage(&[
            s("2026-12-06T01:00:00Z", 0, 100),
            s("2026-12-06T01:00:02Z", 1_000_000_000, 300),
            s("2026-12-06T01:00:04Z", 5_000_000_000, 200),
        ])
        .unwrap();
        assert_eq!(u.peak_memory, 300);
        assert_eq!(u.peak_cpu, 2.0);
        assert_eq!(u.cpu.len(), 2);
        assert_eq!(u.memory[1], (WIDTH / 2.0, 0.0));
    }
}
