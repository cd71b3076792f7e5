//! nightshift's policy engine: rules, decisions, labels and the gate.
//!
//! Invariants: everything here is pure and synchronous. Decisions are
//! functions of the rules, the request and an injected clock; nothing reads
//! the system clock, a database or the network. The only I/O is reading
//! rule files, in [`load`] (`tests::only_load_does_io_and_nothing_reads_the_clock`).
//! The state store, the audit and the CLI are the orchestrator's: it keeps
//! the [`Row`]s, replays them into a [`RuleSet`], and records each
//! [`Decision`] (its generation and request digest, never the request's
//! arguments: `tests/tests/policy_cli.rs::refusals_and_asks_are_audited_by_digest_never_by_arguments`).
//!
//! - [`rule`], [`pattern`], [`glob`]: rules as immutable, checked rows;
//! - [`doors`]: the door schema rule files are checked against;
//! - [`evaluate()`]: the precedence law (refuse > ask > allow);
//! - [`ruleset`]: rows, generations, proposals, ratification, freeze;
//! - [`authority`]: tier 1 (agents tighten on themselves) vs the owner;
//! - [`labels`], [`gate`]: the label lattice and the routing/content gate;
//! - [`hook`]: the fail-closed harness hook;
//! - [`scopes`]: autonomy-scope proposals from the history, and the passage
//!   of an act (refused, asked, carried out under a ratified scope);
//! - [`rulefile`], [`load`]: TOML rule files with file-and-line errors.

pub mod authority;
pub mod canonical;
pub mod doors;
pub mod evaluate;
pub mod gate;
pub mod glob;
pub mod hook;
pub mod labels;
pub mod load;
pub mod pattern;
pub mod request;
pub mod rule;
pub mod rulefile;
pub mod ruleset;
pub mod scopes;
pub mod timestamp;

pub use authority::{
    classify_declaration, classify_retirement, classify_unlock, NeedsOwner, Tier1,
};
pub use evaluate::{evaluate, evaluate_rules, Decider, Decision, Missing, StoodAside, Verdict};
pub use gate::{gate, Destination, Destinations, GateReason, GateVerdict, Readers};
pub use hook::{hook_decide, HookOutcome};
pub use labels::{Confidentiality, Integrity, Label, Labelled};
pub use load::{load_dir, load_file};
pub use request::{Request, RequestDigest};
pub use rule::{ClauseSpec, Effect, Rule, RuleError, RuleId, RuleSpec};
pub use rulefile::LoadError;
pub use ruleset::{ApplyError, Author, Change, Freeze, Generation, Row, RuleSet};
pub use timestamp::Timestamp;

/// The rules shipped with nightshift (`policies/rules/default.toml`).
pub const DEFAULT_RULES: &str = include_str!("../rules/default.toml");

/// The optional rule shipped with nightshift that refuses a harness's
/// recursive `rm` in its common spellings, strings and arrays alike
/// (`policies/rules/optional/no-recursive-delete.toml`; in force only once copied
/// into `STATE/rules/` or declared).
pub const RECURSIVE_DELETE_RULE: &str = include_str!("../rules/optional/no-recursive-delete.toml");

#[cfg(test)]
mod tests {
    /// Reads this crate's sources: no module but `load` names the
    /// filesystem, and none names the network, a process, the environment
    /// or the system clock.
    #[test]
    fn only_load_does_io_and_nothing_reads_the_clock() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut checked = 0;
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let name = path.file_name().unwrap().to_str().unwrap();
            let text = std::fs::read_to_string(&path).unwrap();
            // This module's test reads files; only its code before the tests counts.
            let code = text.split("#[cfg(test)]").next().unwrap();
            checked += 1;
            let mut banned = vec![
                "std::net",
                "std::process",
                "std::env",
                "SystemTime",
                "Instant::now",
                "::now()",
                "File::",
                "OpenOptions",
            ];
            if name != "load.rs" {
                banned.push("std::fs");
                banned.push("read_to_string");
            }
            for word in banned {
                assert!(!code.contains(word), "{name} names {word}");
            }
        }
        assert!(checked >= 15, "only {checked} modules were read");
    }
}
