//! Which tree entries may ever be written into a checkout: git's own rules
//! (`fsck_tree` and `verify_path`), as pure functions over bytes.
//!
//! Invariants of a tree [`parse_tree`] accepts:
//! - every entry name is a single path component git would check out: not
//!   empty, not `.` or `..`, no `/` and no NUL, and not `.git` in any case nor
//!   any alias of it that NTFS (`.git` followed by spaces or dots, `git~1`,
//!   `.git:stream`, also after a backslash) or HFS+ (`.git` with ignorable code
//!   points U+200C..U+200F, U+202A..U+202E, U+206A..U+206F, U+FEFF inside)
//!   resolves to `.git`;
//! - every mode is one git writes: 040000, 100644, 100755, 120000, 160000
//!   (git's old 100664 is read as 100644, as git does);
//! - no name appears twice (a symlink `a` and a tree `a` cannot both exist,
//!   so no entry can be written through a symlink of the same tree), and the
//!   entries are in git's order.
//!
//! The same name check ([`check_name`]) decides which working files the
//! observed state may record.

use std::collections::HashSet;

use git2::Oid;

/// What an entry is, from its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
    Tree,
    File {
        executable: bool,
    },
    Symlink,
    /// A submodule: a commit of another repository, never followed.
    Gitlink,
}

impl EntryKind {
    /// The mode git records for this kind.
    pub(crate) fn mode(self) -> u32 {
        match self {
            EntryKind::Tree => 0o040000,
            EntryKind::File { executable: false } => 0o100644,
            EntryKind::File { executable: true } => 0o100755,
            EntryKind::Symlink => 0o120000,
            EntryKind::Gitlink => 0o160000,
        }
    }
}

/// One entry of a checked tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry<'a> {
    pub(crate) kind: EntryKind,
    pub(crate) name: &'a [u8],
    pub(crate) id: Oid,
}

/// Why a raw tree was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TreeProblem {
    /// The bytes are not a tree at all.
    Malformed(&'static str),
    /// An entry git would refuse; `name` is the raw entry name.
    Entry { name: Vec<u8>, why: &'static str },
}

/// Checks one entry name; `Err` says why git refuses it.
pub fn check_name(name: &[u8]) -> Result<(), &'static str> {
    match name {
        b"" => return Err("empty name"),
        b"." => return Err("the name `.`"),
        b".." => return Err("the name `..`"),
        _ => {}
    }
    if name.contains(&b'/') {
        return Err("the name contains `/`");
    }
    if name.contains(&0) {
        return Err("the name contains NUL");
    }
    if name.eq_ignore_ascii_case(b".git") {
        return Err("the name `.git`");
    }
    if is_hfs_dotgit(name) {
        return Err("a name HFS+ reads as `.git`");
    }
    // Git checks every backslash-separated part too: NTFS treats `\` as a separator.
    if std::iter::once(name)
        .chain(
            name.iter()
                .enumerate()
                .filter(|(_, &b)| b == b'\\')
                .map(|(i, _)| &name[i + 1..]),
        )
        .any(is_ntfs_dotgit)
    {
        return Err("a name NTFS reads as `.git`");
    }
    Ok(())
}

/// `.git`, case-insensitively, followed only by spaces and dots up to the end
/// or a separator (`\`, `/`, `:`); or `git~1` likewise (git's `is_ntfs_dotgit`).
fn is_ntfs_dotgit(name: &[u8]) -> bool {
    let rest = if name.len() >= 4 && name[..4].eq_ignore_ascii_case(b".git") {
        &name[4..]
    } else if name.len() >= 5 && name[..3].eq_ignore_ascii_case(b"git") && &name[3..5] == b"~1" {
        &name[5..]
    } else {
        return false;
    };
    for &c in rest {
        match c {
            b'\\' | b'/' | b':' => return true,
            b'.' | b' ' => {}
            _ => return false,
        }
    }
    true
}

/// Code points HFS+ ignores when comparing names (git's `next_hfs_char`).
fn hfs_ignorable(c: char) -> bool {
    matches!(c as u32, 0x200c..=0x200f | 0x202a..=0x202e | 0x206a..=0x206f | 0xfeff)
}

/// `.git` once the HFS+-ignorable code points are dropped, case-insensitively
/// (git's `is_hfs_dotgit`). A name that is not UTF-8 is never `.git` here, as
/// in git.
fn is_hfs_dotgit(name: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(name) else {
        return false;
    };
    let mut chars = text.chars().filter(|&c| !hfs_ignorable(c));
    for want in ['.', 'g', 'i', 't'] {
        match chars.next() {
            Some(c) if c.to_ascii_lowercase() == want => {}
            _ => return false,
        }
    }
    chars.next().is_none()
}

/// Reads a mode's octal text into an entry kind.
fn parse_mode(text: &[u8]) -> Result<EntryKind, &'static str> {
    if text.is_empty() || text.len() > 7 || !text.iter().all(|b| (b'0'..=b'7').contains(b)) {
        return Err("the mode is not octal");
    }
    let mode = text
        .iter()
        .fold(0u32, |acc, &b| (acc << 3) | u32::from(b - b'0'));
    match mode {
        0o040000 => Ok(EntryKind::Tree),
        0o100644 | 0o100664 => Ok(EntryKind::File { executable: false }),
        0o100755 => Ok(EntryKind::File { executable: true }),
        0o120000 => Ok(EntryKind::Symlink),
        0o160000 => Ok(EntryKind::Gitlink),
        _ => Err("a mode git does not write"),
    }
}

/// Git's tree order: names compared as bytes, a tree's name as if followed by `/`.
fn git_order(a: &[u8], a_tree: bool, b: &[u8], b_tree: bool) -> std::cmp::Ordering {
    let n = a.len().min(b.len());
    match a[..n].cmp(&b[..n]) {
        std::cmp::Ordering::Equal => {}
        other => return other,
    }
    let next = |name: &[u8], tree: bool| match name.get(n) {
        Some(&c) => c,
        None if tree => b'/',
        None => 0,
    };
    next(a, a_tree).cmp(&next(b, b_tree))
}

/// Parses a raw tree and checks every entry (see the module note).
pub(crate) fn parse_tree(mut data: &[u8]) -> Result<Vec<Entry<'_>>, TreeProblem> {
    let mut out: Vec<Entry<'_>> = Vec::new();
    let mut seen: HashSet<&[u8]> = HashSet::new();
    while !data.is_empty() {
        let space = data
            .iter()
            .position(|&b| b == b' ')
            .ok_or(TreeProblem::Malformed("entry without mode"))?;
        let mode_text = &data[..space];
        let rest = &data[space + 1..];
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(TreeProblem::Malformed("entry name not terminated"))?;
        let name = &rest[..nul];
        let after = &rest[nul + 1..];
        if after.len() < 20 {
            return Err(TreeProblem::Malformed("entry id truncated"));
        }
        let id = Oid::from_bytes(&after[..20])
            .map_err(|_| TreeProblem::Malformed("entry id unreadable"))?;
        data = &after[20..];
        let bad = |why| TreeProblem::Entry {
            name: name.to_vec(),
            why,
        };
        let kind = parse_mode(mode_text).map_err(bad)?;
        check_name(name).map_err(bad)?;
        if !seen.insert(name) {
            return Err(bad("the name appears twice in the tree"));
        }
        if let Some(prev) = out.last() {
            let order = git_order(
                prev.name,
                prev.kind == EntryKind::Tree,
                name,
                kind == EntryKind::Tree,
            );
            if order != std::cmp::Ordering::Less {
                return Err(bad("the entries are not in git's order"));
            }
        }
        out.push(Entry { kind, name, id });
    }
    Ok(out)
}

/// One entry of a tree [`check_tree`] accepted, as plain data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedEntry {
    /// The mode git records for it (040000, 100644, 100755, 120000, 160000).
    pub mode: u32,
    pub name: Vec<u8>,
    pub id: Oid,
}

/// Checks a raw tree object's bytes exactly as imports and checkouts do
/// ([`parse_tree`]): its entries, or why the tree is refused, in words
/// (the entry name escaped). Public for the fuzz targets and tools; the
/// crate itself calls [`parse_tree`].
pub fn check_tree(data: &[u8]) -> Result<Vec<CheckedEntry>, String> {
    match parse_tree(data) {
        Ok(entries) => Ok(entries
            .into_iter()
            .map(|e| CheckedEntry {
                mode: e.kind.mode(),
                name: e.name.to_vec(),
                id: e.id,
            })
            .collect()),
        Err(TreeProblem::Malformed(why)) => Err(format!("malformed tree: {why}")),
        Err(TreeProblem::Entry { name, why }) => {
            Err(format!("tree entry `{}`: {why}", escape(&name)))
        }
    }
}

/// A name as it may be shown: printable ASCII kept, every other byte escaped.
pub(crate) fn escape(name: &[u8]) -> String {
    name.escape_ascii().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn raw(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, (mode, name)) in entries.iter().enumerate() {
            out.extend_from_slice(mode.as_bytes());
            out.push(b' ');
            out.extend_from_slice(name);
            out.push(0);
            out.extend_from_slice(&[i as u8 + 1; 20]);
        }
        out
    }

    fn why(entries: &[(&str, &[u8])]) -> Option<&'static str> {
        match parse_tree(&raw(entries)) {
            Ok(_) => None,
            Err(TreeProblem::Entry { why, .. }) => Some(why),
            Err(TreeProblem::Malformed(why)) => Some(why),
        }
    }

    #[test]
    fn refuses_every_name_git_refuses() {
        for name in [
            &b""[..],
            b".",
            b"..",
            b"a/b",
            b"../x",
            b".git",
            b".GIT",
            b".Git",
            b".git ",
            b".git.",
            b".git. . ",
            b"git~1",
            b"GIT~1",
            b"git~1...",
            b".git::$INDEX_ALLOCATION",
            b".git:stream",
            b"x\\.git",
            b"a\\git~1\\b",
            ".g\u{200c}it".as_bytes(),
            "\u{feff}.git".as_bytes(),
            ".GIT\u{206f}".as_bytes(),
            ".\u{202e}g\u{200d}i\u{206a}t".as_bytes(),
            b"a\0b",
        ] {
            assert!(check_name(name).is_err(), "{}", escape(name));
        }
        for name in [
            &b"a"[..],
            b"...",
            b".gitignore",
            b".gitmodules",
            b".git~1",
            b"git~2",
            b"git",
            b".gitx",
            b"x.git",
            b"\xff.git",
            ".g\u{200b}it".as_bytes(),
        ] {
            assert!(check_name(name).is_ok(), "{}", escape(name));
        }
    }

    #[test]
    fn check_tree_gives_entries_or_the_refusal_in_words() {
        let entries = check_tree(&raw(&[("100664", b"a"), ("40000", b"d")])).unwrap();
        assert_eq!(
            entries
                .iter()
                .map(|e| (e.mode, e.name.as_slice()))
                .collect::<Vec<_>>(),
            [(0o100644, &b"a"[..]), (0o040000, &b"d"[..])]
        );
        assert_eq!(
            check_tree(&raw(&[("100644", b"x\x1b/y")])),
            Err("tree entry `x\\x1b/y`: the name contains `/`".to_owned())
        );
        assert_eq!(
            check_tree(b"100644 a"),
            Err("malformed tree: entry name not terminated".to_owned())
        );
    }

    #[test]
    fn refuses_bad_modes_duplicates_and_disorder() {
        assert_eq!(why(&[("100644", b"a"), ("100755", b"b")]), None);
        assert_eq!(why(&[("100664", b"a")]), None);
        let old_mode = raw(&[("100664", b"a")]);
        let entries = parse_tree(&old_mode).unwrap();
        assert_eq!(entries[0].kind.mode(), 0o100644);
        assert_eq!(why(&[("100600", b"a")]), Some("a mode git does not write"));
        assert_eq!(why(&[("104755", b"a")]), Some("a mode git does not write"));
        assert_eq!(why(&[("12000x", b"a")]), Some("the mode is not octal"));
        assert_eq!(
            why(&[("120000", b"a"), ("40000", b"a")]),
            Some("the name appears twice in the tree")
        );
        assert_eq!(
            why(&[("100644", b"b"), ("100644", b"a")]),
            Some("the entries are not in git's order")
        );
        // `a.b` sorts before the tree `a` (read as `a/`), after the file `a`.
        assert_eq!(why(&[("100644", b"a"), ("100644", b"a.b")]), None);
        assert_eq!(why(&[("100644", b"a.b"), ("40000", b"a")]), None);
        assert_eq!(
            why(&[("40000", b"a"), ("100644", b"a.b")]),
            Some("the entries are not in git's order")
        );
        assert!(matches!(
            parse_tree(b"100644 a\0short"),
            Err(TreeProblem::Malformed(_))
        ));
    }

    /// Any casing of `.git`, with ignorable code points sprinkled in.
    fn hfs_dotgit() -> impl Strategy<Value = String> {
        let ignorable = prop::sample::select(vec![
            '\u{200c}', '\u{200d}', '\u{200e}', '\u{200f}', '\u{202a}', '\u{202e}', '\u{206a}',
            '\u{206f}', '\u{feff}',
        ]);
        (
            prop::collection::vec(prop::collection::vec(ignorable, 0..3), 5),
            prop::collection::vec(any::<bool>(), 3),
        )
            .prop_map(|(fill, upper)| {
                let mut s = String::new();
                for (i, c) in ['.', 'g', 'i', 't'].into_iter().enumerate() {
                    s.extend(&fill[i]);
                    s.push(if i > 0 && upper[i - 1] {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    });
                }
                s.extend(&fill[4]);
                s
            })
    }

    proptest! {
        #[test]
        fn hfs_aliases_of_dotgit_are_refused(name in hfs_dotgit()) {
            prop_assert!(check_name(name.as_bytes()).is_err());
        }

        #[test]
        fn ntfs_aliases_of_dotgit_are_refused(
            base in prop::sample::select(vec![".git", ".GIT", ".gIt", "git~1", "GiT~1"]),
            tail in "[ .]{0,6}",
            stream in prop::option::of(":[a-zA-Z$_:]{0,12}"),
            prefix in prop::option::of("[a-z]{1,5}\\\\"),
        ) {
            let name = format!(
                "{}{base}{tail}{}",
                prefix.unwrap_or_default(),
                stream.unwrap_or_default()
            );
            prop_assert!(check_name(name.as_bytes()).is_err(), "{}", name);
        }

        #[test]
        fn a_slash_or_nul_anywhere_is_refused(
            name in prop::collection::vec(any::<u8>(), 0..20),
            at in any::<prop::sample::Index>(),
            bad in prop::sample::select(vec![b'/', 0u8]),
        ) {
            let mut name = name;
            let at = at.index(name.len() + 1);
            name.insert(at, bad);
            prop_assert!(check_name(&name).is_err());
        }

        /// A name accepted is never a path git refuses, whatever its bytes.
        #[test]
        fn accepted_names_are_single_safe_components(
            name in prop::collection::vec(any::<u8>(), 0..12),
        ) {
            if check_name(&name).is_ok() {
                prop_assert!(!name.is_empty() && name != b"." && name != b"..");
                prop_assert!(!name.contains(&b'/') && !name.contains(&0));
                let hfs: String = String::from_utf8_lossy(&name)
                    .chars()
                    .filter(|&c| !hfs_ignorable(c))
                    .collect::<String>()
                    .to_ascii_lowercase();
                prop_assert!(hfs != ".git", "{}", escape(&name));
                let lower = name.to_ascii_lowercase();
                let trimmed: &[u8] = {
                    let mut end = lower.len();
                    while end > 0 && matches!(lower[end - 1], b' ' | b'.') {
                        end -= 1;
                    }
                    &lower[..end]
                };
                prop_assert!(trimmed != b".git" && trimmed != b"git~1", "{}", escape(&name));
            }
        }

        /// Trees libgit2 writes from valid names pass, in libgit2's order;
        /// the same tree with one name repeated is refused.
        #[test]
        fn libgit2_trees_pass_and_duplicates_do_not(
            names in prop::collection::btree_map("[a-c.\\-]{1,4}", any::<u8>(), 1..12),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let repo = git2::Repository::init_bare(dir.path()).unwrap();
            let mut builder = repo.treebuilder(None).unwrap();
            let blob = repo.blob(b"x").unwrap();
            let sub = repo.treebuilder(None).unwrap();
            let mut sub = sub;
            sub.insert("f", blob, 0o100644).unwrap();
            let sub = sub.write().unwrap();
            let mut kept = 0;
            for (name, pick) in &names {
                if check_name(name.as_bytes()).is_err() {
                    continue;
                }
                let (id, mode) = match pick % 4 {
                    0 => (sub, 0o040000),
                    1 => (blob, 0o100755),
                    2 => (blob, 0o120000),
                    _ => (blob, 0o100644),
                };
                builder.insert(name, id, mode).unwrap();
                kept += 1;
            }
            let tree = builder.write().unwrap();
            let odb = repo.odb().unwrap();
            let object = odb.read(tree).unwrap();
            let data = object.data().to_vec();
            let entries = parse_tree(&data).unwrap();
            prop_assert_eq!(entries.len(), kept);
            if let Some(first) = entries.first() {
                let mut doubled = data.clone();
                let mut again = format!("{:o} ", first.kind.mode()).into_bytes();
                again.extend_from_slice(first.name);
                again.push(0);
                again.extend_from_slice(first.id.as_bytes());
                doubled.extend_from_slice(&again);
                prop_assert!(parse_tree(&doubled).is_err());
            }
        }
    }
}
