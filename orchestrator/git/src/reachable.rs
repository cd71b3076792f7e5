//! The worktree's object store: exactly the objects reachable from the base
//! commit, written as packs of our own.
//!
//! Invariants:
//! - the objects written are the base commit, its ancestors (stopping at the
//!   host's shallow boundary), their trees and blobs, and nothing else: no
//!   other branch, tag, stash, reflog entry or unreachable object of the host
//!   ever reaches a worktree (submodule commits are not followed: they belong
//!   to other repositories);
//! - every object is read through the host's object database (which follows
//!   the host's own alternates) and written whole, undeltified, at zlib's
//!   fastest level: no delta search, so the cost is one read and one deflate
//!   per object;
//! - each pack and its version-2 index are written by us under a temporary
//!   name and renamed to `pack-<checksum>` once complete, so a reader never
//!   sees half a pack;
//! - packs are new files in the new worktree: nothing is shared with the
//!   host's object store.
//!
//! Up to four writers share the objects, one pack each.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use flate2::{Compress, Compression, FlushCompress, Status};
use git2::{ObjectType, Odb, Oid, Repository};
use sha1::{Digest, Sha1};

use crate::GitError;

const MAX_WRITERS: usize = 4;

/// One object written to a pack.
struct Packed {
    id: Oid,
    offset: u64,
    crc: u32,
}

/// Lists the objects reachable from `base` in `host`, commits first.
/// `shallow` holds the host's shallow commits, whose parents it lacks.
pub(crate) fn reachable_objects(
    host: &Repository,
    base: Oid,
    shallow: &HashSet<Oid>,
) -> Result<Vec<Oid>, GitError> {
    let mut seen: HashSet<Oid> = HashSet::new();
    let mut out = Vec::new();
    let mut commits = vec![base];
    let mut trees = Vec::new();
    seen.insert(base);
    while let Some(id) = commits.pop() {
        let commit = host
            .find_commit(id)
            .map_err(|e| GitError::git(format!("reading commit {id} of the base's history"), e))?;
        out.push(id);
        let tree = commit.tree_id();
        if seen.insert(tree) {
            trees.push(tree);
        }
        if shallow.contains(&id) {
            continue;
        }
        for parent in commit.parent_ids() {
            if seen.insert(parent) {
                commits.push(parent);
            }
        }
    }
    while let Some(id) = trees.pop() {
        let tree = host
            .find_tree(id)
            .map_err(|e| GitError::git(format!("reading tree {id} of the base's history"), e))?;
        out.push(id);
        for entry in tree.iter() {
            let child = entry.id();
            match entry.kind() {
                Some(ObjectType::Tree) => {
                    if seen.insert(child) {
                        trees.push(child);
                    }
                }
                Some(ObjectType::Blob) => {
                    if seen.insert(child) {
                        out.push(child);
                    }
                }
                // Gitlinks name commits of other repositories.
                _ => {}
            }
        }
    }
    Ok(out)
}

/// Writes `ids`, read from the object store `host_objects`, as packs in
/// `pack_dir`. Returns the pack files written.
pub(crate) fn write_packs(
    host_objects: &Path,
    ids: &[Oid],
    pack_dir: &Path,
) -> Result<Vec<PathBuf>, GitError> {
    let writers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, MAX_WRITERS);
    let chunk = ids.len().div_ceil(writers).max(1);
    let results: Vec<Result<PathBuf, GitError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ids
            .chunks(chunk)
            .enumerate()
            .map(|(n, part)| scope.spawn(move || write_pack(host_objects, part, pack_dir, n)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(GitError::BadDestination {
                        path: pack_dir.to_owned(),
                        why: "a pack writer failed",
                    })
                })
            })
            .collect()
    });
    results.into_iter().collect()
}

/// A writer that hashes and counts what goes through it.
struct Hashing<W: Write> {
    inner: W,
    hash: Sha1,
    written: u64,
}

impl<W: Write> Hashing<W> {
    fn put(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(data)?;
        self.hash.update(data);
        self.written += data.len() as u64;
        Ok(())
    }
}

fn kind_code(kind: ObjectType) -> u8 {
    match kind {
        ObjectType::Commit => 1,
        ObjectType::Tree => 2,
        ObjectType::Blob => 3,
        _ => 4,
    }
}

/// The pack entry header: type and size, 4 then 7 bits a byte, low bits first.
fn entry_header(kind: u8, size: u64, out: &mut Vec<u8>) {
    out.clear();
    let mut byte = (kind << 4) | (size & 0x0f) as u8;
    let mut rest = size >> 4;
    while rest != 0 {
        out.push(byte | 0x80);
        byte = (rest & 0x7f) as u8;
        rest >>= 7;
    }
    out.push(byte);
}

/// Deflates `data` whole into `out` (cleared first).
fn deflate(z: &mut Compress, data: &[u8], out: &mut Vec<u8>) -> Result<(), flate2::CompressError> {
    z.reset();
    out.clear();
    out.reserve(data.len() + data.len() / 64 + 64);
    loop {
        let consumed = z.total_in() as usize;
        match z.compress_vec(&data[consumed..], out, FlushCompress::Finish)? {
            Status::StreamEnd => return Ok(()),
            _ => out.reserve(out.capacity().max(1024)),
        }
    }
}

fn write_pack(
    host_objects: &Path,
    ids: &[Oid],
    pack_dir: &Path,
    n: usize,
) -> Result<PathBuf, GitError> {
    // One object database per writer: libgit2 serialises pack access within one.
    let odb = Odb::new().map_err(|e| GitError::git("opening the host objects", e))?;
    let objects_str = host_objects
        .to_str()
        .ok_or_else(|| GitError::BadDestination {
            path: host_objects.to_owned(),
            why: "the host's object path is not UTF-8, which libgit2 needs",
        })?;
    odb.add_disk_alternate(objects_str)
        .map_err(|e| GitError::git("opening the host objects", e))?;

    let tmp_pack = pack_dir.join(format!("tmp-{n}.pack"));
    let io = |action: &'static str, path: &Path| {
        let path = path.to_owned();
        move |e: std::io::Error| GitError::io(action, path, e)
    };
    let file = File::create_new(&tmp_pack).map_err(io("creating pack file", &tmp_pack))?;
    let mut out = Hashing {
        inner: BufWriter::with_capacity(1 << 20, file),
        hash: Sha1::new(),
        written: 0,
    };
    let count = u32::try_from(ids.len()).map_err(|_| GitError::BadDestination {
        path: tmp_pack.clone(),
        why: "more objects than one pack holds",
    })?;
    let mut head = b"PACK\0\0\0\x02".to_vec();
    head.extend_from_slice(&count.to_be_bytes());
    out.put(&head).map_err(io("writing pack file", &tmp_pack))?;

    let mut z = Compress::new(Compression::fast(), true);
    let mut header = Vec::with_capacity(16);
    let mut deflated = Vec::new();
    let mut packed = Vec::with_capacity(ids.len());
    for &id in ids {
        let object = odb
            .read(id)
            .map_err(|e| GitError::git(format!("reading object {id} of the host"), e))?;
        entry_header(kind_code(object.kind()), object.len() as u64, &mut header);
        deflate(&mut z, object.data(), &mut deflated).map_err(|e| {
            GitError::io(
                "compressing an object for",
                &tmp_pack,
                std::io::Error::other(e),
            )
        })?;
        drop(object);
        let mut crc = crc32fast::Hasher::new();
        crc.update(&header);
        crc.update(&deflated);
        packed.push(Packed {
            id,
            offset: out.written,
            crc: crc.finalize(),
        });
        out.put(&header).map_err(io("writing pack file", &tmp_pack))?;
        out.put(&deflated).map_err(io("writing pack file", &tmp_pack))?;
    }
    let checksum: [u8; 20] = out.hash.finalize_reset().into();
    out.inner
        .write_all(&checksum)
        .and_then(|()| out.inner.flush())
        .map_err(io("writing pack file", &tmp_pack))?;
    drop(out);

    let tmp_idx = pack_dir.join(format!("tmp-{n}.idx"));
    let idx = index_v2(&mut packed, &checksum);
    fs::write(&tmp_idx, idx).map_err(io("writing pack index", &tmp_idx))?;

    let name = format!("pack-{}", hex(&checksum));
    let pack = pack_dir.join(format!("{name}.pack"));
    let index = pack_dir.join(format!("{name}.idx"));
    fs::rename(&tmp_pack, &pack).map_err(io("naming pack file", &pack))?;
    fs::rename(&tmp_idx, &index).map_err(io("naming pack index", &index))?;
    Ok(pack)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A version-2 pack index of `packed` (sorted here by id).
fn index_v2(packed: &mut [Packed], pack_checksum: &[u8; 20]) -> Vec<u8> {
    packed.sort_by(|a, b| a.id.as_bytes().cmp(b.id.as_bytes()));
    let mut idx = Vec::with_capacity(8 + 1024 + packed.len() * 28 + 40);
    idx.extend_from_slice(b"\xfftOc\0\0\0\x02");
    let mut fanout = [0u32; 256];
    for p in packed.iter() {
        fanout[p.id.as_bytes()[0] as usize] += 1;
    }
    let mut total = 0u32;
    for count in fanout {
        total += count;
        idx.extend_from_slice(&total.to_be_bytes());
    }
    for p in packed.iter() {
        idx.extend_from_slice(p.id.as_bytes());
    }
    for p in packed.iter() {
        idx.extend_from_slice(&p.crc.to_be_bytes());
    }
    let mut large = Vec::new();
    for p in packed.iter() {
        let small = if p.offset < 0x8000_0000 {
            p.offset as u32
        } else {
            large.push(p.offset);
            0x8000_0000 | (large.len() as u32 - 1)
        };
        idx.extend_from_slice(&small.to_be_bytes());
    }
    for offset in large {
        idx.extend_from_slice(&offset.to_be_bytes());
    }
    idx.extend_from_slice(pack_checksum);
    let own: [u8; 20] = Sha1::digest(&idx).into();
    idx.extend_from_slice(&own);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_headers_match_git() {
        let mut out = Vec::new();
        entry_header(3, 5, &mut out);
        assert_eq!(out, [0x35]);
        entry_header(1, 16, &mut out);
        assert_eq!(out, [0x90, 0x01]);
        entry_header(2, 300, &mut out);
        // 300 = 0b1_0010_1100: low 4 bits 1100, then 0b10010.
        assert_eq!(out, [0xac, 0x12]);
    }

    #[test]
    fn deflate_round_trips() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut z = Compress::new(Compression::fast(), true);
        let mut out = Vec::new();
        for _ in 0..2 {
            deflate(&mut z, &data, &mut out).unwrap();
            let mut back = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::ZlibDecoder::new(&out[..]), &mut back)
                .unwrap();
            assert_eq!(back, data);
        }
    }
}
