//! The one place this crate touches the filesystem: reading rule files.
//!
//! Invariants: only `*.toml` files directly in the directory are read, in
//! byte order of their names, so the same directory always gives the same
//! rows in the same order (and so the same generation)
//! (`tests/loading.rs::a_directory_gives_its_own_toml_files_in_byte_order_of_their_names`).
//! Any error in any file means no rule set is returned
//! (`tests/loading.rs::an_error_in_any_file_of_a_directory_loads_nothing`).

use std::path::{Path, PathBuf};

use crate::rulefile::{rule_set_from_files, LoadError};
use crate::ruleset::RuleSet;

/// Reads one rule file into a set of its own.
pub fn load_file(file: &Path) -> Result<RuleSet, LoadError> {
    let text = std::fs::read_to_string(file).map_err(|source| LoadError::Read {
        file: file.to_owned(),
        source,
    })?;
    rule_set_from_files([(file, text.as_str())])
}

/// Reads every `*.toml` file in `dir`.
pub fn load_dir(dir: &Path) -> Result<RuleSet, LoadError> {
    let list_err = |source| LoadError::ListDir {
        dir: dir.to_owned(),
        source,
    };
    let mut files: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(list_err)? {
        let path = entry.map_err(list_err)?.path();
        if path.is_file() && path.extension().is_some_and(|e| e == "toml") {
            files.push(path);
        }
    }
    files.sort();
    let mut texts = Vec::with_capacity(files.len());
    for file in &files {
        let text = std::fs::read_to_string(file).map_err(|source| LoadError::Read {
            file: file.clone(),
            source,
        })?;
        texts.push(text);
    }
    rule_set_from_files(
        files
            .iter()
            .map(PathBuf::as_path)
            .zip(texts.iter().map(String::as_str)),
    )
}
