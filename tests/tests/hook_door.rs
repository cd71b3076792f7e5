//! The policy hook inside a real sandbox: `nightshift-act policy-check`
//! reads a harness's hook payload, asks the run's rules through the door,
//! and exits 0 only when they allow the call; refusals and asks are
//! audited with the run; any failure of the door refuses (fail closed). A
//! command given as an array (an argv, a shell and its line) is matched as
//! its words and its shell line, under a measured memory bound.

use tests::{image, make_repo, only_run, stderr, stdout, State};

/// The run's rules: recursive deletes in Bash refused, web fetches asked.
fn rules(state: &State) {
    let dir = state.path().join("rules");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("10-tools.toml"),
        r#"[[rule]]
id = "no-recursive-delete"
subject = "run-*"
tools = ["Bash"]
effect = "refuse"
reason = "Recursive deletes are not done by agents; delete files by name."
authority = "test"
match = [{ field = "command", matches = 'rm\s+-[a-zA-Z]*r' }]

[[rule]]
id = "ask-before-fetch"
subject = "*"
tools = ["WebFetch"]
effect = "ask"
reason = "Fetching from the web needs a person."
authority = "test"
"#,
    )
    .unwrap();
}

fn decisions(state: &State) -> Vec<(Option<String>, serde_json::Value)> {
    state.audit_runs_and_bodies("policy_decision")
}

const AGENT: &str = r#"
check() { # NAME PAYLOAD...
  name=$1; shift
  out=$(printf '%s' "$1" | "${@:2}" nightshift-act policy-check 2>&1); rc=$?
  printf '%s rc=%s out=[%s]\n' "$name" "$rc" "$out"
}
check rm '{"session_id":"s","hook_event_name":"PreToolUse","cwd":"/workspace","tool_name":"Bash","tool_input":{"command":"rm -rf src","description":"clean"}}'
check ls '{"session_id":"s","hook_event_name":"PreToolUse","cwd":"/workspace","tool_name":"Bash","tool_input":{"command":"ls -la"}}'
check fetch '{"tool_name":"WebFetch","tool_input":{"url":"https://example.com"}}'
check notjson 'rm -rf /'
check nopayload '{"tool_name":"Bash"}'
check doordown '{"tool_name":"Bash","tool_input":{"command":"ls"}}' env NIGHTSHIFT_DOOR=/run/nightshift/no-such.sock
# The tool call the hook refused never ran: src is still there.
test -d src && echo "src-still-here"
"#;

#[test]
fn a_hook_payload_from_inside_a_sandbox_is_decided_by_the_runs_rules_and_fails_closed() {
    let state = State::new();
    let repo = make_repo();
    assert!(state.run(&["runs"]).status.success());
    rules(&state);
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        AGENT,
    ]);
    assert!(
        out.status.success(),
        "run failed: {}{}",
        stdout(&out),
        stderr(&out)
    );
    let run = only_run(&state)["id"].as_str().unwrap().to_string();
    let log = state.output_log(&run);
    let line = |name: &str| {
        log.lines()
            .find(|l| l.starts_with(&format!("{name} rc=")))
            .unwrap_or_else(|| panic!("no {name} line in {log}"))
            .to_string()
    };
    assert_eq!(
        line("rm"),
        "rm rc=2 out=[refused by rule no-recursive-delete: Recursive deletes are not done by agents; delete files by name.]"
    );
    assert_eq!(line("ls"), "ls rc=0 out=[]");
    assert_eq!(
        line("fetch"),
        "fetch rc=2 out=[asks a person: Fetching from the web needs a person.]"
    );
    assert!(
        line("notjson").starts_with(
            "notjson rc=2 out=[refused by rule nightshift:hook-input: stdin is not JSON"
        ),
        "{log}"
    );
    assert!(
        line("nopayload")
            .starts_with("nopayload rc=2 out=[refused by rule nightshift:hook-input: "),
        "{log}"
    );
    assert!(
        line("doordown")
            .starts_with("doordown rc=2 out=[refused by rule nightshift:door: door unreachable"),
        "{log}"
    );
    assert!(log.contains("src-still-here"), "{log}");

    // Refusals and asks that reached the supervisor are audited with the
    // run, the tool and the run's actor; the allowed call wrote nothing.
    let d = decisions(&state);
    let summary: Vec<(Option<&str>, &str, &str, &str)> = d
        .iter()
        .map(|(r, b)| {
            (
                r.as_deref(),
                b["door"].as_str().unwrap_or(""),
                b["verdict"].as_str().unwrap_or(""),
                b["rule"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (Some(run.as_str()), "Bash", "refuse", "no-recursive-delete"),
            (Some(run.as_str()), "WebFetch", "ask", "ask-before-fetch"),
            (
                Some(run.as_str()),
                "Bash",
                "refuse",
                "nightshift:hook-input"
            ),
        ],
        "{d:?}"
    );
    assert_eq!(d[0].1["actor"], format!("run-{run}"));
    assert!(state.verify().status.success());
    assert!(state.containers().is_empty());
}

#[test]
fn a_frozen_state_refuses_every_tool_call_through_the_door() {
    let state = State::new();
    let repo = make_repo();
    assert!(state.run(&["runs"]).status.success());
    rules(&state);
    // Frozen after the run starts: the agent waits for the freeze.
    let script = format!(
        "{}{}",
        tests::WAIT_AT_GATE,
        r#"out=$(printf '%s' '{"tool_name":"Read","tool_input":{"file_path":"/workspace/README.md"}}' | nightshift-act policy-check 2>&1); echo "read rc=$? out=[$out]""#
    );
    let mut child = state
        .cmd()
        .args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
            "bash",
            "-c",
            &script,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let run = tests::wait_running(&state, &mut child, 1).remove(0);
    assert!(state
        .run(&["freeze", "--why", "night off"])
        .status
        .success());
    tests::open_gate(&state, &run);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let log = state.output_log(&run);
    assert!(
        log.contains(
            "read rc=2 out=[refused by rule nightshift:freeze: everything is frozen: night off]"
        ),
        "{log}"
    );
}

/// The `VmHWM` (peak resident memory) of a process, in KiB.
fn peak_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[test]
fn a_command_given_as_an_array_is_matched_as_its_words_and_line_under_a_memory_bound() {
    // `["rm","-rf","x"]` and `["bash","-lc","rm\t-rf x"]` were matched as
    // compact JSON, which no rule for a command line matches. Then hostile
    // arrays near the frame's limit: 45 000 one-letter words (the hook input limit is 200 KiB), and words of
    // quotes (each `'` four bytes in the shell line), 20 times each, while
    // the supervisor's peak memory is read.
    let state = State::new();
    let repo = make_repo();
    assert!(state.run(&["runs"]).status.success());
    tests::agents::refuse_recursive_deletes(&state);
    let agent = r#"
check() { # NAME PAYLOAD
  out=$(printf '%s' "$2" | nightshift-act policy-check 2>&1); rc=$?
  printf '%s rc=%s out=[%s]\n' "$1" "$rc" "$out"
}
check argv '{"tool_name":"Bash","tool_input":{"command":["rm","-rf","src"]}}'
check shell '{"tool_name":"Bash","tool_input":{"command":["bash","-lc","rm\t-rf /workspace/src"]}}'
check upper '{"tool_name":"Bash","tool_input":{"command":"rm -R src"}}'
check split '{"tool_name":"Bash","tool_input":{"command":"rm -f -r src"}}'
check fine '{"tool_name":"Bash","tool_input":{"command":["rm","-f","src/lib.txt.bak"]}}'
python3 - <<'PY'
import json, subprocess
words = json.dumps({"tool_name": "Bash", "tool_input": {"command": ["a"] * 45000}})
quotes = json.dumps({"tool_name": "Bash", "tool_input": {"command": ["'" * 3000] * 60}})
for name, p in (("words", words), ("quotes", quotes)):
    rcs = set()
    for _ in range(20):
        r = subprocess.run(["nightshift-act", "policy-check"], input=p.encode(), capture_output=True)
        rcs.add(r.returncode)
    print("%s bytes=%d rcs=%s err=%s" % (name, len(p), sorted(rcs), r.stderr.decode()[:200]))
PY
echo hostile-done
while [ ! -e release ]; do sleep 0.2; done
rm -f release
"#;
    let child = state
        .cmd()
        .args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
        ])
        .args(["--", "bash", "-c", agent])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let started = std::time::Instant::now();
    let (run, worktree) = loop {
        let runs = state.runs();
        if let Some(id) = runs.last().and_then(|r| r["id"].as_str()) {
            if state.output_log(id).contains("hostile-done") {
                break (id.to_string(), state.path().join("worktrees").join(id));
            }
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(600),
            "the agent never finished"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let peak = peak_kib(pid).expect("the supervisor's /proc status");
    std::fs::write(worktree.join("release"), "").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let log = state.output_log(&run);
    let refused =
        "rc=2 out=[refused by rule no-recursive-delete: Recursive deletes are not done by agents";
    for name in ["argv", "shell", "upper", "split"] {
        assert!(log.contains(&format!("{name} {refused}")), "{name}: {log}");
    }
    assert!(log.contains("fine rc=0 out=[]"), "{log}");
    // The hostile arrays were answered (allowed: they delete nothing).
    assert!(
        log.contains("words bytes=") && log.contains("quotes bytes="),
        "{log}"
    );
    assert!(!log.contains("rcs=[1]") && log.contains("rcs=[0]"), "{log}");
    eprintln!("supervisor peak resident memory: {peak} KiB");
    assert!(
        peak < 128 * 1024,
        "the supervisor's peak resident memory was {peak} KiB: {log}"
    );
    assert!(state.containers().is_empty());
}
