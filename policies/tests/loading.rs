//! Rule files: the shipped defaults load, and every malformed case gives
//! its named error with file, line and rule id.

use std::path::{Path, PathBuf};

use policies::rulefile::rule_set_from_files;
use policies::{evaluate, load_dir, ApplyError, Effect, LoadError, Request, RuleError, Timestamp};
use serde_json::json;

const NOW: Timestamp = Timestamp(1_800_000_000);

fn err(text: &str) -> LoadError {
    match rule_set_from_files([(Path::new("rules/p.toml"), text)]) {
        Ok(set) => panic!("expected an error, loaded {} rules", set.entries().len()),
        Err(e) => e,
    }
}

fn assert_names(e: &LoadError, line: usize, rule: Option<&str>, words: &str) {
    let msg = e.to_string();
    assert_eq!(e.line(), Some(line), "{msg}");
    assert_eq!(e.rule(), rule, "{msg}");
    assert!(msg.contains("rules/p.toml"), "{msg}");
    assert!(msg.contains(&format!("line {line}")), "{msg}");
    assert!(msg.contains(words), "{msg}");
}

const GOOD: &str = r#"
[[rule]]
id = "r1"
subject = "*"
doors = ["push"]
effect = "ask"
reason = "a person decides"
authority = "test"
"#;

#[test]
fn shipped_defaults_load_and_ask_for_every_door() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules");
    let set = load_dir(&dir).expect("default rules load");
    // Each door, with the fields the door sends (policies::doors).
    let push = |r: &str, force: bool, delete: bool| json!({"remote": "origin", "ref": r, "commit": "c", "force": force, "delete": delete});
    let cases = [
        (
            "push",
            push("refs/heads/agent/x", false, false),
            Effect::Ask,
            "ask-before-push",
        ),
        (
            "pull_request",
            json!({"remote": "origin", "base": "refs/heads/main", "head": "refs/heads/x", "commit": "c"}),
            Effect::Ask,
            "ask-before-pr",
        ),
        (
            "notify",
            json!({"destination": "team"}),
            Effect::Ask,
            "ask-before-notify",
        ),
        ("ask", json!({}), Effect::Ask, "ask-before-ask"),
        (
            "push",
            push("refs/heads/main", true, false),
            Effect::Refuse,
            "no-force-push-to-main",
        ),
        (
            "push",
            push("refs/heads/master", false, true),
            Effect::Refuse,
            "no-deleting-main",
        ),
    ];
    for (door, args, verdict, rule) in cases {
        let d = evaluate(&set, &Request::new(door, args), NOW);
        assert_eq!(
            (d.verdict, d.rule.to_string()),
            (verdict, rule.to_string()),
            "{door}: {d:?}"
        );
    }
    // Every door has a shipped rule, and every shipped rule fits the schema.
    for door in policies::doors::DOORS {
        let d = evaluate(&set, &Request::new(door.name, json!({})), NOW);
        assert_eq!(d.verdict, Effect::Ask, "{}: {d:?}", door.name);
    }
    assert_eq!(
        evaluate(&set, &Request::new("read", json!({})), NOW).verdict,
        Effect::Allow
    );
    // The compiled-in copy is the same file.
    let embedded =
        rule_set_from_files([(Path::new("default.toml"), policies::DEFAULT_RULES)]).unwrap();
    assert_eq!(embedded.generation(), set.generation());
}

#[test]
fn a_door_nightshift_does_not_have_is_named_at_its_line() {
    let e = err(&GOOD.replace(r#"doors = ["push"]"#, r#"doors = ["pr"]"#));
    assert_names(
        &e,
        5,
        Some("r1"),
        "door \"pr\" is not a door nightshift has",
    );
    assert!(e.to_string().contains("pull_request"), "{e}");
    // A glob must match at least one door.
    let e = err(&GOOD.replace(r#"doors = ["push"]"#, r#"doors = ["deploy*"]"#));
    assert_names(&e, 5, Some("r1"), "\"deploy*\"");
    // A tool named as a door points to `tools`.
    let e = err(&GOOD.replace(r#"doors = ["push"]"#, r#"doors = ["Bash"]"#));
    assert_names(&e, 5, Some("r1"), "`tools`");
}

#[test]
fn a_field_the_door_never_sends_is_named_at_its_clause() {
    let text = format!("{GOOD}match = [\n  {{ field = \"ref\", matches = 'main' }},\n  {{ field = \"body\", matches = 'x' }},\n]\n");
    let e = err(&text);
    assert_names(
        &e,
        11,
        Some("r1"),
        "field \"body\", which door push never sends",
    );
    let notify = GOOD.replace(r#"doors = ["push"]"#, r#"doors = ["notify"]"#);
    let e = err(&format!(
        "{notify}match = [{{ field = \"force\", matches = 'true' }}]\n"
    ));
    assert_names(&e, 9, Some("r1"), "door notify never sends");
}

#[test]
fn tools_are_open_and_bind_the_hook() {
    let text = GOOD.replace(
        r#"doors = ["push"]"#,
        r#"tools = ["Bash", "mcp__github__*"]"#,
    );
    let text = format!("{text}match = [{{ field = \"command\", matches = 'rm' }}]\n");
    let set = rule_set_from_files([(Path::new("rules/p.toml"), text.as_str())]).unwrap();
    let d = evaluate(&set, &Request::new("Bash", json!({"command": "rm x"})), NOW);
    assert_eq!(d.verdict, Effect::Ask);
    let d = evaluate(&set, &Request::new("push", json!({"command": "rm x"})), NOW);
    assert_eq!(d.verdict, Effect::Allow);
    // Neither doors nor tools is still an error.
    let none = GOOD.replace("doors = [\"push\"]\n", "");
    assert!(matches!(err(&none), LoadError::Rule { .. }));
}

#[test]
fn good_file_loads() {
    let set = rule_set_from_files([(Path::new("p.toml"), GOOD)]).unwrap();
    assert_eq!(set.entries().len(), 1);
    assert_eq!(set.generation().rows, 1);
}

#[test]
fn unknown_field_is_named() {
    let text = format!("{GOOD}\n[[rule]]\nid = \"r2\"\nsubject = \"*\"\ncolour = \"red\"\n");
    let e = err(&text);
    assert_names(&e, 13, Some("r2"), "unknown field `colour`");
}

#[test]
fn bad_effect_is_named() {
    let text = GOOD.replace("effect = \"ask\"", "effect = \"maybe\"");
    assert_names(&err(&text), 6, Some("r1"), "maybe");
}

#[test]
fn missing_field_is_named() {
    let text = GOOD.replace("reason = \"a person decides\"\n", "");
    let e = err(&text);
    assert!(e.to_string().contains("missing field `reason`"), "{e}");
    assert_eq!(e.rule(), Some("r1"), "{e}");
}

#[test]
fn bad_timestamp_is_named() {
    let text = format!("{GOOD}since = \"last tuesday\"\n");
    assert_names(&err(&text), 9, Some("r1"), "reading timestamp");
}

#[test]
fn look_around_is_refused_by_name_at_its_line() {
    let text = format!(
        "{GOOD}match = [\n  {{ field = \"command\", matches = \"npm publish\" }},\n  {{ field = \"command\", matches = \"npm(?! --registry)\" }},\n]\n"
    );
    let e = err(&text);
    assert_names(&e, 11, Some("r1"), "look-around is not allowed");
    let LoadError::Rule { source, .. } = &e else {
        panic!("{e:?}")
    };
    assert!(
        matches!(**source, RuleError::Pattern { index: 1, .. }),
        "{e:?}"
    );
}

#[test]
fn back_reference_is_refused_by_name() {
    let text = format!("{GOOD}match = [{{ field = \"x\", matches = '(a)\\1' }}]\n");
    assert_names(
        &err(&text),
        9,
        Some("r1"),
        "back-references are not allowed",
    );
}

#[test]
fn clause_with_both_tests_is_refused() {
    let text =
        format!("{GOOD}match = [{{ field = \"x\", matches = \"a\", not_matches = \"b\" }}]\n");
    assert_names(
        &err(&text),
        9,
        Some("r1"),
        "exactly one of matches / not_matches",
    );
}

#[test]
fn duplicate_id_is_named_at_the_second_declaration() {
    let text = format!("{GOOD}{GOOD}");
    let e = err(&text);
    assert_names(&e, 11, Some("r1"), "already exists");
    let LoadError::Apply { source, .. } = &e else {
        panic!("{e:?}")
    };
    assert!(matches!(**source, ApplyError::DuplicateId { .. }), "{e:?}");
}

#[test]
fn retirement_naming_no_rule_is_named() {
    let text =
        format!("{GOOD}\n[[retire]]\nrule = \"r9\"\nreason = \"gone\"\nauthority = \"test\"\n");
    let e = err(&text);
    assert_names(&e, 11, Some("r9"), "no such rule");
}

#[test]
fn a_directory_gives_its_own_toml_files_in_byte_order_of_their_names() {
    let dir = tempfile::tempdir().unwrap();
    let retire = "[[retire]]\nrule = \"r1\"\nreason = \"changed\"\nauthority = \"test\"\n";
    // `Z` sorts before `a` in bytes (not in a case-blind or locale order):
    // the declaration is read first, so the retirement finds its rule.
    std::fs::write(dir.path().join("Z.toml"), GOOD).unwrap();
    std::fs::write(dir.path().join("a.toml"), retire).unwrap();
    // Not read: another extension, a subdirectory's file, a directory.
    std::fs::write(dir.path().join("b.toml.bak"), "not toml [").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/c.toml"), "not toml [").unwrap();
    std::fs::create_dir(dir.path().join("d.toml")).unwrap();
    let set = load_dir(dir.path()).unwrap();
    let same =
        rule_set_from_files([(Path::new("Z.toml"), GOOD), (Path::new("a.toml"), retire)]).unwrap();
    assert_eq!(set.generation(), same.generation());
    assert_eq!(set.generation().rows, 2);
    // The other order names no rule to retire.
    std::fs::rename(dir.path().join("Z.toml"), dir.path().join("b.toml")).unwrap();
    let e = load_dir(dir.path()).unwrap_err();
    assert!(e.to_string().contains("a.toml"), "{e}");
}

#[test]
fn retirement_in_a_later_file_applies() {
    let retire = "[[retire]]\nrule = \"r1\"\nreason = \"changed\"\nauthority = \"test\"\n";
    let set =
        rule_set_from_files([(Path::new("a.toml"), GOOD), (Path::new("b.toml"), retire)]).unwrap();
    let d = evaluate(&set, &Request::new("push", json!({})), NOW);
    assert_eq!(d.verdict, Effect::Allow);
    assert_eq!(set.generation().rows, 2);
}

#[test]
fn not_toml_is_named_with_its_line() {
    let text = format!("{GOOD}doors = [\"push\"\n");
    let e = err(&text);
    assert!(matches!(e, LoadError::Parse { .. }), "{e}");
    assert!(e.line().is_some_and(|l| l >= 9), "{e}");
}

#[test]
fn reserved_ids_cannot_be_declared() {
    let text = GOOD.replace("id = \"r1\"", "id = \"nightshift:freeze\"");
    assert_names(&err(&text), 3, Some("nightshift:freeze"), "ids are");
}

#[test]
fn an_error_in_any_file_of_a_directory_loads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.toml"), GOOD).unwrap();
    std::fs::write(dir.path().join("b.toml"), GOOD.replace("ask", "perhaps")).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a rule file").unwrap();
    let e = load_dir(dir.path()).unwrap_err();
    assert!(e.to_string().contains("b.toml"), "{e}");
    std::fs::remove_file(dir.path().join("b.toml")).unwrap();
    assert_eq!(load_dir(dir.path()).unwrap().entries().len(), 1);
}
