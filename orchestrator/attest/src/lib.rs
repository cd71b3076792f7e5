//! placeholder: filled in by its first change.
