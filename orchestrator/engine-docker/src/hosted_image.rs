//! The hosted deployment's images, built locally from Debian packages like
//! the sandbox image ([`crate::image`]), no registry: the service image
//! (`nightshift image build --service`: the running `nightshift` binary and
//! what it needs, run as `serve` or `worker`) and the PostgreSQL image for
//! `deploy/compose.yaml` (`--postgres`: Debian's `postgresql`).
//!
//! Invariants:
//! - Each reference is content-addressed: `nightshift-service:<digest>`
//!   covers the recipe, the package list, the suite, the image
//!   configuration and the SHA-256 of the binary's bytes;
//!   `nightshift-postgres:<digest>` the recipe, its package list, the
//!   suite, the start script and the configuration
//!   (`tests::each_reference_follows_every_input`). A build whose reference
//!   the engine holds does no work.
//! - The service image says it is hosted (`NIGHTSHIFT_HOSTED=1` in its
//!   environment), so `serve` and `worker` in it check their configuration
//!   before they start (`nightshift_core::hosted`), and runs as the
//!   unprivileged `nightshift` account (uid 10001) unless told otherwise
//!   (`tests::the_service_config_is_hosted_and_unprivileged`).

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::engine::Engine;
use crate::image::{digest_parts, io, run_script, ImageError, SUITE};

pub const RECIPE: &str = include_str!("../../../deploy/image/build-image.sh");
pub const SERVICE_PACKAGES: &str = include_str!("../../../deploy/image/service-packages.txt");
pub const POSTGRES_PACKAGES: &str = include_str!("../../../deploy/image/postgres-packages.txt");
pub const POSTGRES_START: &str = include_str!("../../../deploy/image/postgres-start.sh");
pub const SERVICE_REPOSITORY: &str = "nightshift-service";
pub const POSTGRES_REPOSITORY: &str = "nightshift-postgres";
/// The service account's uid and gid in the service image.
pub const SERVICE_UID: u32 = 10001;
/// Where the service image keeps its state (`NIGHTSHIFT_STATE_DIR`).
pub const SERVICE_STATE_DIR: &str = "/var/lib/nightshift";
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Which of the two images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hosted {
    Service,
    Postgres,
}

/// An image configuration document with a fixed key order (its bytes are
/// the image id's input).
#[allow(clippy::too_many_arguments)]
fn config_json(
    diff_ids: &[String],
    inputs: &str,
    env: &[&str],
    entrypoint: &[&str],
    cmd: &[&str],
    user: &str,
    workdir: &str,
    by: &str,
) -> String {
    let s = |v: &str| serde_json::Value::String(v.to_string()).to_string();
    let list = |v: &[&str]| v.iter().map(|x| s(x)).collect::<Vec<_>>().join(",");
    format!(
        concat!(
            r#"{{"architecture":"amd64","config":{{"Cmd":[{cmd}],"Entrypoint":[{entry}],"Env":[{env}],"#,
            r#""Labels":{{"org.nightshift.inputs":{inputs}}},"User":{user},"WorkingDir":{wd}}},"#,
            r#""created":"1970-01-01T00:00:00Z","history":[{{"created":"1970-01-01T00:00:00Z","created_by":{by}}}],"#,
            r#""os":"linux","rootfs":{{"diff_ids":[{diff}],"type":"layers"}}}}"#
        ),
        cmd = list(cmd),
        entry = list(entrypoint),
        env = list(env),
        inputs = s(inputs),
        user = s(user),
        wd = s(workdir),
        by = s(by),
        diff = diff_ids.iter().map(|d| s(d)).collect::<Vec<_>>().join(","),
    )
}

impl Hosted {
    fn repository(self) -> &'static str {
        match self {
            Hosted::Service => SERVICE_REPOSITORY,
            Hosted::Postgres => POSTGRES_REPOSITORY,
        }
    }

    fn packages(self) -> &'static str {
        match self {
            Hosted::Service => SERVICE_PACKAGES,
            Hosted::Postgres => POSTGRES_PACKAGES,
        }
    }

    /// The image configuration for the layers `diff_ids`.
    fn config(self, diff_ids: &[String], inputs: &str) -> String {
        match self {
            Hosted::Service => config_json(
                diff_ids,
                inputs,
                &[
                    &format!("PATH={PATH}"),
                    "NIGHTSHIFT_HOSTED=1",
                    &format!("NIGHTSHIFT_STATE_DIR={SERVICE_STATE_DIR}"),
                ],
                &["/usr/local/bin/nightshift"],
                &["serve"],
                &format!("{SERVICE_UID}:{SERVICE_UID}"),
                SERVICE_STATE_DIR,
                "nightshift image build --service: debootstrap minbase + service-packages.txt + the binary",
            ),
            Hosted::Postgres => config_json(
                diff_ids,
                inputs,
                &[
                    &format!("PATH={PATH}"),
                    "PGDATA=/var/lib/postgresql/data",
                    "LANG=C.UTF-8",
                ],
                &["/usr/local/bin/nightshift-postgres"],
                &[],
                "postgres",
                "/var/lib/postgresql",
                "nightshift image build --postgres: debootstrap minbase + postgres-packages.txt",
            ),
        }
    }

    /// Every input of the image, in the order its digest takes them;
    /// `binary_sha256` is the service binary's (ignored for PostgreSQL).
    fn inputs(self, binary_sha256: &str) -> Vec<String> {
        let mut parts = vec![
            format!("{}/v1", self.repository()),
            RECIPE.to_string(),
            self.packages().to_string(),
            SUITE.to_string(),
            self.config(&[], ""),
        ];
        match self {
            Hosted::Service => parts.push(binary_sha256.to_string()),
            Hosted::Postgres => parts.push(POSTGRES_START.to_string()),
        }
        parts
    }

    /// The digest of every input.
    pub fn inputs_digest(self, binary_sha256: &str) -> String {
        digest_parts(&self.inputs(binary_sha256))
    }

    /// The image's reference.
    pub fn reference(self, binary_sha256: &str) -> String {
        format!(
            "{}:{}",
            self.repository(),
            &self.inputs_digest(binary_sha256)[..16]
        )
    }
}

/// The SHA-256 of a file's bytes, hex.
pub fn file_sha256(path: &Path) -> Result<String, ImageError> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(io("reading", path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io("reading", path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// Builds `which` unless the engine already holds its reference; returns
/// the reference. `binary` is the `nightshift` binary the service image
/// holds (the running one, as the caller decides). The service image is
/// two layers: the Debian root filesystem (kept in `scratch_root` by its
/// own digest, so a new binary costs a copy, not another debootstrap) and
/// the binary.
pub async fn build(
    engine: &Engine,
    scratch_root: &Path,
    mirror: &str,
    which: Hosted,
    binary: &Path,
    mut progress: impl FnMut(&str),
) -> Result<String, ImageError> {
    let binary_sha = match which {
        Hosted::Service => file_sha256(binary)?,
        Hosted::Postgres => String::new(),
    };
    let digest = which.inputs_digest(&binary_sha);
    let reference = which.reference(&binary_sha);
    if let Some(found) = engine.image(&reference).await? {
        progress(&format!("up to date: {reference} ({})", found.id));
        return Ok(reference);
    }
    // The root filesystem's digest leaves the binary out.
    let base_digest = which.inputs_digest("");
    let base = scratch_root.join(format!("{}-{}.tar", which.repository(), &base_digest[..16]));
    if !base.is_file() {
        build_base(
            scratch_root,
            mirror,
            which,
            &base_digest,
            &base,
            &mut progress,
        )
        .await?;
    } else {
        progress(&format!("root filesystem up to date: {}", base.display()));
    }
    let scratch = scratch_root.join(&digest[..16]);
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch).map_err(io("clearing", &scratch))?;
    }
    std::fs::create_dir_all(&scratch).map_err(io("creating", &scratch))?;
    let mut layers = vec![base.clone()];
    if which == Hosted::Service {
        // A copy taken now, checked against the digest the reference names.
        let layer = scratch.join("binary.tar");
        let copied = {
            let (binary, layer) = (binary.to_path_buf(), layer.clone());
            tokio::task::spawn_blocking(move || binary_layer(&binary, &layer))
                .await
                .map_err(|e| ImageError::Io {
                    doing: "writing the binary's layer",
                    path: scratch.clone(),
                    source: std::io::Error::other(e.to_string()),
                })??
        };
        if copied != binary_sha {
            return Err(ImageError::Io {
                doing: "copying (it changed while being read)",
                path: binary.to_path_buf(),
                source: std::io::Error::other("the binary changed during the build"),
            });
        }
        layers.push(layer);
    }
    progress("assembling the image (fixed time)");
    let archive = scratch.join("image.tar");
    let expected_id = {
        let (archive, reference, digest) = (archive.clone(), reference.clone(), digest.clone());
        tokio::task::spawn_blocking(move || {
            assemble(&layers, &archive, &reference, |diffs| {
                which.config(diffs, &digest)
            })
        })
        .await
        .map_err(|e| ImageError::Io {
            doing: "assembling",
            path: scratch.clone(),
            source: std::io::Error::other(e.to_string()),
        })??
    };
    progress("loading the image into the engine");
    engine.load_image(&archive).await?;
    let found = engine.require_image(&reference).await?;
    let _ = std::fs::remove_dir_all(&scratch);
    if found.id != expected_id {
        return Err(ImageError::IdMismatch {
            reference,
            found: found.id,
            expected: expected_id,
        });
    }
    progress(&format!("built {reference} ({expected_id})"));
    Ok(reference)
}

/// The Debian root filesystem of `which`, written to `out`.
async fn build_base(
    scratch_root: &Path,
    mirror: &str,
    which: Hosted,
    base_digest: &str,
    out: &Path,
    progress: &mut impl FnMut(&str),
) -> Result<(), ImageError> {
    let scratch = scratch_root.join(format!("base-{}", &base_digest[..16]));
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch).map_err(io("clearing", &scratch))?;
    }
    std::fs::create_dir_all(&scratch).map_err(io("creating", &scratch))?;
    let recipe = scratch.join("build-image.sh");
    let packages = scratch.join("packages.txt");
    let start = scratch.join("postgres-start.sh");
    let rootfs = scratch.join("rootfs.tar");
    std::fs::write(&recipe, RECIPE).map_err(io("writing", &recipe))?;
    std::fs::write(&packages, which.packages()).map_err(io("writing", &packages))?;
    std::fs::write(&start, POSTGRES_START).map_err(io("writing", &start))?;
    let kind = match which {
        Hosted::Service => "service",
        Hosted::Postgres => "postgres",
    };
    progress(&format!(
        "building the {kind} root filesystem from Debian {SUITE} packages"
    ));
    run_script(
        &recipe,
        &[
            rootfs.as_os_str(),
            packages.as_os_str(),
            SUITE.as_ref(),
            mirror.as_ref(),
            kind.as_ref(),
            start.as_os_str(),
        ],
        progress,
    )
    .await?;
    std::fs::rename(&rootfs, out).map_err(io("keeping", out))?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// A layer holding `binary` as `/usr/local/bin/nightshift` (0755, root);
/// returns the SHA-256 of the bytes it wrote.
fn binary_layer(binary: &Path, layer: &Path) -> Result<String, ImageError> {
    let bytes = std::fs::read(binary).map_err(io("reading", binary))?;
    let out = std::fs::File::create(layer).map_err(io("writing", layer))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(out));
    for dir in ["usr/", "usr/local/", "usr/local/bin/"] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        h.set_mode(0o755);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        tar.append_data(&mut h, dir, std::io::empty())
            .map_err(io("writing", layer))?;
    }
    let mut h = tar::Header::new_gnu();
    h.set_size(bytes.len() as u64);
    h.set_mode(0o755);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_cksum();
    tar.append_data(&mut h, "usr/local/bin/nightshift", &bytes[..])
        .map_err(io("writing", layer))?;
    let mut inner = tar.into_inner().map_err(io("writing", layer))?;
    inner.flush().map_err(io("writing", layer))?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// Writes a `docker save`-layout archive of `layers` (in order); returns
/// the image id it will have.
fn assemble(
    layers: &[PathBuf],
    archive: &Path,
    reference: &str,
    config_of: impl FnOnce(&[String]) -> String,
) -> Result<String, ImageError> {
    let mut hexes = Vec::new();
    for layer in layers {
        hexes.push(file_sha256(layer)?);
    }
    let diffs: Vec<String> = hexes.iter().map(|h| format!("sha256:{h}")).collect();
    let config = config_of(&diffs).into_bytes();
    let config_hex = hex::encode(Sha256::digest(&config));
    let layer_names: Vec<String> = hexes
        .iter()
        .map(|h| serde_json::Value::String(format!("{h}/layer.tar")).to_string())
        .collect();
    let manifest = format!(
        r#"[{{"Config":"{config_hex}.json","RepoTags":[{}],"Layers":[{}]}}]"#,
        serde_json::Value::String(reference.to_string()),
        layer_names.join(",")
    )
    .into_bytes();
    let out = std::fs::File::create(archive).map_err(io("writing", archive))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(out));
    let header = |size: u64| {
        let mut h = tar::Header::new_gnu();
        h.set_size(size);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_cksum();
        h
    };
    tar.append_data(
        &mut header(config.len() as u64),
        format!("{config_hex}.json"),
        &config[..],
    )
    .map_err(io("writing", archive))?;
    tar.append_data(
        &mut header(manifest.len() as u64),
        "manifest.json",
        &manifest[..],
    )
    .map_err(io("writing", archive))?;
    for (layer, hex) in layers.iter().zip(&hexes) {
        let mut f = std::fs::File::open(layer).map_err(io("reading", layer))?;
        let size = f.metadata().map_err(io("reading", layer))?.len();
        tar.append_data(&mut header(size), format!("{hex}/layer.tar"), &mut f)
            .map_err(io("writing", archive))?;
    }
    let mut inner = tar.into_inner().map_err(io("writing", archive))?;
    inner.flush().map_err(io("writing", archive))?;
    Ok(format!("sha256:{config_hex}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recipe files as they are on disk (not through `include_str!`).
    fn on_disk(file: &str) -> String {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .map(|d| d.join("deploy/image"))
            .find(|d| d.join("build-image.sh").is_file())
            .expect("deploy/image/ above the crate");
        std::fs::read_to_string(dir.join(file)).unwrap()
    }

    #[test]
    fn the_references_are_the_digest_of_the_files_on_disk() {
        assert_eq!(RECIPE, on_disk("build-image.sh"));
        assert_eq!(SERVICE_PACKAGES, on_disk("service-packages.txt"));
        assert_eq!(POSTGRES_PACKAGES, on_disk("postgres-packages.txt"));
        assert_eq!(POSTGRES_START, on_disk("postgres-start.sh"));
        let service = Hosted::Service.reference("ab");
        assert!(service.starts_with("nightshift-service:"), "{service}");
        assert_eq!(service.len(), "nightshift-service:".len() + 16);
        let pg = Hosted::Postgres.reference("ignored");
        assert_eq!(pg, Hosted::Postgres.reference("other"));
        assert!(pg.starts_with("nightshift-postgres:"), "{pg}");
    }

    /// Another binary, another reference; changing any input (or moving a
    /// byte between two) changes the digest.
    #[test]
    fn each_reference_follows_every_input() {
        assert_ne!(
            Hosted::Service.reference(&"a".repeat(64)),
            Hosted::Service.reference(&"b".repeat(64))
        );
        for which in [Hosted::Service, Hosted::Postgres] {
            let inputs = which.inputs(&"a".repeat(64));
            let mut seen = std::collections::BTreeSet::from([digest_parts(&inputs)]);
            for i in 0..inputs.len() {
                let mut changed = inputs.clone();
                changed[i].push('\n');
                assert!(seen.insert(digest_parts(&changed)), "{which:?} input {i}");
            }
        }
        assert_ne!(
            Hosted::Service.reference("x"),
            Hosted::Postgres.reference("x")
        );
    }

    #[test]
    fn the_service_config_is_hosted_and_unprivileged() {
        let v: serde_json::Value = serde_json::from_str(
            &Hosted::Service.config(&["sha256:ab".into(), "sha256:cd".into()], "d"),
        )
        .unwrap();
        let env: Vec<&str> = v["config"]["Env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        assert!(env.contains(&"NIGHTSHIFT_HOSTED=1"), "{env:?}");
        assert_eq!(v["config"]["User"], "10001:10001");
        assert_eq!(v["config"]["Entrypoint"][0], "/usr/local/bin/nightshift");
        assert_eq!(v["rootfs"]["diff_ids"][1], "sha256:cd");
        let v: serde_json::Value =
            serde_json::from_str(&Hosted::Postgres.config(&["sha256:cd".into()], "d")).unwrap();
        assert_eq!(v["config"]["User"], "postgres");
        assert_eq!(
            v["config"]["Entrypoint"][0],
            "/usr/local/bin/nightshift-postgres"
        );
    }
}
