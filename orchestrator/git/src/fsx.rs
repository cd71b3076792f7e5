//! Reading files of a hostile tree as data.
//!
//! Invariants: a path is opened only after `lstat` said it is a regular file,
//! and then with `O_NOFOLLOW | O_NONBLOCK | O_NOCTTY`, so a symlink is never
//! followed and a FIFO or device swapped in is never waited on; the opened
//! descriptor is checked again with `fstat`; at most `cap + 1` bytes are ever
//! read, whatever size the file claims (`tests::never_opens_a_fifo`,
//! `tests::reads_small_regular_files_and_refuses_the_rest`).

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::fcntl::OFlag;

/// What [`read_capped`] found.
#[derive(Debug)]
pub(crate) enum Capped {
    Data(Vec<u8>),
    Missing,
    NotRegular,
    TooLarge(u64),
}

/// Opens `path` for reading without following a symlink in its last
/// component and without blocking on a FIFO.
pub(crate) fn open_nofollow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY).bits())
        .open(path)
}

/// Reads the regular file at `path` if it holds at most `cap` bytes.
pub(crate) fn read_capped(path: &Path, cap: u64) -> io::Result<Capped> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Capped::Missing),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_file() {
        return Ok(Capped::NotRegular);
    }
    if meta.len() > cap {
        return Ok(Capped::TooLarge(meta.len()));
    }
    let file = match open_nofollow(path) {
        Ok(f) => f,
        // ELOOP: the path became a symlink; treat it as what it is.
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => return Ok(Capped::NotRegular),
        Err(e) => return Err(e),
    };
    read_open_capped(file, cap)
}

/// Reads an already opened file, checking with `fstat` that it is regular and
/// never reading more than `cap + 1` bytes.
pub(crate) fn read_open_capped(file: File, cap: u64) -> io::Result<Capped> {
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Ok(Capped::NotRegular);
    }
    if meta.len() > cap {
        return Ok(Capped::TooLarge(meta.len()));
    }
    let mut data = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(cap.saturating_add(1)).read_to_end(&mut data)?;
    if data.len() as u64 > cap {
        return Ok(Capped::TooLarge(data.len() as u64));
    }
    Ok(Capped::Data(data))
}

/// True when `path` is a directory itself, not a symlink to one.
pub(crate) fn is_real_dir(path: &Path) -> io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(m) => Ok(m.file_type().is_dir()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_small_regular_files_and_refuses_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"hello").unwrap();
        assert!(matches!(read_capped(&f, 5).unwrap(), Capped::Data(d) if d == b"hello"));
        assert!(matches!(read_capped(&f, 4).unwrap(), Capped::TooLarge(5)));

        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(matches!(
            read_capped(&link, 100).unwrap(),
            Capped::NotRegular
        ));
        assert!(matches!(
            read_capped(&dir.path().join("none"), 100).unwrap(),
            Capped::Missing
        ));
        // open_nofollow itself refuses the symlink even without the lstat check.
        assert!(open_nofollow(&link).is_err());
    }

    #[test]
    fn never_opens_a_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("p");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        assert!(matches!(
            read_capped(&fifo, 100).unwrap(),
            Capped::NotRegular
        ));
        // Even opened directly, O_NONBLOCK keeps a reader from waiting for a writer,
        // and fstat then refuses it.
        let f = open_nofollow(&fifo).unwrap();
        assert!(matches!(
            read_open_capped(f, 100).unwrap(),
            Capped::NotRegular
        ));
    }
}
