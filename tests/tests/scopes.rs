//! Autonomy scopes end to end, through real sandboxes, a real git remote and
//! the real binary: dry runs of a scripted agent that pushes to `agent/*`
//! branches and to `main`; the proposal lets the `agent/*` pushes through
//! and still asks for `main`; after the owner adopts it, a real run's
//! `agent/*` push is carried out without asking while its `main` push is
//! queued; the audit holds the adoption and each decision's deciding rule.

use tests::morning::Morning;
use tests::{image, stderr, stdout};

/// Commits, then pushes to `agent/<branch>` and to `main`.
fn script(branch: &str) -> String {
    format!(
        "echo {branch} > f.txt && git add f.txt && git commit -qm {branch} && \
         git push origin HEAD:refs/heads/agent/{branch} 2>&1; echo agent=$?; \
         git push origin HEAD:refs/heads/main 2>&1; echo main=$?"
    )
}

fn run(m: &Morning, dry: bool, script: &str) -> String {
    let repo = m.repo.path().to_str().unwrap().to_string();
    let img = image();
    let mut args = vec!["run"];
    if dry {
        args.push("--dry-run");
    }
    args.extend(["--repo", &repo, "--image", &img, "--", "bash", "-c", script]);
    let out = m.state.run(&args);
    assert!(
        out.status.success(),
        "run failed: {}{}",
        stdout(&out),
        stderr(&out)
    );
    m.state.runs().last().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

fn audit(m: &Morning, kind: &str) -> Vec<serde_json::Value> {
    m.state.audit_bodies(kind)
}

fn propose(m: &Morning) -> serde_json::Value {
    let out = m.state.run(&["scopes", "propose", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn dry_runs_propose_agent_branches_and_adoption_carries_them_out() {
    let m = Morning::new();
    let mut dry = Vec::new();
    for b in ["fix-1", "fix-2", "fix-3"] {
        let id = run(&m, true, &script(b));
        let log = m.state.output_log(&id);
        // Answered as in a real run: both pushes "queued" with a dry-run id.
        assert!(log.contains("agent=0") && log.contains("main=0"), "{log}");
        dry.push(id);
    }
    // Nothing queued, nothing pushed.
    assert!(m.queue().is_empty(), "{:?}", m.queue());
    assert_eq!(m.pushes_received(), 0);
    assert_eq!(m.remote_ref("refs/heads/main"), None);

    let proposals = propose(&m);
    let list = proposals["proposals"].as_array().unwrap();
    let agent: Vec<&serde_json::Value> = list
        .iter()
        .filter(|p| {
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .all(|t| t.as_str().unwrap().starts_with("refs/heads/agent/"))
        })
        .collect();
    assert!(!agent.is_empty(), "{proposals}");
    // Nothing proposed lets `main` through.
    for p in list {
        let text = p.to_string();
        assert!(
            !p["targets"].to_string().contains("refs/heads/main"),
            "{text}"
        );
    }
    let declined = proposals["declined"].to_string();
    assert!(declined.contains("refs/heads/main"), "{declined}");
    // The narrowest rung is the default, lists the three refs, and is safe;
    // the namespace rung is not safe and says why.
    let narrow = agent.iter().find(|p| p["rung"] == 0).unwrap();
    assert_eq!(narrow["default"], true);
    assert_eq!(narrow["safe"], true, "{narrow}");
    assert_eq!(narrow["evidence"]["count"], 3);
    assert_eq!(narrow["evidence"]["dry_runs"], 3);
    assert_eq!(narrow["evidence"]["runs"].as_array().unwrap().len(), 3);
    let wide = agent
        .iter()
        .find(|p| p["pattern"] == "^refs/heads/agent/[^/]+$")
        .unwrap_or_else(|| panic!("no namespace rung: {proposals}"));
    assert_eq!(wide["safe"], false);
    assert!(!wide["delta"].as_array().unwrap().is_empty(), "{wide}");
    let id = wide["id"].as_str().unwrap();

    // The diff shows what changes on the history: the three agent pushes
    // would be carried out; main stays asked for.
    let out = m.state.run(&["scopes", "diff", id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let diff: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let carried: Vec<&serde_json::Value> = diff["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["after"] == "carried")
        .collect();
    assert_eq!(carried.len(), 3, "{diff}");
    assert!(carried.iter().all(|c| c["target"]
        .as_str()
        .unwrap()
        .starts_with("refs/heads/agent/")));

    // Adoption needs the owner's key.
    let out = m.state.run(&["scopes", "adopt", id]);
    assert!(!out.status.success());
    let out = m.as_owner(&["scopes", "adopt", id]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let adopted = audit(&m, "scope_adopted");
    assert_eq!(adopted.len(), 1);
    assert_eq!(adopted[0]["proposal"], id);
    assert_eq!(
        adopted[0]["retired"],
        serde_json::json!(["ask-before-push"])
    );

    // A real run: the agent branch goes through without asking, main waits.
    let real = run(&m, false, &script("fix-4"));
    let log = m.state.output_log(&real);
    assert!(log.contains("agent=0") && log.contains("main=0"), "{log}");
    let head = m
        .remote_ref("refs/heads/agent/fix-4")
        .expect("the agent branch was pushed");
    assert_eq!(head.len(), 40);
    assert_eq!(m.remote_ref("refs/heads/main"), None);
    let q = m.queue();
    let pending: Vec<&serde_json::Value> = q.iter().filter(|a| a["status"] == "pending").collect();
    assert_eq!(pending.len(), 1, "{q:?}");
    assert_eq!(
        pending[0]["act"]["routing"]["target"]["target_ref"],
        "refs/heads/main"
    );
    // Each decision names its deciding rule.
    let doors: Vec<serde_json::Value> = m.state.show(&real)["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "door_request")
        .map(|e| e["body"].clone())
        .collect();
    assert_eq!(doors.len(), 2, "{doors:?}");
    assert_eq!(doors[0]["verdict"], "done");
    assert_eq!(doors[0]["rule"], format!("{id}-allow"));
    assert_eq!(doors[1]["verdict"], "queued");
    assert!(
        doors[1]["rule"].as_str().unwrap().starts_with(id),
        "main is decided by the narrowed ask: {doors:?}"
    );
    let approved: Vec<serde_json::Value> = audit(&m, "act")
        .into_iter()
        .filter(|a| a["transition"] == "approved")
        .collect();
    assert_eq!(approved.len(), 1);
    assert_eq!(approved[0]["fields"]["by"], format!("scope {id}-allow"));
    assert!(m.state.verify().status.success());
    assert!(m.state.containers().is_empty());
}

#[test]
fn a_refused_proposal_is_not_offered_again() {
    let m = Morning::new();
    run(&m, true, &script("only"));
    let proposals = propose(&m);
    let first = proposals["proposals"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let out = m
        .state
        .run(&["scopes", "refuse", &first, "--why", "not yet"]);
    assert!(!out.status.success(), "refusing needs the owner's key");
    let out = m.as_owner(&["scopes", "refuse", &first, "--why", "not yet"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let again = propose(&m);
    assert!(
        !again.to_string().contains(&first),
        "{first} offered again: {again}"
    );
    let refused = audit(&m, "scope_refused");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0]["proposal"], first.as_str());
}
