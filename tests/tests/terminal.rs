//! Untrusted text is never a terminal's instruction: an agent puts escape
//! sequences (a window title, a screen clear), C1 controls, bidirectional
//! overrides and isolates, zero-width characters and a byte-order mark into
//! its file names, commit messages, branch names, output, file contents and
//! act bodies; every command a person runs afterwards prints none of them
//! raw, and a reader that goes away (`| head`) makes no command panic.

use std::process::{Output, Stdio};

use tests::{git, image, make_repo, only_run, stderr, stdout, State};

/// What no command may print: controls other than newline and tab (ESC,
/// BEL, CR, DEL, the C1 range), bidirectional controls, zero-width and
/// other invisible format characters.
fn forbidden(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c,
            '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
            | '\u{200b}'..='\u{200d}' | '\u{2060}'..='\u{2064}' | '\u{feff}' | '\u{180e}'
            | '\u{ad}' | '\u{2028}' | '\u{2029}')
}

fn assert_clean(what: &str, out: &Output) {
    for (stream, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let text = String::from_utf8_lossy(bytes);
        if let Some((at, c)) = text.char_indices().find(|&(_, c)| forbidden(c)) {
            let from = text[..at]
                .char_indices()
                .rev()
                .nth(40)
                .map_or(0, |(i, _)| i);
            panic!(
                "`{what}` printed U+{:04X} raw on {stream}, after {:?}",
                c as u32,
                &text[from..at]
            );
        }
    }
}

/// Runs a command whose stdout is a pipe nobody reads any more (as after
/// `| head -c 10` has read its fill): it must end quietly, by itself.
fn with_closed_stdout(state: &State, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    state
        .cmd()
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn no_command_prints_agent_text_raw() {
    let state = State::new();
    let repo = make_repo();
    let remote = tempfile::tempdir().unwrap();
    let bare = remote.path().join("origin.git");
    git(
        remote.path(),
        &["init", "-q", "--bare", bare.to_str().unwrap()],
    );
    std::fs::write(
        state.path().join("destinations.toml"),
        format!(
            "[remotes.origin]\nurl = \"file://{}\"\nreaders = \"private\"\n\n\
             [notify.team]\nurl = \"http://127.0.0.1:9/hook\"\nreaders = \"private\"\n",
            bare.display()
        ),
    )
    .unwrap();

    // ESC ] 0 ; title BEL, ESC [ 2 J, U+202E, U+2066..U+2069, U+200B, U+FEFF, C1 CSI.
    let script = r#"set -u
cd /workspace
EVIL=$(printf '\033]0;pwned\007\033[2J\342\200\256\342\201\246\342\201\247\342\201\250\342\201\251\342\200\213\357\273\277\302\233')
BIDI=$(printf '\342\200\256\342\201\246\342\201\247\342\201\250\342\201\251\342\200\213\357\273\277')
printf 'line one %s\nline two\n' "$EVIL" > "file-$EVIL.txt"
printf 'plain %s\n' "$BIDI" > "bidi-$BIDI.txt"
git add -A && git commit -q -m "subject $EVIL" -m "body $BIDI"
git branch "branch-$BIDI" && echo "branch=$?"
git push origin HEAD:refs/heads/agent/evil 2>&1; echo "push=$?"
printf 'notify %s\nsecond line %s\n' "$BIDI" "$BIDI" > note.txt
nightshift-act notify team --file note.txt; echo "notify=$?"
printf 'ask %s?\n' "$BIDI" > question.txt
nightshift-act ask --file question.txt; echo "ask=$?"
printf 'escapes %s\n' "$EVIL" > escapes.txt
nightshift-act notify team --file escapes.txt; echo "notify-escapes=$?"
mkfifo "fifo-$EVIL"
echo "stdout $EVIL"
echo "stderr $EVIL" >&2
echo "uncommitted $EVIL" > "uncommitted-$EVIL"
"#;
    let run = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        script,
    ]);
    let log = state.output_log(only_run(&state)["id"].as_str().unwrap());
    assert!(
        run.status.success(),
        "the run failed: {}{}\n{log}",
        stdout(&run),
        stderr(&run)
    );
    assert!(log.contains("push=0"), "{log}");
    assert!(log.contains("notify=0"), "{log}");
    assert!(log.contains("ask=0"), "{log}");
    assert_clean("run", &run);
    let id = only_run(&state)["id"].as_str().unwrap().to_string();

    let queue = state.run(&["queue", "--json"]);
    let acts: Vec<serde_json::Value> = serde_json::from_slice(&queue.stdout).unwrap();
    assert_eq!(acts.len(), 3, "push, notify, ask: {acts:?}");

    let mut outputs = vec![
        ("runs", state.run(&["runs"])),
        ("runs --json", state.run(&["runs", "--json"])),
        ("show", state.run(&["show", &id])),
        ("show --json", state.run(&["show", &id, "--json"])),
        ("queue", state.run(&["queue"])),
        ("queue --json", queue),
        ("audit verify", state.run(&["audit", "verify"])),
        (
            "audit verify --json",
            state.run(&["audit", "verify", "--json"]),
        ),
    ];
    for act in &acts {
        let act = act["act"]["id"].as_str().unwrap().to_string();
        outputs.push(("queue show", state.run(&["queue", "show", &act])));
    }
    for (what, out) in &outputs {
        assert!(out.status.success(), "`{what}` failed: {}", stderr(out));
        assert_clean(what, out);
    }
    // Not vacuous: what the agent wrote is there, shown visibly.
    let shown = |what: &str| {
        outputs
            .iter()
            .filter(|(w, _)| *w == what)
            .map(|(_, o)| stdout(o))
            .collect::<String>()
    };
    assert!(
        shown("show").contains("fifo-\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\\u{202e}\\u{2066}"),
        "{}",
        shown("show")
    );
    let diff_and_bodies = shown("queue show");
    assert!(
        diff_and_bodies.contains("line one \\u{1b}]0;pwned"),
        "{diff_and_bodies}"
    );
    assert!(
        diff_and_bodies.contains(
            "notify \\u{202e}\\u{2066}\\u{2067}\\u{2068}\\u{2069}\\u{200b}\\u{feff}\nsecond line"
        ),
        "{diff_and_bodies}"
    );
    assert!(
        diff_and_bodies.contains("ask \\u{202e}"),
        "{diff_and_bodies}"
    );
    assert!(
        stdout(&run).contains("stdout \\u{1b}]0;pwned"),
        "{}",
        stdout(&run)
    );
    // The JSON still says exactly what the agent wrote, once parsed.
    let doc: serde_json::Value = serde_json::from_str(&shown("show --json")).unwrap();
    let skipped: Vec<&str> = doc["run"]["observed"]["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["path"].as_str())
        .collect();
    assert!(
        skipped
            .iter()
            .any(|p| p.starts_with("fifo-\u{1b}]0;pwned\u{7}\u{1b}[2J\u{202e}\u{2066}")),
        "{skipped:?}"
    );

    // A reader that has gone away: no panic, no signal, nothing on stderr.
    for args in [
        &["show", id.as_str(), "--json"][..],
        &["show", id.as_str()],
        &["runs"],
        &["runs", "--json"],
        &["queue"],
        &["queue", "--json"],
        &["audit", "verify"],
    ] {
        let out = with_closed_stdout(&state, args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "`{}` with a closed stdout: {:?} {}",
            args.join(" "),
            out.status,
            stderr(&out)
        );
        assert_eq!(
            stderr(&out),
            "",
            "`{}` with a closed stdout",
            args.join(" ")
        );
    }
    assert!(state.containers().is_empty());
}
