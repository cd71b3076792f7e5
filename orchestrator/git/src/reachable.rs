//! The worktree's object store: exactly the objects reachable from the base
//! commit, written as packs of our own.
//!
//! Invariants:
//! - the objects written are the base commit, its ancestors (stopping at the
//!   host's shallow boundary), their trees and blobs, and nothing else: no
//!   other branch, tag, stash, reflog entry or unreachable object of the host
//!   ever reaches a worktree (submodule commits are not followed: they belong
//!   to other repositories);
//! - the history (commits, trees, older blobs) is packed from exactly its
//!   listed ids by the host's own `git pack-objects` ([`write_pack_reusing`]:
//!   no `--revs`, so nothing is added; no delta search, `--window=0`; run on
//!   the new repository with the host's objects as an alternate for that
//!   process only, so nothing is written in the host's repository and
//!   nothing in the new one names it), which copies the host's compressed
//!   objects and its deltas as they are where the delta's base is in the
//!   list, and stores the rest whole: on
//!   rust-lang/cargo (233k objects) 449 MB and two minutes became about the
//!   host's own pack size and seconds (docs/benchmarks.md). Where `git` cannot
//!   be run, every object is read through the host's object database (which
//!   follows the host's own alternates) and written whole, undeltified, at
//!   zlib's fastest level by [`write_pack_of`]
//!   (`tests::the_history_pack_holds_exactly_the_listed_objects`); the base
//!   tree's blobs are packed by the checkout's writers as they read them
//!   ([`crate::checkout`]);
//! - each pack and its version-2 index are written by us under a temporary
//!   name (`tmp-<tag>.pack`) and renamed to `pack-<checksum>` once complete,
//!   so what a reader finds under a pack's name is whole;
//! - packs are new files in the new worktree: nothing is shared with the
//!   host's object store.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use flate2::{Compress, Compression, FlushCompress, Status};
use git2::{ObjectType, Odb, Oid, Repository};
use sha1::{Digest, Sha1};

use crate::GitError;

/// One object written to a pack.
struct Packed {
    id: Oid,
    offset: u64,
    crc: u32,
}

/// The objects reachable from a base commit, in two parts.
#[derive(Debug, Default)]
pub(crate) struct Reachable {
    /// The blobs of the base commit's tree: the checkout packs them as it
    /// reads them (see [`crate::checkout`]), so each is read once.
    pub(crate) base_blobs: HashSet<Oid>,
    /// Everything else: commits, trees, and the blobs only older commits hold.
    pub(crate) rest: Vec<Oid>,
}

/// Lists the objects reachable from `base` in `host`. `shallow` holds the
/// host's shallow commits, whose parents it lacks.
pub(crate) fn reachable_objects(
    host: &Repository,
    base: Oid,
    shallow: &HashSet<Oid>,
) -> Result<Reachable, GitError> {
    let mut seen: HashSet<Oid> = HashSet::new();
    let mut out = Reachable::default();
    let base_tree = host
        .find_commit(base)
        .map_err(|e| GitError::git(format!("reading base commit {base}"), e))?
        .tree_id();
    // The base tree first, so that its blobs are told apart.
    let mut base_blobs = Vec::new();
    walk_trees(
        host,
        vec![base_tree],
        &mut seen,
        &mut out.rest,
        &mut base_blobs,
    )?;
    out.base_blobs = base_blobs.into_iter().collect();

    let mut commits = vec![base];
    let mut trees = Vec::new();
    seen.insert(base);
    while let Some(id) = commits.pop() {
        let commit = host
            .find_commit(id)
            .map_err(|e| GitError::git(format!("reading commit {id} of the base's history"), e))?;
        out.rest.push(id);
        let tree = commit.tree_id();
        if !seen.contains(&tree) {
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
    let mut older_blobs = Vec::new();
    walk_trees(host, trees, &mut seen, &mut out.rest, &mut older_blobs)?;
    out.rest.extend(older_blobs);
    Ok(out)
}

/// Lists the trees (into `trees_out`) and blobs (into `blobs_out`) under
/// `start` that are not in `seen`, marking them seen. Trees are read raw and
/// only their modes and ids are looked at: a tree git would refuse to check
/// out is still copied here, and refused by the checkout with its reason.
pub(crate) fn walk_trees(
    host: &Repository,
    start: Vec<Oid>,
    seen: &mut HashSet<Oid>,
    trees_out: &mut Vec<Oid>,
    blobs_out: &mut Vec<Oid>,
) -> Result<(), GitError> {
    let odb = host
        .odb()
        .map_err(|e| GitError::git("opening the host object database", e))?;
    let mut stack: Vec<Oid> = start.into_iter().filter(|t| seen.insert(*t)).collect();
    while let Some(id) = stack.pop() {
        let object = odb
            .read(id)
            .map_err(|e| GitError::git(format!("reading tree {id} of the base's history"), e))?;
        if object.kind() != ObjectType::Tree {
            return Err(GitError::MalformedObject {
                id: id.to_string(),
                kind: "tree",
                why: "it is referenced as a tree but is another kind",
            });
        }
        trees_out.push(id);
        let mut data = object.data();
        while !data.is_empty() {
            let bad = |why| GitError::MalformedObject {
                id: id.to_string(),
                kind: "tree",
                why,
            };
            let nul = data
                .iter()
                .position(|&b| b == 0)
                .ok_or_else(|| bad("entry name not terminated"))?;
            let head = &data[..nul];
            let rest = &data[nul + 1..];
            if rest.len() < 20 {
                return Err(bad("entry id truncated"));
            }
            let child = Oid::from_bytes(&rest[..20]).map_err(|_| bad("entry id unreadable"))?;
            data = &rest[20..];
            let mode_text = head.split(|&b| b == b' ').next().unwrap_or_default();
            let mode = std::str::from_utf8(mode_text)
                .ok()
                .and_then(|m| u32::from_str_radix(m, 8).ok())
                .ok_or_else(|| bad("the mode is not octal"))?;
            match mode & 0o170000 {
                0o040000 if seen.insert(child) => stack.push(child),
                // Gitlinks name commits of other repositories.
                0o040000 | 0o160000 => {}
                _ if seen.insert(child) => blobs_out.push(child),
                _ => {}
            }
        }
    }
    Ok(())
}

/// Opens the (trusted) host's object store `objects` on its own: libgit2
/// serialises pack access within one object database, so each thread opens
/// its own. The host's alternates are followed, as git does.
pub(crate) fn open_host_objects(objects: &Path) -> Result<Odb<'static>, GitError> {
    let odb = Odb::new().map_err(|e| GitError::git("opening the host objects", e))?;
    let objects_str = objects.to_str().ok_or_else(|| GitError::BadDestination {
        path: objects.to_owned(),
        why: "the host's object path is not UTF-8, which libgit2 needs",
    })?;
    odb.add_disk_alternate(objects_str)
        .map_err(|e| GitError::git("opening the host objects", e))?;
    Ok(odb)
}

/// Packs exactly `ids` from the host repository whose common directory is
/// `host_git_dir` into the new repository `dest_git_dir` with `git
/// pack-objects` run on the new repository, the host's object directory
/// given as an alternate for this one process only (nothing in the new
/// repository names the host; nothing is written in the host's): it copies
/// the host's compressed objects and deltas as they are where the delta's
/// base is in the list, writes its temporary files in the new repository's
/// `objects/pack` and renames them whole. `Ok(false)` when `git` could not
/// do it (not installed, it failed, or the host's path cannot be given as an
/// alternate), and the caller writes the pack itself ([`write_pack_of`]); a
/// failure leaves at most a `tmp_*` file there, which no reader takes for a
/// pack.
pub(crate) fn write_pack_reusing(
    host_git_dir: &Path,
    ids: &[Oid],
    dest_git_dir: &Path,
) -> Result<bool, GitError> {
    use std::process::{Command, Stdio};
    if ids.is_empty() {
        return Ok(true);
    }
    let host_objects = host_git_dir.join("objects");
    // The alternates variable is a list separated by `:`.
    let Some(alternate) = host_objects.to_str().filter(|p| !p.contains(':')) else {
        return Ok(false);
    };
    let dest_objects = dest_git_dir.join("objects");
    let Ok(mut pack) = Command::new("git")
        .args([
            "pack-objects",
            "-q",
            "--delta-base-offset",
            "--window=0",
            "--reuse-delta",
            "--reuse-object",
        ])
        .arg(dest_objects.join("pack/pack"))
        // Only what this command line says: no system configuration; the new
        // repository, its objects, and the host's as an alternate.
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_DIR", dest_git_dir)
        .env("GIT_OBJECT_DIRECTORY", &dest_objects)
        .env("GIT_ALTERNATE_OBJECT_DIRECTORIES", alternate)
        .env_remove("GIT_WORK_TREE")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return Ok(false);
    };
    // pack-objects reads every id before it writes a byte.
    let fed = {
        let mut stdin = std::io::BufWriter::new(pack.stdin.take().expect("piped stdin"));
        ids.iter()
            .try_for_each(|id| writeln!(stdin, "{id}"))
            .and_then(|()| stdin.flush())
    };
    let packed = pack
        .wait()
        .map_err(|e| GitError::io("waiting for git pack-objects in", dest_git_dir, e))?;
    Ok(fed.is_ok() && packed.success())
}

/// Writes `ids`, read from the host's object database `host` (whose cache
/// still holds the trees and commits [`reachable_objects`] just read), as one
/// pack in `pack_dir`.
pub(crate) fn write_pack_of(
    host: &Odb<'_>,
    ids: &[Oid],
    pack_dir: &Path,
    tag: &str,
) -> Result<(), GitError> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut pack = PackWriter::create(pack_dir, tag, ids.len())?;
    for &id in ids {
        let object = host
            .read(id)
            .map_err(|e| GitError::git(format!("reading object {id} of the host"), e))?;
        pack.add(id, object.kind(), object.data())?;
    }
    pack.finish()
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

/// One pack being written: a known number of whole objects, then the index.
pub(crate) struct PackWriter {
    dir: PathBuf,
    tmp: PathBuf,
    out: Hashing<BufWriter<File>>,
    z: Compress,
    header: Vec<u8>,
    deflated: Vec<u8>,
    packed: Vec<Packed>,
    count: usize,
}

impl PackWriter {
    /// Starts `tmp-<tag>.pack` in `dir`, to hold exactly `count` objects.
    pub(crate) fn create(dir: &Path, tag: &str, count: usize) -> Result<Self, GitError> {
        let tmp = dir.join(format!("tmp-{tag}.pack"));
        let file =
            File::create_new(&tmp).map_err(|e| GitError::io("creating pack file", &tmp, e))?;
        let mut out = Hashing {
            inner: BufWriter::with_capacity(1 << 20, file),
            hash: Sha1::new(),
            written: 0,
        };
        let n = u32::try_from(count).map_err(|_| GitError::BadDestination {
            path: tmp.clone(),
            why: "more objects than one pack holds",
        })?;
        let mut head = b"PACK\0\0\0\x02".to_vec();
        head.extend_from_slice(&n.to_be_bytes());
        out.put(&head)
            .map_err(|e| GitError::io("writing pack file", &tmp, e))?;
        Ok(PackWriter {
            dir: dir.to_owned(),
            tmp,
            out,
            z: Compress::new(Compression::fast(), true),
            header: Vec::with_capacity(16),
            deflated: Vec::new(),
            packed: Vec::with_capacity(count),
            count,
        })
    }

    /// Appends one object, whole. `id` must be the object's id.
    pub(crate) fn add(&mut self, id: Oid, kind: ObjectType, data: &[u8]) -> Result<(), GitError> {
        if self.packed.len() >= self.count {
            return Err(GitError::BadDestination {
                path: self.tmp.clone(),
                why: "more objects than the pack was started for",
            });
        }
        entry_header(kind_code(kind), data.len() as u64, &mut self.header);
        deflate(&mut self.z, data, &mut self.deflated).map_err(|e| {
            GitError::io(
                "compressing an object for",
                &self.tmp,
                std::io::Error::other(e),
            )
        })?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&self.header);
        crc.update(&self.deflated);
        self.packed.push(Packed {
            id,
            offset: self.out.written,
            crc: crc.finalize(),
        });
        let tmp = &self.tmp;
        self.out
            .put(&self.header)
            .and_then(|()| self.out.put(&self.deflated))
            .map_err(|e| GitError::io("writing pack file", tmp, e))
    }

    /// Ends the pack, writes its index and gives both their final names.
    pub(crate) fn finish(self) -> Result<(), GitError> {
        let PackWriter {
            dir,
            tmp,
            mut out,
            mut packed,
            count,
            ..
        } = self;
        if packed.len() != count {
            return Err(GitError::BadDestination {
                path: tmp,
                why: "fewer objects than the pack was started for",
            });
        }
        let checksum: [u8; 20] = out.hash.finalize_reset().into();
        out.inner
            .write_all(&checksum)
            .and_then(|()| out.inner.flush())
            .map_err(|e| GitError::io("writing pack file", &tmp, e))?;
        drop(out);
        let name = format!("pack-{}", hex(&checksum));
        let tmp_idx = tmp.with_extension("idx");
        fs::write(&tmp_idx, index_v2(&mut packed, &checksum))
            .map_err(|e| GitError::io("writing pack index", &tmp_idx, e))?;
        let pack = dir.join(format!("{name}.pack"));
        let index = dir.join(format!("{name}.idx"));
        fs::rename(&tmp, &pack).map_err(|e| GitError::io("naming pack file", &pack, e))?;
        fs::rename(&tmp_idx, &index).map_err(|e| GitError::io("naming pack index", &index, e))
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

/// Objects smaller than this are stored in their zlib stream uncompressed:
/// a deflate stream's fixed cost (resetting the compressor) is many times
/// that of copying a small object, and small objects shrink little.
const STORE_BELOW: usize = 4096;

/// The zlib stream of `data` into `out` (cleared first): stored blocks for a
/// small object, zlib's fastest level otherwise.
fn deflate(z: &mut Compress, data: &[u8], out: &mut Vec<u8>) -> Result<(), flate2::CompressError> {
    out.clear();
    if data.len() < STORE_BELOW {
        zlib_stored(data, out);
        return Ok(());
    }
    z.reset();
    out.reserve(data.len() + data.len() / 64 + 64);
    loop {
        let consumed = z.total_in() as usize;
        match z.compress_vec(&data[consumed..], out, FlushCompress::Finish)? {
            Status::StreamEnd => return Ok(()),
            _ => out.reserve(out.capacity().max(1024)),
        }
    }
}

/// A zlib stream (RFC 1950) of stored deflate blocks (RFC 1951, 3.2.4).
fn zlib_stored(data: &[u8], out: &mut Vec<u8>) {
    out.reserve(data.len() + 5 * (data.len() / 0xffff + 1) + 6);
    out.extend_from_slice(&[0x78, 0x01]);
    let mut blocks = data.chunks(0xffff).peekable();
    if blocks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(block) = blocks.next() {
        out.push(u8::from(blocks.peek().is_none()));
        let len = block.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    out.extend_from_slice(&adler32(data).to_be_bytes());
}

/// Adler-32 (RFC 1950, 8.2), summing up to 5552 bytes between reductions.
fn adler32(data: &[u8]) -> u32 {
    const MOD: u32 = 65521;
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &byte in chunk {
            a += u32::from(byte);
            b += a;
        }
        a %= MOD;
        b %= MOD;
    }
    (b << 16) | a
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

    /// zlib's own decoder (which checks the Adler-32) reads back every
    /// stream, stored or deflated, across block boundaries.
    #[test]
    fn zlib_streams_round_trip() {
        let mut z = Compress::new(Compression::fast(), true);
        let mut out = Vec::new();
        for len in [
            0usize,
            1,
            300,
            STORE_BELOW - 1,
            STORE_BELOW,
            0xffff,
            0x10000,
            200_000,
        ] {
            let data: Vec<u8> = (0..len as u32).map(|i| (i * 7 % 251) as u8).collect();
            for _ in 0..2 {
                deflate(&mut z, &data, &mut out).unwrap();
                let mut back = Vec::new();
                std::io::Read::read_to_end(
                    &mut flate2::read::ZlibDecoder::new(&out[..]),
                    &mut back,
                )
                .unwrap();
                assert_eq!(back, data, "length {len}");
            }
            let mut stored = Vec::new();
            zlib_stored(&data, &mut stored);
            let mut back = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::ZlibDecoder::new(&stored[..]), &mut back)
                .unwrap();
            assert_eq!(back, data, "stored, length {len}");
        }
    }

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@localhost",
                "-c",
                "gc.auto=0",
            ])
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The ids in the packs of `dir`, by `git verify-pack` (which also
    /// checks each pack against its index).
    fn packed_ids(dir: &Path) -> HashSet<String> {
        let mut ids = HashSet::new();
        for e in fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "idx") {
                let out = std::process::Command::new("git")
                    .args(["verify-pack", "-v"])
                    .arg(&p)
                    .output()
                    .unwrap();
                assert!(out.status.success(), "verify-pack {}: {out:?}", p.display());
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    let id = line.split_whitespace().next().unwrap_or("");
                    if id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
                        ids.insert(id.to_string());
                    }
                }
            }
        }
        ids
    }

    /// A history with deltas in the host's pack and a branch the base does
    /// not reach: the pack `git pack-objects` writes, and the one our own
    /// writer writes when git cannot, hold exactly the listed objects (the
    /// other branch's are absent), and the reusing one is smaller.
    #[test]
    fn the_history_pack_holds_exactly_the_listed_objects() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host");
        fs::create_dir(&host).unwrap();
        git(&host, &["init", "-q", "-b", "main"]);
        let text: String = (0..2000)
            .map(|i| format!("line {i} of a file that changes a little\n"))
            .collect();
        for round in 0..12 {
            fs::write(host.join("big.txt"), format!("{text}round {round}\n")).unwrap();
            git(&host, &["add", "-A"]);
            git(&host, &["commit", "-q", "-m", &format!("round {round}")]);
        }
        // The base's own tree does not hold the file: every version is
        // history (the checkout packs the base tree's blobs apart).
        git(&host, &["rm", "-q", "big.txt"]);
        fs::write(host.join("small.txt"), "small\n").unwrap();
        git(&host, &["add", "-A"]);
        git(&host, &["commit", "-q", "-m", "big.txt removed"]);
        git(&host, &["checkout", "-q", "-b", "secret"]);
        fs::write(host.join("secret.txt"), "only on another branch\n").unwrap();
        git(&host, &["add", "-A"]);
        git(&host, &["commit", "-q", "-m", "secret"]);
        let secret = git(&host, &["rev-parse", "HEAD:secret.txt"]);
        git(&host, &["checkout", "-q", "main"]);
        git(&host, &["gc", "-q", "--aggressive"]);
        let repo = Repository::open(&host).unwrap();
        let base = repo.revparse_single("main").unwrap().id();
        let reachable = reachable_objects(&repo, base, &HashSet::new()).unwrap();
        let want: HashSet<String> = reachable.rest.iter().map(|id| id.to_string()).collect();
        assert!(!want.contains(&secret));

        let host_packs = || -> Vec<std::ffi::OsString> {
            let mut v: Vec<_> = fs::read_dir(host.join(".git/objects/pack"))
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .collect();
            v.sort();
            v
        };
        let before = host_packs();
        let dest = dir.path().join("dest");
        git(
            dir.path(),
            &["init", "-q", "--bare", dest.to_str().unwrap()],
        );
        let reused = dest.join("objects/pack");
        assert!(write_pack_reusing(&host.join(".git"), &reachable.rest, &dest).unwrap());
        assert_eq!(packed_ids(&reused), want);
        // Nothing was written in the host's repository.
        assert_eq!(host_packs(), before);

        let whole = dir.path().join("whole");
        fs::create_dir(&whole).unwrap();
        write_pack_of(&repo.odb().unwrap(), &reachable.rest, &whole, "history").unwrap();
        assert_eq!(packed_ids(&whole), want);

        let size = |d: &Path| -> u64 {
            fs::read_dir(d)
                .unwrap()
                .flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "pack"))
                .map(|e| e.metadata().unwrap().len())
                .sum()
        };
        assert!(
            size(&reused) * 3 < size(&whole),
            "the host's deltas were not reused: {} against {} bytes",
            size(&reused),
            size(&whole)
        );
        // Git cannot (here: the host is not where it is said to be): the
        // caller is told to write the pack itself, and no pack is left.
        let gone = dir.path().join("no-such-repository");
        let empty = dir.path().join("empty");
        git(
            dir.path(),
            &["init", "-q", "--bare", empty.to_str().unwrap()],
        );
        assert!(!write_pack_reusing(&gone, &reachable.rest, &empty).unwrap());
        assert!(packed_ids(&empty.join("objects/pack")).is_empty());
    }
}
