//! `*` globs for door names and subjects.
//!
//! Invariants: `*` matches any run of characters (including none); every
//! other character matches itself; there is no escape and no `?`. Matching
//! is linear in the text: the literal pieces between stars are found
//! leftmost-first with `str::find` (two-way search), and leftmost-first is
//! exact for star-only globs, so nothing ever backtracks
//! (`tests::agrees_with_naive`, `tests::examples`).

/// Does `glob` match all of `text`?
pub fn glob_matches(glob: &str, text: &str) -> bool {
    if !is_glob(glob) {
        return glob == text;
    }
    let mut pieces = glob.split('*').peekable();
    // With a star there are at least two pieces: a prefix and a suffix.
    let first = pieces.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    while let Some(piece) = pieces.next() {
        if pieces.peek().is_none() {
            // `rest` excludes everything consumed, so the suffix cannot
            // overlap an earlier piece.
            return rest.ends_with(piece);
        }
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// Does the glob contain a star (is it a pattern rather than a name)?
pub fn is_glob(glob: &str) -> bool {
    glob.contains('*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reference: the obvious exponential recursion, fine for short inputs.
    fn naive(glob: &[u8], text: &[u8]) -> bool {
        match glob.split_first() {
            None => text.is_empty(),
            Some((b'*', g)) => (0..=text.len()).any(|i| naive(g, &text[i..])),
            Some((c, g)) => text.first() == Some(c) && naive(g, &text[1..]),
        }
    }

    #[test]
    fn examples() {
        assert!(glob_matches("github_*", "github_create_pr"));
        assert!(!glob_matches("github_*", "gitlab_create_pr"));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("push", "push"));
        assert!(!glob_matches("push", "pushx"));
        assert!(glob_matches("a*b*c", "aXbYbc"));
        assert!(!glob_matches("a*a", "a"));
    }

    proptest! {
        #[test]
        fn agrees_with_naive(glob in "[ab*]{0,8}", text in "[ab]{0,10}") {
            prop_assert_eq!(glob_matches(&glob, &text), naive(glob.as_bytes(), text.as_bytes()));
        }
    }
}
