//! Linear-time patterns for match clauses.
//!
//! Invariants: a [`Pattern`] was compiled by the `regex` crate (finite
//! automata, no backtracking), under a nesting limit and size limits, so
//! matching is linear in the input whatever the pattern. Look-around and
//! back-references cannot be expressed; a pattern that tries is refused
//! with an error that names which one, because "unsupported syntax" would
//! not tell the rule's author how to rewrite it (use a second clause with
//! `not_matches`). Matching is a search: anchor with `^`/`$` to match whole.

use std::fmt;

use regex::{Regex, RegexBuilder};
use regex_syntax::ast::{parse::ParserBuilder, ErrorKind};

/// Deepest nesting of groups and repetitions a pattern may have.
pub const NEST_LIMIT: u32 = 32;
/// Upper bound on the compiled program and on the lazy DFA cache, bytes.
pub const SIZE_LIMIT: usize = 1 << 20;
/// Longest pattern text accepted, bytes.
pub const MAX_PATTERN_LEN: usize = 4096;

/// Why a pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// `(?=`, `(?!`, `(?<=`, `(?<!`.
    #[error(
        "look-around is not allowed (pattern {pattern:?}): use a second clause with not_matches"
    )]
    LookAround {
        /// The refused pattern.
        pattern: String,
    },
    /// `\1` and the like.
    #[error("back-references are not allowed (pattern {pattern:?})")]
    BackReference {
        /// The refused pattern.
        pattern: String,
    },
    /// Longer than [`MAX_PATTERN_LEN`].
    #[error("pattern is {len} bytes, over the limit of {MAX_PATTERN_LEN}")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Any other syntax error, nesting over the limit, or a program too big.
    #[error("compiling pattern {pattern:?}: {message}")]
    Invalid {
        /// The refused pattern.
        pattern: String,
        /// What the regex compiler said.
        message: String,
    },
}

/// A compiled, linear-time pattern that remembers its source text.
#[derive(Clone)]
pub struct Pattern {
    source: String,
    regex: Regex,
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Pattern").field(&self.source).finish()
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}
impl Eq for Pattern {}

impl Pattern {
    /// Compiles `source`, refusing look-around and back-references by name.
    pub fn new(source: &str) -> Result<Self, PatternError> {
        if source.len() > MAX_PATTERN_LEN {
            return Err(PatternError::TooLong { len: source.len() });
        }
        // The AST parser knows these constructs well enough to name them;
        // the compiler would only say "unsupported".
        let ast = ParserBuilder::new()
            .nest_limit(NEST_LIMIT)
            .build()
            .parse(source);
        if let Err(e) = ast {
            let pattern = source.to_owned();
            return Err(match e.kind() {
                ErrorKind::UnsupportedLookAround => PatternError::LookAround { pattern },
                ErrorKind::UnsupportedBackreference => PatternError::BackReference { pattern },
                _ => PatternError::Invalid {
                    pattern,
                    message: e.kind().to_string(),
                },
            });
        }
        let regex = RegexBuilder::new(source)
            .nest_limit(NEST_LIMIT)
            .size_limit(SIZE_LIMIT)
            .dfa_size_limit(SIZE_LIMIT)
            .build()
            .map_err(|e| PatternError::Invalid {
                pattern: source.to_owned(),
                message: e.to_string(),
            })?;
        Ok(Self {
            source: source.to_owned(),
            regex,
        })
    }

    /// The text the pattern was written as.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Is there a match anywhere in `text`?
    pub fn is_match(&self, text: &str) -> bool {
        self.regex.is_match(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn look_around_is_named() {
        for p in ["foo(?!bar)", "(?=x)", "(?<=a)b", "(?<!a)b"] {
            assert!(
                matches!(Pattern::new(p), Err(PatternError::LookAround { .. })),
                "{p}"
            );
            let msg = Pattern::new(p).unwrap_err().to_string();
            assert!(msg.contains("look-around is not allowed"), "{msg}");
        }
    }

    #[test]
    fn back_reference_is_named() {
        let e = Pattern::new(r"(a)\1").unwrap_err();
        assert!(matches!(e, PatternError::BackReference { .. }), "{e:?}");
        assert!(e.to_string().contains("back-references are not allowed"));
    }

    #[test]
    fn escaped_parens_are_not_look_around() {
        let p = Pattern::new(r"\(?=").unwrap();
        assert!(p.is_match("(="));
    }

    #[test]
    fn deep_nesting_and_huge_programs_are_refused() {
        let deep = format!("{}a{}", "(".repeat(100), ")".repeat(100));
        assert!(matches!(
            Pattern::new(&deep),
            Err(PatternError::Invalid { .. })
        ));
        assert!(matches!(
            Pattern::new("a{1000}{1000}"),
            Err(PatternError::Invalid { .. })
        ));
        assert!(matches!(
            Pattern::new(&"a".repeat(MAX_PATTERN_LEN + 1)),
            Err(PatternError::TooLong { .. })
        ));
    }

    #[test]
    fn catastrophic_shapes_still_answer() {
        // Backtracking engines take exponential time here; ours is linear.
        let p = Pattern::new("(a*)*b").unwrap();
        let text = "a".repeat(64 * 1024);
        assert!(!p.is_match(&text));
        assert!(p.is_match(&format!("{text}b")));
    }
}
