//! The lean entry point: `nightshift policy check` (the hook every agent
//! tool call pays, one process each) and `nightshift --version` are
//! recognised from the raw arguments before anything else is built: no
//! clap command tree, no async runtime. What the check then does is the
//! full path's own code (`store_setting`, `build_stores`, `policy_check`
//! in `main.rs`): the parsing of the command line is all that is apart
//! (`tests/tests/hook_host.rs::the_lean_entry_point_and_the_full_command_line_answer_alike`).
//!
//! Invariants:
//! - A command line is taken here only when clap would read it the same
//!   way; anything else (an unknown or repeated flag, `--flag=value`, a
//!   value that starts with `-` other than `-` itself, an empty value, a
//!   non-UTF-8 argument, `--help`, an environment variable clap reads that
//!   is set but empty or not UTF-8, a log format other than text) goes to
//!   clap, which answers or reports it as before
//!   (`tests::the_fast_parse_agrees_with_clap_on_generated_command_lines`).
//! - The environment clap reads for these flags (`NIGHTSHIFT_STATE_DIR`,
//!   `NIGHTSHIFT_CONFIG`, `NIGHTSHIFT_STORE`, `NIGHTSHIFT_STORE_FILE`) is
//!   read the same way: a flag given wins over its variable.

use std::ffi::OsString;
use std::path::PathBuf;

/// A command line the lean entry point answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fast {
    /// `nightshift --version` (or `-V`).
    Version,
    /// `nightshift [globals] policy [--rules DIR] check [flags]`.
    Check(Check),
}

/// `policy check`'s flags and the global ones it uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Check {
    pub(crate) state_dir: Option<PathBuf>,
    pub(crate) config: Option<PathBuf>,
    pub(crate) store: Option<String>,
    pub(crate) store_file: Option<PathBuf>,
    pub(crate) rules: Option<PathBuf>,
    pub(crate) actor: Option<String>,
    pub(crate) tool: String,
    pub(crate) args_json: String,
}

/// The environment variables clap reads for the global flags.
const ENV: [&str; 6] = [
    "NIGHTSHIFT_STATE_DIR",
    "NIGHTSHIFT_CONFIG",
    "NIGHTSHIFT_STORE",
    "NIGHTSHIFT_STORE_FILE",
    "NIGHTSHIFT_HOSTED",
    "NIGHTSHIFT_LOG_FORMAT",
];

/// The command line `args` (without the program's name) when the lean
/// entry point answers it, `env` being the process's environment; `None`
/// sends it to clap.
pub(crate) fn parse(args: &[OsString], env: impl Fn(&str) -> Option<OsString>) -> Option<Fast> {
    let mut vars: [Option<String>; 6] = Default::default();
    for (slot, name) in vars.iter_mut().zip(ENV) {
        if let Some(value) = env(name) {
            let value = value.into_string().ok().filter(|v| !v.is_empty())?;
            *slot = Some(value);
        }
    }
    let [state_dir, config, store, store_file, _hosted, log_format] = vars;
    // JSON logs (or a bad value, which clap reports) take the full path.
    if log_format.is_some_and(|f| f != "text") {
        return None;
    }
    let args: Vec<&str> = args
        .iter()
        .map(|a| a.to_str())
        .collect::<Option<Vec<_>>>()?;
    if matches!(args.as_slice(), ["--version"] | ["-V"]) {
        return Some(Fast::Version);
    }
    let mut check = Check::default();
    let (mut state_flag, mut config_flag, mut store_flag, mut file_flag) = (None, None, None, None);
    let mut tool = None;
    let mut args_json = None;
    // 0: before `policy`; 1: after it; 2: after `check`.
    let mut stage = 0;
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        if !arg.starts_with('-') {
            match (stage, arg) {
                (0, "policy") | (1, "check") => {
                    stage += 1;
                    continue;
                }
                _ => return None,
            }
        }
        let slot: &mut Option<String> = match (stage, arg) {
            (_, "--state-dir") => &mut state_flag,
            (_, "--config") => &mut config_flag,
            (_, "--store") => &mut store_flag,
            (_, "--store-file") => &mut file_flag,
            (1 | 2, "--rules") => {
                if check.rules.is_some() {
                    return None;
                }
                check.rules = Some(PathBuf::from(value(it.next())?));
                continue;
            }
            (2, "--actor") => {
                if check.actor.is_some() {
                    return None;
                }
                check.actor = Some(value(it.next())?.to_string());
                continue;
            }
            (2, "--tool") => &mut tool,
            (2, "--args-json") => &mut args_json,
            _ => return None,
        };
        if slot.is_some() {
            return None;
        }
        *slot = Some(value(it.next())?.to_string());
    }
    if stage != 2 {
        return None;
    }
    check.tool = tool?;
    check.args_json = args_json.unwrap_or_else(|| "-".into());
    check.state_dir = state_flag.or(state_dir).map(PathBuf::from);
    check.config = config_flag.or(config).map(PathBuf::from);
    check.store = store_flag.or(store);
    check.store_file = file_flag.or(store_file).map(PathBuf::from);
    Some(Fast::Check(check))
}

/// A flag's value as clap takes it without question: present, not empty,
/// and `-` or not starting with `-`.
fn value(next: Option<&str>) -> Option<&str> {
    next.filter(|v| !v.is_empty() && (*v == "-" || !v.starts_with('-')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use proptest::prelude::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn no_env(_: &str) -> Option<OsString> {
        None
    }

    /// What clap makes of `args`, in the fast parse's terms; `None` when
    /// it is not a `policy check` (or clap refuses it).
    fn by_clap(args: &[&str]) -> Option<Check> {
        let cli =
            crate::Cli::try_parse_from(std::iter::once("nightshift").chain(args.iter().copied()))
                .ok()?;
        let crate::Command::Policy(policy) = cli.command else {
            return None;
        };
        let crate::PolicyCommand::Check(args) = policy.command else {
            return None;
        };
        Some(Check {
            state_dir: cli.state_dir,
            config: cli.config,
            store: cli.store,
            store_file: cli.store_file,
            rules: policy.rules,
            actor: args.actor,
            tool: args.tool,
            args_json: args.args_json,
        })
    }

    #[test]
    fn the_hooks_own_command_lines_are_taken() {
        let cases: &[&[&str]] = &[
            &[
                "policy",
                "check",
                "--actor",
                "agent-a",
                "--tool",
                "Bash",
                "--args-json",
                "-",
            ],
            &["policy", "check", "--tool", "-"],
            &[
                "--state-dir",
                "/s",
                "policy",
                "--rules",
                "/r",
                "check",
                "--tool",
                "push",
                "--store",
                "sqlite:",
            ],
        ];
        for args in cases {
            let fast = parse(&os(args), no_env);
            assert_eq!(fast, by_clap(args).map(Fast::Check), "{args:?}");
            assert!(fast.is_some(), "{args:?}");
        }
        assert_eq!(parse(&os(&["--version"]), no_env), Some(Fast::Version));
        assert_eq!(parse(&os(&["-V"]), no_env), Some(Fast::Version));
    }

    #[test]
    fn the_version_said_is_clap_s() {
        use clap::CommandFactory;
        assert_eq!(
            crate::Cli::command().render_version().to_string(),
            format!("nightshift {}\n", env!("CARGO_PKG_VERSION"))
        );
    }

    #[test]
    fn what_clap_must_judge_goes_to_clap() {
        let cases: &[&[&str]] = &[
            &["policy", "check"],
            &["policy", "check", "--tool=Bash"],
            &["policy", "check", "--tool", "Bash", "--help"],
            &["policy", "check", "--tool", "Bash", "--tool", "Bash"],
            &["policy", "check", "--tool", ""],
            &["policy", "check", "--tool", "--actor"],
            &["policy", "explain", "--tool", "Bash"],
            &["--version", "policy"],
            &["policy", "--actor", "a", "check", "--tool", "Bash"],
        ];
        for args in cases {
            assert_eq!(parse(&os(args), no_env), None, "{args:?}");
        }
        let check = ["policy", "check", "--tool", "Bash"];
        // JSON logs, and set but empty variables, take the full path.
        let json = |k: &str| (k == "NIGHTSHIFT_LOG_FORMAT").then(|| OsString::from("json"));
        assert_eq!(parse(&os(&check), json), None);
        let empty = |k: &str| (k == "NIGHTSHIFT_STATE_DIR").then(OsString::new);
        assert_eq!(parse(&os(&check), empty), None);
        // A flag wins over its variable, as with clap.
        let state = |k: &str| (k == "NIGHTSHIFT_STATE_DIR").then(|| OsString::from("/env"));
        let Some(Fast::Check(c)) = parse(&os(&check), state) else {
            panic!("not taken");
        };
        assert_eq!(c.state_dir, Some(PathBuf::from("/env")));
        let flagged = ["--state-dir", "/flag", "policy", "check", "--tool", "Bash"];
        let Some(Fast::Check(c)) = parse(&os(&flagged), state) else {
            panic!("not taken");
        };
        assert_eq!(c.state_dir, Some(PathBuf::from("/flag")));
    }

    fn token() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("policy".to_string()),
            Just("check".to_string()),
            Just("explain".to_string()),
            Just("--actor".to_string()),
            Just("--tool".to_string()),
            Just("--args-json".to_string()),
            Just("--rules".to_string()),
            Just("--state-dir".to_string()),
            Just("--config".to_string()),
            Just("--store".to_string()),
            Just("--store-file".to_string()),
            Just("--json".to_string()),
            Just("--help".to_string()),
            Just("--version".to_string()),
            Just("-V".to_string()),
            Just("-".to_string()),
            Just("--".to_string()),
            Just(String::new()),
            Just("--tool=Bash".to_string()),
            "[a-z/.:-]{1,6}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// Whatever the fast parse takes, clap takes the same way, under
        /// this process's environment (which clap reads too). Half the
        /// lines are built around `policy ... check ...` so that many are
        /// taken.
        #[test]
        fn the_fast_parse_agrees_with_clap_on_generated_command_lines(
            shaped in any::<bool>(),
            pre in prop::collection::vec(token(), 0..3),
            mid in prop::collection::vec(token(), 0..3),
            post in prop::collection::vec(token(), 0..8),
        ) {
            let mut args: Vec<&str> = pre.iter().map(String::as_str).collect();
            if shaped {
                args.push("policy");
            }
            args.extend(mid.iter().map(String::as_str));
            if shaped {
                args.push("check");
            }
            args.extend(post.iter().map(String::as_str));
            match parse(&os(&args), |k| std::env::var_os(k)) {
                Some(Fast::Check(fast)) => prop_assert_eq!(Some(fast), by_clap(&args)),
                Some(Fast::Version) => prop_assert!(matches!(
                    crate::Cli::try_parse_from(std::iter::once("nightshift").chain(args.iter().copied())),
                    Err(e) if e.kind() == clap::error::ErrorKind::DisplayVersion
                )),
                None => {}
            }
        }
    }
}
