//! The pack receiver's header pre-scan (`orchestrator/git/src/import/
//! pack_scan.rs`, `scan_pack`): what each object of a door pack would cost
//! once inflated, checked before libgit2 reads a byte of it.
//!
//! The input is the pack's bytes; as for `pack_index`, when it starts with
//! `PACK` its last 20 bytes are replaced by the SHA-1 of the rest (any
//! sender can), so mutations reach past the trailer check. Checked, beyond
//! "no panic": the result does not depend on how the bytes arrive (read
//! whole, or in small uneven pieces, as from a socket); a pack that passes
//! is within every limit; a pack of more objects than its header declares,
//! or bytes after the trailer, never passes.
#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use orchestrator_git::{scan_pack, ImportLimits, PackLimits};
use sha1::{Digest, Sha1};

/// The limits the door's receiver derives from the import limits.
fn limits() -> PackLimits {
    PackLimits::from(ImportLimits {
        max_file_bytes: 1 << 20,
        max_total_bytes: 4 << 20,
        max_files: 1000,
        max_objects: 1000,
    })
}

/// Yields the bytes in pieces of 1, 2, 3, ... 13, 1, 2, ... bytes.
struct Trickle<'a> {
    rest: &'a [u8],
    next: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.next = self.next % 13 + 1;
        let n = self.next.min(buf.len()).min(self.rest.len());
        buf[..n].copy_from_slice(&self.rest[..n]);
        self.rest = &self.rest[n..];
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    let mut pack = data.to_vec();
    if pack.starts_with(b"PACK") && pack.len() >= 32 {
        let body = pack.len() - 20;
        let sum = Sha1::digest(&pack[..body]);
        pack[body..].copy_from_slice(&sum);
    }
    let limits = limits();
    let whole = scan_pack(&pack[..], &limits);
    let trickled = scan_pack(
        Trickle {
            rest: &pack,
            next: 0,
        },
        &limits,
    );
    assert_eq!(whole, trickled, "the scan depends on how the bytes arrive");
    match whole {
        Ok(summary) => {
            let declared = u32::from_be_bytes([pack[8], pack[9], pack[10], pack[11]]);
            assert_eq!(summary.objects, u64::from(declared));
            assert!(summary.objects <= limits.max_objects);
            assert!(summary.deltas <= summary.objects);
            assert!(summary.inflated_bytes <= limits.max_total_bytes);
            assert!(
                summary
                    .inflated_bytes
                    .saturating_add(summary.delta_result_bytes)
                    <= limits.max_total_bytes
            );
            // One byte more after the trailer never passes.
            let mut longer = pack.clone();
            longer.push(0);
            assert!(scan_pack(&longer[..], &limits).is_err());
        }
        Err(e) => {
            let _ = e.to_string();
            let _ = e.is_over_limit();
        }
    }
});
