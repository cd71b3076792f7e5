//! Builds the door clients (`sandbox-image-door`'s `nightshift-act` and
//! `git-remote-nightshift`), the sandbox's lease wrapper
//! (`nightshift-lease`) and the end-of-run packer (`sandbox-image-result`'s
//! `nightshift-result`, with libgit2 linked in) as static executables and leaves them in
//! `OUT_DIR`, where `door.rs` embeds them: the `nightshift` binary is whole
//! on its own, wherever it is installed.
//!
//! The clients are built by a nested cargo the way
//! `sandbox-image/door/build-static.sh` builds them on their own: release, `x86_64-unknown-linux-gnu`, `-C target-feature=+crt-static`,
//! in a target directory of their own (the outer cargo holds the lock on its
//! own), with none of the outer build's flags or target settings inherited.

use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "x86_64-unknown-linux-gnu";
const CLIENTS: [&str; 5] = [
    "nightshift-act",
    "git-remote-nightshift",
    "nightshift-lease",
    "nightshift-relay",
    "nightshift-result",
];

fn main() {
    let manifest_dir = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let workspace = manifest_dir
        .parent()
        .and_then(Path::parent)
        .expect("orchestrator/supervisor/ is in the workspace");
    let door = workspace.join("sandbox-image").join("door");
    let result = workspace.join("sandbox-image").join("result");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for watched in [
        door.join("src"),
        door.join("Cargo.toml"),
        result.join("src"),
        result.join("Cargo.toml"),
        workspace.join("orchestrator").join("git").join("src"),
        workspace
            .join("orchestrator")
            .join("git")
            .join("Cargo.toml"),
        workspace.join("Cargo.lock"),
        workspace.join("Cargo.toml"),
    ] {
        println!("cargo:rerun-if-changed={}", watched.display());
    }
    println!("cargo:rerun-if-changed=build.rs");

    let target_dir = nested_target_dir(&out_dir);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args([
            "build",
            "--release",
            "--locked",
            "--bins",
            "-p",
            "sandbox-image-door",
            "-p",
            "sandbox-image-result",
        ])
        .args(["--target", TARGET])
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
    // Nothing of the outer build's configuration (its flags, its target, its
    // target directory, its profile settings, a clippy wrapper) reaches the
    // clients' build; the registry, network and jobserver settings do.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let keep = ["CARGO_HOME", "CARGO_MAKEFLAGS"].contains(&key.as_ref())
            || key.starts_with("CARGO_NET_")
            || key.starts_with("CARGO_HTTP_")
            || key.starts_with("CARGO_REGISTRIES_")
            || key.starts_with("CARGO_REGISTRY_");
        let drop = (key.starts_with("CARGO_") && !keep)
            || key.starts_with("RUSTC_")
            || [
                "RUSTFLAGS",
                "RUSTDOCFLAGS",
                "CLIPPY_ARGS",
                "CLIPPY_CONF_DIR",
            ]
            .contains(&key.as_ref());
        if drop {
            build.env_remove(key.as_ref());
        }
    }
    build.env("CARGO_ENCODED_RUSTFLAGS", "-Ctarget-feature=+crt-static");
    let status = build
        .status()
        .unwrap_or_else(|e| fail(&format!("starting the nested cargo: {e}")));
    if !status.success() {
        fail(&format!(
            "building the static door clients ({}) failed: {status}",
            door.display()
        ));
    }
    for name in CLIENTS {
        let built = target_dir.join(TARGET).join("release").join(name);
        let bytes = std::fs::read(&built)
            .unwrap_or_else(|e| fail(&format!("reading {}: {e}", built.display())));
        if let Err(why) = check_static(&bytes) {
            fail(&format!("{}: {why}", built.display()));
        }
        let dest = out_dir.join(name);
        // A new file, never a write into the old one: a target directory
        // seeded as a hard-link copy of another (`cp -al`) shares its
        // inodes, and writing through them would change the other build's
        // embedded clients.
        let _ = std::fs::remove_file(&dest);
        std::fs::write(&dest, &bytes)
            .unwrap_or_else(|e| fail(&format!("writing {}: {e}", dest.display())));
    }
}

/// One target directory for the clients per profile directory of the outer
/// build (`OUT_DIR` is `<target>/<profile>/build/orchestrator-<hash>/out`),
/// so that later builds, `clippy` and `cargo install` reuse it.
fn nested_target_dir(out_dir: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "build"))
        .and_then(Path::parent)
        .map(|profile| profile.join("door-clients-build"))
        .unwrap_or_else(|| out_dir.join("door-clients-build"))
}

/// The clients run in any image, even one without a C library: a 64-bit ELF
/// executable with no program interpreter (`PT_INTERP`) is linked statically
/// (a static PIE included).
fn check_static(elf: &[u8]) -> Result<(), String> {
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    if elf.get(..5) != Some(b"\x7fELF\x02") {
        return Err("not a 64-bit ELF executable".into());
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return Err("truncated ELF header".into());
    };
    for i in 0..phnum as usize {
        let at = phoff as usize + i * phentsize as usize;
        match u32_at(at) {
            Some(3) => return Err("dynamically linked (it has a program interpreter)".into()),
            Some(_) => {}
            None => return Err("truncated program headers".into()),
        }
    }
    Ok(())
}

fn fail(message: &str) -> ! {
    eprintln!("error: orchestrator/build.rs: {message}");
    std::process::exit(1);
}
