//! The tree-name checker (`orchestrator/git/src/tree_names.rs`): which raw
//! trees may enter the host from a run and be checked out.
//!
//! The input is a raw tree object's bytes. Checked, beyond "no panic":
//! every accepted entry's name passes the name check alone and is a single
//! component that is not `.git` in any case; names are unique and in git's
//! order; and libgit2, handed the same bytes as a tree, reads the same
//! entries (names, modes, ids): the checker never accepts a tree git reads
//! differently.
#![no_main]

use git2::{ObjectType, Odb, Repository};
use libfuzzer_sys::fuzz_target;
use orchestrator_git::{check_tree, check_tree_entry_name};

fuzz_target!(|data: &[u8]| {
    // Each name alone: the checker of working files' names.
    for name in data.split(|b| *b == b'\n') {
        if check_tree_entry_name(name).is_ok() {
            assert!(!name.is_empty() && name != b"." && name != b"..");
            assert!(!name.contains(&b'/') && !name.contains(&0));
            assert!(!name.eq_ignore_ascii_case(b".git"));
        }
    }
    let Ok(entries) = check_tree(data) else {
        return;
    };
    for (i, e) in entries.iter().enumerate() {
        assert!(check_tree_entry_name(&e.name).is_ok());
        for later in &entries[i + 1..] {
            assert_ne!(e.name, later.name);
        }
    }
    // A repository in memory (libgit2's mempack), fresh for each input.
    let odb = Odb::new().expect("odb");
    odb.add_new_mempack_backend(1).expect("mempack");
    let repo = Repository::from_odb(odb).expect("repository");
    let id = repo
        .odb()
        .unwrap()
        .write(ObjectType::Tree, data)
        .expect("writing the tree");
    let tree = repo
        .find_tree(id)
        .expect("libgit2 reads a tree the checker accepted");
    assert_eq!(tree.len(), entries.len(), "entry count");
    for (ours, theirs) in entries.iter().zip(tree.iter()) {
        assert_eq!(ours.name.as_slice(), theirs.name_bytes());
        assert_eq!(ours.id, theirs.id());
        // libgit2 reads git's old 100664 as 100644, as the checker does.
        let mode = theirs.filemode() as u32;
        assert_eq!(ours.mode, mode, "mode of {:?}", theirs.name_bytes());
    }
});
