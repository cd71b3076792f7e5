//! The shipped optional rule `no-recursive-delete`
//! (`policies/rules/optional/no-recursive-delete.toml`) refuses a recursive `rm` in
//! its common spellings, as a string, as an argv array and as a shell and
//! its line; and commands that delete nothing recursively pass.

use std::path::Path;

use policies::rule::shell_join;
use policies::rulefile::rule_set_from_files;
use policies::{evaluate, Request, RuleSet, Timestamp, Verdict, RECURSIVE_DELETE_RULE};
use proptest::prelude::*;
use serde_json::{json, Value};

const NOW: Timestamp = Timestamp(1_800_000_000);

fn rules() -> RuleSet {
    rule_set_from_files([(Path::new("no-recursive-delete.toml"), RECURSIVE_DELETE_RULE)])
        .expect("the shipped rule file loads")
}

fn verdict(rules: &RuleSet, command: Value) -> Verdict {
    let request = Request {
        actor: Some("run-1".into()),
        door: "Bash".into(),
        args: json!({ "command": command, "description": "x" }),
        scope: None,
    };
    evaluate(rules, &request, NOW).verdict
}

#[test]
fn the_spellings_the_attack_used_are_refused() {
    let rules = rules();
    for command in [
        json!("rm -rf /workspace/src"),
        json!("rm -R src"),
        json!("rm -f -r src"),
        json!("rm\t-rf src"),
        json!("rm --recursive src"),
        json!("rm src -rf"),
        json!("/bin/rm -fr src"),
        json!(["rm", "-rf", "x"]),
        json!(["rm", "-f", "-R", "x"]),
        json!(["bash", "-lc", "rm\t-rf /workspace/src"]),
        json!(["sh", "-c", "cd /workspace && rm -r -f src"]),
        json!(["bash", ["-c", "rm -rf x"]]),
    ] {
        assert_eq!(
            verdict(&rules, command.clone()),
            Verdict::Refuse,
            "{command}"
        );
    }
    for command in [
        json!("rm -f src/a.txt"),
        json!("rm --dir empty"),
        json!("rm -f x; ls -R"),
        json!("grep -r rm ."),
        json!(["rm", "-f", "x"]),
        json!(["ls", "-R"]),
        json!("git status"),
    ] {
        assert_eq!(
            verdict(&rules, command.clone()),
            Verdict::Allow,
            "{command}"
        );
    }
}

/// How `rm` may be named.
fn rm_word() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "rm",
        "/bin/rm",
        "/usr/bin/rm",
        "\\rm",
        "\"rm\"",
        "'rm'",
    ])
    .prop_map(str::to_owned)
}

/// What may come before the command.
fn prefix() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "",
        "sudo ",
        "cd /workspace && ",
        "xargs ",
        "git ",
        "command ",
    ])
    .prop_map(str::to_owned)
}

/// Whitespace between words.
fn gap() -> impl Strategy<Value = String> {
    prop::sample::select(vec![" ", "  ", "\t", " \t "]).prop_map(str::to_owned)
}

/// An option that makes `rm` recursive.
fn recursive_option() -> impl Strategy<Value = String> {
    prop_oneof![
        "-[fvi]{0,2}[rR][fvi]{0,2}".prop_map(|s| s),
        Just("--recursive".to_owned()),
    ]
}

/// An option that does not.
fn other_option() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "-f",
        "-v",
        "-i",
        "-fv",
        "--force",
        "--verbose",
        "--dir",
        "-d",
    ])
    .prop_map(str::to_owned)
}

fn operand() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_./]{0,10}".prop_map(|s| s)
}

/// Words of an `rm` with at least one recursive option, anywhere among
/// other options and operands.
fn recursive_rm() -> impl Strategy<Value = (String, Vec<String>)> {
    (
        rm_word(),
        prop::collection::vec(prop_oneof![other_option(), operand()], 0..4),
        recursive_option(),
        prop::collection::vec(prop_oneof![other_option(), operand()], 0..4),
    )
        .prop_map(|(rm, before, opt, after)| {
            let mut args = before;
            args.push(opt);
            args.extend(after);
            (rm, args)
        })
}

fn line(prefix: &str, rm: &str, args: &[String], gap: &str) -> String {
    let mut s = format!("{prefix}{rm}");
    for a in args {
        s.push_str(gap);
        s.push_str(a);
    }
    s
}

proptest! {
    #[test]
    fn any_recursive_rm_is_refused_as_a_line_an_argv_or_a_shell_and_its_line(
        (rm, args) in recursive_rm(),
        prefix in prefix(),
        gap in gap(),
        shell in prop::sample::select(vec!["bash", "sh", "/bin/bash"]),
        flag in prop::sample::select(vec!["-c", "-lc"]),
    ) {
        let rules = rules();
        let text = line(&prefix, &rm, &args, &gap);
        prop_assert_eq!(verdict(&rules, json!(text)), Verdict::Refuse, "{:?}", text);
        let bare = rm.trim_matches(|c| c == '"' || c == '\'');
        let mut argv = vec![bare.to_owned()];
        argv.extend(args.iter().cloned());
        prop_assert_eq!(verdict(&rules, json!(argv)), Verdict::Refuse, "{:?}", argv);
        prop_assert_eq!(
            verdict(&rules, json!([shell, flag, text.clone()])),
            Verdict::Refuse,
            "{:?}", text
        );
        // The argv's shell line is the line a person would type.
        prop_assert_eq!(
            verdict(&rules, json!(shell_join(argv.iter().map(String::as_str)))),
            Verdict::Refuse
        );
    }

    #[test]
    fn an_rm_with_no_recursive_option_passes(
        rm in rm_word(),
        args in prop::collection::vec(prop_oneof![other_option(), operand()], 0..6),
        prefix in prefix(),
        gap in gap(),
    ) {
        let rules = rules();
        let text = line(&prefix, &rm, &args, &gap);
        prop_assert_eq!(verdict(&rules, json!(text)), Verdict::Allow, "{:?}", text);
        let mut argv = vec!["rm".to_owned()];
        argv.extend(args.iter().cloned());
        prop_assert_eq!(verdict(&rules, json!(argv)), Verdict::Allow, "{:?}", argv);
    }

    #[test]
    fn shell_join_quotes_only_what_a_shell_would_split(words in prop::collection::vec(".{0,8}", 0..5)) {
        let joined = shell_join(words.iter().map(String::as_str));
        for w in &words {
            if !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) {
                prop_assert!(joined.contains(w.as_str()));
            } else {
                prop_assert!(joined.contains('\''), "{:?} -> {:?}", words, joined);
            }
        }
    }
}
