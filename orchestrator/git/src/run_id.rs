//! Run ids as they appear in ref names.
//!
//! Invariant: an id that passes [`validate_run_id`] makes both
//! `refs/heads/nightshift/run/<id>` and `refs/nightshift/runs/<id>` valid,
//! single-component ref names, so an id can never climb out of its namespace or
//! name a directory of refs (`tests::refuses_ids_that_would_escape_or_break_ref_names`).

use crate::GitError;

const MAX_LEN: usize = 128;

/// Checks that `run_id` is usable as the last component of a ref name:
/// 1 to 128 characters of `[A-Za-z0-9._-]`, starting with a letter or digit, with
/// no `..` and not ending in `.` or `.lock`.
pub fn validate_run_id(run_id: &str) -> Result<(), GitError> {
    let bad = |why| {
        Err(GitError::InvalidRunId {
            run_id: run_id.to_owned(),
            why,
        })
    };
    if run_id.is_empty() || run_id.len() > MAX_LEN {
        return bad("must be 1 to 128 characters long");
    }
    if !run_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return bad("only letters, digits, '.', '_' and '-' are allowed");
    }
    if !run_id.as_bytes()[0].is_ascii_alphanumeric() {
        return bad("must start with a letter or a digit");
    }
    if run_id.contains("..") || run_id.ends_with('.') || run_id.ends_with(".lock") {
        return bad("must not contain '..' nor end in '.' or '.lock'");
    }
    if !git2::Reference::is_valid_name(&result_ref(run_id)) {
        return bad("does not make a valid ref name");
    }
    Ok(())
}

/// The branch the run works on inside its worktree: `refs/heads/nightshift/run/<id>`.
pub fn run_branch(run_id: &str) -> String {
    format!("refs/heads/nightshift/run/{run_id}")
}

/// The ref of the host repository that holds the run's result: `refs/nightshift/runs/<id>`.
pub fn result_ref(run_id: &str) -> String {
    format!("refs/nightshift/runs/{run_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_ids() {
        for id in ["01J9ZK3", "run-1", "a.b_c", "X"] {
            assert!(validate_run_id(id).is_ok(), "{id}");
        }
    }

    #[test]
    fn refuses_ids_that_would_escape_or_break_ref_names() {
        let long = "a".repeat(129);
        for id in [
            "", "../x", "a/b", "a..b", ".a", "-a", "a.lock", "a.", "a b", "a~1", "a:b", "a\\b",
            "a*", &long,
        ] {
            assert!(validate_run_id(id).is_err(), "{id:?} should be refused");
        }
    }
}
