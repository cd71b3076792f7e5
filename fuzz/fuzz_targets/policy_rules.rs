//! The policy rule file loader (`policies/src/rulefile.rs`, as `load.rs`
//! reads files): TOML text to a rule set, or an error naming file and line.
//!
//! The input is up to three files' texts separated by NUL bytes (TOML
//! cannot hold a NUL), applied in order as `load_dir` applies a
//! directory's files. Checked, beyond "no panic": an error names one of
//! the files and a line inside it; loading is deterministic (the same
//! generation twice); a set that loads decides requests for every door,
//! and a tool call, at a few clocks.
#![no_main]

use std::path::{Path, PathBuf};

use libfuzzer_sys::fuzz_target;
use policies::rulefile::rule_set_from_files;
use policies::{evaluate, LoadError, Request, Timestamp};
use serde_json::json;

fn requests() -> Vec<Request> {
    vec![
        Request::new(
            "push",
            json!({"remote": "origin", "ref": "refs/heads/agent/x",
                   "commit": "0123456789abcdef0123456789abcdef01234567",
                   "force": true, "delete": false, "repository": "/srv/repo"}),
        ),
        Request::new(
            "pull_request",
            json!({"remote": "origin", "base": "refs/heads/main", "head": "refs/heads/agent/x",
                   "commit": "0123456789abcdef0123456789abcdef01234567", "repository": "r"}),
        ),
        Request::new(
            "notify",
            json!({"destination": "team-chat", "repository": "r"}),
        ),
        Request::new("ask", json!({})),
        Request::new(
            "Bash",
            json!({"command": "rm -rf / --no-preserve-root", "cwd": "/workspace"}),
        ),
        Request::new("Write", json!({"file_path": "/workspace/../etc/passwd"})),
    ]
}

fn check_error(e: &LoadError, files: &[(PathBuf, &str)]) {
    let _ = e.to_string();
    let _ = e.rule();
    if let Some(line) = e.line() {
        let text = files
            .iter()
            .find(|(p, _)| e.to_string().contains(&p.display().to_string()))
            .map(|(_, t)| *t)
            .expect("the error names one of the files");
        let lines = text.bytes().filter(|b| *b == b'\n').count() + 1;
        assert!(line >= 1 && line <= lines, "line {line} of {lines}: {e}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let files: Vec<(PathBuf, &str)> = text
        .splitn(3, '\0')
        .enumerate()
        .map(|(i, t)| (PathBuf::from(format!("rules/{i}.toml")), t))
        .collect();
    let load = || rule_set_from_files(files.iter().map(|(p, t)| (Path::new(p), *t)));
    match load() {
        Err(e) => check_error(&e, &files),
        Ok(set) => {
            let again = load().expect("loads twice");
            assert_eq!(set.generation(), again.generation());
            for clock in [Timestamp(0), Timestamp(1_800_000_000), Timestamp(i64::MAX)] {
                for r in requests() {
                    let d = evaluate(&set, &r, clock);
                    assert_eq!(d, evaluate(&again, &r, clock));
                }
            }
        }
    }
});
