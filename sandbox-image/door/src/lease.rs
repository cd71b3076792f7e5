//! The sandbox's lease: the decision of `nightshift-lease`, the wrapper that
//! is every sandbox's main process (pure: no I/O, no clock of its own).
//!
//! The run's supervisor renews the lease by rewriting [`HEARTBEAT`] in the
//! run's door directory every few seconds ([`renew_every`]) with a strictly
//! increasing counter ([`format_heartbeat`]). The wrapper reads it twice
//! a second and ends the sandbox when the counter has not grown for longer
//! than the bound ([`Lease::observe`]).
//!
//! Invariants:
//! - Only a counter greater than every counter seen before renews the lease:
//!   the same heartbeat read again, an older one, or an unreadable one, renews
//!   nothing (`tests::the_same_or_an_older_counter_renews_nothing`,
//!   `tests::heartbeats_parse_strictly`). The door is mounted read-only, so
//!   nothing inside the sandbox can write a greater one
//!   (`orchestrator/attest/tests/fixtures.rs::writable_door_fails_mounts`).
//! - Time is the wrapper's own monotonic clock (the caller passes the time
//!   since it started, from `Instant`), never the file's mtime nor the
//!   supervisor's wall-clock time written beside the counter (that is for
//!   people reading the file): neither clock steps nor a touched mtime can
//!   renew or expire a lease ([`Lease::observe`] takes the counter and the
//!   monotonic time alone; `tests::never_held_past_the_bound_after_the_last_growth`,
//!   `tests/lease_wrapper.rs::the_same_counter_rewritten_renews_nothing`).
//! - A lease with no heartbeat at all expires one bound after the wrapper
//!   started (the start grace is the bound itself).

use std::time::Duration;

/// The heartbeat's file name in the run's door directory.
pub const HEARTBEAT: &str = "heartbeat";
/// Where the heartbeat is inside the sandbox (the door is mounted there).
pub const HEARTBEAT_IN_SANDBOX: &str = "/run/nightshift/heartbeat";
/// The longest heartbeat the wrapper reads; anything longer renews nothing.
pub const MAX_HEARTBEAT: usize = 64;
/// The shortest bound a lease may have.
pub const MIN_BOUND: Duration = Duration::from_secs(1);
/// The exit status of the wrapper (and so of the sandbox) when its lease
/// expired.
pub const EXIT_EXPIRED: i32 = 125;
/// The wrapper's own exit status when it could not start the command.
pub const EXIT_CANNOT_START: i32 = 126;
/// The wrapper's exit status on a usage mistake.
pub const EXIT_USAGE: i32 = 2;

/// How much longer than the bound the host-side end of a lease waits
/// (`nightshift lease-end`), so that the wrapper's own ending comes first.
pub const HOST_MARGIN: Duration = Duration::from_secs(5);

/// The bound the host-side end of a lease of `bound` holds to.
pub fn host_bound(bound: Duration) -> Duration {
    bound.saturating_add(HOST_MARGIN)
}

/// How often the supervisor renews a lease of `bound`: six times per bound,
/// at most every 5 s and at least every 100 ms, so that several renewals in a
/// row can be missed (a busy host) before the lease expires.
pub fn renew_every(bound: Duration) -> Duration {
    (bound / 6).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

/// A heartbeat as the supervisor writes it: the counter, then its wall-clock
/// time in milliseconds (informative only), then a newline.
pub fn format_heartbeat(counter: u64, unix_ms: u128) -> String {
    format!("{counter} {unix_ms}\n")
}

/// The counter of a heartbeat, or `None` when it is not one.
pub fn parse_heartbeat(bytes: &[u8]) -> Option<u64> {
    if bytes.len() > MAX_HEARTBEAT {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let line = text.strip_suffix('\n')?;
    let (counter, unix_ms) = line.split_once(' ')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(counter) || !digits(unix_ms) {
        return None;
    }
    counter.parse().ok()
}

/// What the wrapper does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The lease holds: keep the command running.
    Held,
    /// No renewal for longer than the bound: end the sandbox.
    Expired { since_renewal: Duration },
}

/// One sandbox's lease, as the wrapper keeps it.
#[derive(Debug, Clone)]
pub struct Lease {
    bound: Duration,
    seen: Option<u64>,
    renewed_at: Duration,
}

impl Lease {
    /// A lease of `bound`, taken at time zero (the wrapper's start).
    pub fn new(bound: Duration) -> Self {
        Self {
            bound,
            seen: None,
            renewed_at: Duration::ZERO,
        }
    }

    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// Takes in what the heartbeat held at `now` (time since the wrapper
    /// started, monotonic; `None` when missing or unreadable) and says
    /// whether the lease still holds.
    pub fn observe(&mut self, now: Duration, counter: Option<u64>) -> Verdict {
        if let Some(c) = counter {
            if self.seen.is_none_or(|seen| c > seen) {
                self.seen = Some(c);
                self.renewed_at = self.renewed_at.max(now);
            }
        }
        let since_renewal = now.saturating_sub(self.renewed_at);
        if since_renewal > self.bound {
            Verdict::Expired { since_renewal }
        } else {
            Verdict::Held
        }
    }
}

/// The wrapper's exit status for its command's: the command's own code, or
/// 128 + the signal that ended it (as shells report it).
pub fn exit_status(code: Option<i32>, signal: Option<i32>) -> i32 {
    match (code, signal) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => EXIT_CANNOT_START,
    }
}

/// The wrapper's command line: `--bound-ms N [--heartbeat PATH] -- COMMAND...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub bound: Duration,
    pub heartbeat: String,
    /// The model gateway's relay port: when set, the wrapper starts
    /// `nightshift-relay` on it and waits until it listens before the command.
    pub relay: Option<u16>,
    /// The command to run; empty when it comes from [`Self::command_file`].
    pub command: Vec<String>,
    /// A warm sandbox's command: the wrapper waits (under its lease) until
    /// the supervisor writes this file, then runs what it names
    /// ([`parse_command_file`]).
    pub command_file: Option<String>,
}

pub const USAGE: &str = "usage: nightshift-lease --bound-ms MILLISECONDS [--heartbeat PATH] [--relay PORT] (-- COMMAND [ARG...] | --command-file PATH)";

/// A warm sandbox's command file's name in the run's door directory.
pub const COMMAND_FILE: &str = "command";
/// Where it is inside the sandbox.
pub const COMMAND_FILE_IN_SANDBOX: &str = "/run/nightshift/command";
/// The largest command file the wrapper reads (the task text is at most
/// 64 KiB; its JSON escaping at most six bytes a byte).
pub const MAX_COMMAND_FILE: usize = 1 << 20;
/// The most arguments a command file may name.
pub const MAX_COMMAND_ARGS: usize = 4096;
/// The only environment a command file may set on the command: what a run
/// knows only once it is bound to its warm sandbox. Everything else of
/// the command's environment is the container's, as created and attested.
pub const LATE_ENV: [&str; 2] = ["NIGHTSHIFT_TASK", "NIGHTSHIFT_BASE_COMMIT"];

/// A warm sandbox's command, as the supervisor writes it into the door.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LateCommand {
    pub argv: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
}

/// The command file's bytes for `late` (the supervisor's side).
pub fn format_command_file(late: &LateCommand) -> Vec<u8> {
    serde_json::to_vec(late).unwrap_or_default()
}

/// Reads a command file strictly: at most [`MAX_COMMAND_FILE`] bytes of
/// JSON, a non-empty `argv` of at most [`MAX_COMMAND_ARGS`] arguments
/// without NUL bytes, and `env` only of [`LATE_ENV`] names, values without
/// NUL bytes.
pub fn parse_command_file(bytes: &[u8]) -> Result<LateCommand, String> {
    if bytes.len() > MAX_COMMAND_FILE {
        return Err(format!("the command file is over {MAX_COMMAND_FILE} bytes"));
    }
    let late: LateCommand = serde_json::from_slice(bytes)
        .map_err(|e| format!("the command file is not a command: {e}"))?;
    if late.argv.is_empty() {
        return Err("the command file names no command".into());
    }
    if late.argv.len() > MAX_COMMAND_ARGS {
        return Err(format!(
            "the command file names {} arguments (at most {MAX_COMMAND_ARGS})",
            late.argv.len()
        ));
    }
    if late.argv.iter().any(|a| a.contains('\0')) {
        return Err("an argument in the command file holds a NUL byte".into());
    }
    for (k, v) in &late.env {
        if !LATE_ENV.contains(&k.as_str()) {
            return Err(format!(
                "the command file sets {k:?}, which only the container's own environment may"
            ));
        }
        if v.contains('\0') {
            return Err(format!("the command file's {k} holds a NUL byte"));
        }
    }
    Ok(late)
}

/// Parses the wrapper's arguments (after the program name).
pub fn parse_args(args: &[String]) -> Result<Invocation, String> {
    let mut bound = None;
    let mut heartbeat = HEARTBEAT_IN_SANDBOX.to_string();
    let mut relay = None;
    let mut command_file = None;
    let mut rest = args.iter();
    loop {
        match rest.next().map(String::as_str) {
            Some("--bound-ms") => {
                let v = rest.next().ok_or("--bound-ms needs a value")?;
                let ms: u64 = v
                    .parse()
                    .map_err(|_| format!("--bound-ms {v:?} is not a number of milliseconds"))?;
                let b = Duration::from_millis(ms);
                if b < MIN_BOUND {
                    return Err(format!("--bound-ms {ms} is below the minimum of 1000"));
                }
                bound = Some(b);
            }
            Some("--heartbeat") => {
                heartbeat = rest.next().ok_or("--heartbeat needs a path")?.clone();
            }
            Some("--relay") => {
                let v = rest.next().ok_or("--relay needs a port")?;
                relay = Some(
                    v.parse::<u16>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| format!("--relay {v:?} is not a port"))?,
                );
            }
            Some("--command-file") => {
                command_file = Some(rest.next().ok_or("--command-file needs a path")?.clone());
            }
            Some("--") => break,
            Some(other) => return Err(format!("unknown argument {other:?}")),
            None if command_file.is_some() => break,
            None => return Err("no command given (after `--`)".into()),
        }
    }
    let command: Vec<String> = rest.cloned().collect();
    match (command.is_empty(), command_file.is_some()) {
        (true, false) => return Err("no command given (after `--`)".into()),
        (false, true) => return Err("a command and --command-file both given".into()),
        _ => {}
    }
    Ok(Invocation {
        bound: bound.ok_or("--bound-ms is required")?,
        heartbeat,
        relay,
        command,
        command_file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_growing_counter_renews_and_silence_expires() {
        let mut l = Lease::new(30 * S);
        assert_eq!(l.observe(Duration::ZERO, Some(1)), Verdict::Held);
        assert_eq!(l.observe(20 * S, Some(2)), Verdict::Held);
        assert_eq!(l.observe(50 * S, Some(2)), Verdict::Held);
        assert_eq!(
            l.observe(51 * S, None),
            Verdict::Expired {
                since_renewal: 31 * S
            }
        );
    }

    #[test]
    fn the_same_or_an_older_counter_renews_nothing() {
        let mut l = Lease::new(30 * S);
        l.observe(Duration::ZERO, Some(7));
        assert_eq!(l.observe(29 * S, Some(7)), Verdict::Held);
        assert!(matches!(
            l.observe(31 * S, Some(6)),
            Verdict::Expired { .. }
        ));
        assert!(matches!(
            l.observe(40 * S, Some(0)),
            Verdict::Expired { .. }
        ));
    }

    #[test]
    fn no_heartbeat_at_all_expires_after_the_grace() {
        let mut l = Lease::new(5 * S);
        assert_eq!(l.observe(5 * S, None), Verdict::Held);
        assert!(matches!(l.observe(6 * S, None), Verdict::Expired { .. }));
    }

    #[test]
    fn heartbeats_parse_strictly() {
        assert_eq!(
            parse_heartbeat(format_heartbeat(42, 1_700).as_bytes()),
            Some(42)
        );
        for bad in [
            &b""[..],
            b"42",
            b"42\n",
            b"42 17",
            b"-1 17\n",
            b"+1 17\n",
            b"1 17\n\n",
            b"99999999999999999999999 1\n",
            b"1  17\n",
        ] {
            assert_eq!(parse_heartbeat(bad), None, "{bad:?}");
        }
        let long = format!("1 {}\n", "1".repeat(MAX_HEARTBEAT));
        assert_eq!(parse_heartbeat(long.as_bytes()), None);
    }

    #[test]
    fn renewals_come_several_times_per_bound() {
        assert_eq!(renew_every(30 * S), 5 * S);
        assert_eq!(renew_every(6 * S), S);
        assert_eq!(
            renew_every(S),
            Duration::from_millis(166) + Duration::from_nanos(666_666)
        );
    }

    #[test]
    fn arguments() {
        let a = |v: &[&str]| parse_args(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let ok = a(&["--bound-ms", "30000", "--", "bash", "-c", "x"]).unwrap();
        assert_eq!(ok.bound, 30 * S);
        assert_eq!(ok.heartbeat, HEARTBEAT_IN_SANDBOX);
        assert_eq!(ok.command, ["bash", "-c", "x"]);
        assert_eq!(ok.relay, None);
        let relayed = a(&["--bound-ms", "30000", "--relay", "7878", "--", "x"]).unwrap();
        assert_eq!(relayed.relay, Some(7878));
        assert!(a(&["--bound-ms", "30000", "--relay", "0", "--", "x"]).is_err());
        assert!(a(&["--bound-ms", "30000", "--relay", "http", "--", "x"]).is_err());
        assert!(a(&["--bound-ms", "999", "--", "x"]).is_err());
        assert!(a(&["--bound-ms", "30000", "--"]).is_err());
        assert!(a(&["--", "x"]).is_err());
        assert!(a(&["--bound-ms"]).is_err());
        assert!(a(&["x"]).is_err());
        let warm = a(&[
            "--bound-ms",
            "30000",
            "--command-file",
            "/run/nightshift/command",
        ])
        .unwrap();
        assert_eq!(warm.command_file.as_deref(), Some(COMMAND_FILE_IN_SANDBOX));
        assert!(warm.command.is_empty());
        assert!(a(&["--bound-ms", "30000", "--command-file", "f", "--", "x"]).is_err());
        assert!(a(&["--bound-ms", "30000", "--command-file"]).is_err());
        assert_eq!(exit_status(Some(3), None), 3);
        assert_eq!(exit_status(None, Some(9)), 137);
    }

    #[test]
    fn command_files_parse_strictly() {
        let late = LateCommand {
            argv: vec!["sh".into(), "-c".into(), "echo \"$NIGHTSHIFT_TASK\"".into()],
            env: [("NIGHTSHIFT_TASK".to_string(), "fix the build\n".to_string())].into(),
        };
        assert_eq!(parse_command_file(&format_command_file(&late)), Ok(late));
        for bad in [
            &br#"{"argv": [], "env": {}}"#[..],
            br#"{"argv": ["x"], "env": {"PATH": "/tmp"}}"#,
            br#"{"argv": ["x"], "env": {"LD_PRELOAD": "/tmp/x.so"}}"#,
            br#"{"argv": ["x"], "env": {}, "cwd": "/"}"#,
            br#"{"argv": ["x\u0000y"], "env": {}}"#,
            br#"{"argv": ["x"], "env": {"NIGHTSHIFT_TASK": "a\u0000"}}"#,
            br#"{"argv": ["x"]}"#,
            b"",
            b"not json",
        ] {
            assert!(
                parse_command_file(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let many = LateCommand {
            argv: vec!["x".into(); MAX_COMMAND_ARGS + 1],
            env: Default::default(),
        };
        assert!(parse_command_file(&format_command_file(&many)).is_err());
        let huge = vec![b' '; MAX_COMMAND_FILE + 1];
        assert!(parse_command_file(&huge).unwrap_err().contains("over"));
    }

    proptest! {
        /// Whatever the heartbeat shows and whenever it is read, the lease
        /// never holds past the bound after the last growth of the counter.
        #[test]
        fn never_held_past_the_bound_after_the_last_growth(
            reads in proptest::collection::vec((0u64..5_000, proptest::option::of(0u64..20)), 1..60),
        ) {
            let bound = 2 * S;
            let mut l = Lease::new(bound);
            let (mut now, mut best, mut last_growth) = (Duration::ZERO, None::<u64>, Duration::ZERO);
            for (step_ms, counter) in reads {
                now += Duration::from_millis(step_ms);
                if let Some(c) = counter {
                    if best.is_none_or(|b| c > b) {
                        best = Some(c);
                        last_growth = now;
                    }
                }
                let held = l.observe(now, counter) == Verdict::Held;
                prop_assert_eq!(held, now - last_growth <= bound);
            }
        }
    }
}
