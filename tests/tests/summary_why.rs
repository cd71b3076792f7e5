//! Failures say why (issue 23, item 2): `nightshift summary` lists each
//! failed run and act with its reason, escaped and bounded, while the
//! summary it sends stays counts and ids only.

use orchestrator::state_store::RunRecord;
use tests::{stderr, stdout, State};

#[test]
fn the_summary_says_why_each_run_failed() {
    let state = State::new();
    {
        let mut store = state.stores().connect().unwrap();
        for (id, status, reason) in [
            (
                "01failed",
                "exited 2",
                Some("history dropped: object_too_large\u{1b}[31m"),
            ),
            ("01fine", "exited 0", None),
            ("01capped", "killed: timeout 2s", None),
        ] {
            store
                .put_run(&RunRecord {
                    id: id.into(),
                    created_at: "2026-01-01T00:00:00Z".into(),
                    ended_at: Some("2026-01-01T01:00:00Z".into()),
                    status: status.into(),
                    reason: reason.map(str::to_string),
                    ..Default::default()
                })
                .unwrap();
        }
    }
    let out = state.run(&["summary"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let why = &text[text
        .find("why:\n")
        .unwrap_or_else(|| panic!("no why: {text}"))..];
    assert!(
        why.contains("run 01failed: exited 2: history dropped: object_too_large\\u{1b}[31m"),
        "{why}"
    );
    assert!(why.contains("run 01capped: killed: timeout 2s"), "{why}");
    assert!(!why.contains("01fine"), "{why}");
    assert!(
        !text.contains('\u{1b}'),
        "a raw escape reached the terminal"
    );
    let out = state.run(&["summary", "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["failures"].as_array().unwrap().len(), 2, "{doc}");
}
