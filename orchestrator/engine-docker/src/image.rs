//! The default sandbox image: built locally from Debian packages, no registry.
//!
//! Invariants:
//! - The reference is content-addressed: `nightshift-sandbox:<digest>` where
//!   the digest covers every input (the recipe script, the package list, the
//!   suite, the image configuration). Same inputs, same reference; a build
//!   whose reference the engine already holds does no work.
//! - The image is assembled here from the root filesystem archive (one
//!   layer, fixed creation time), so its id is the digest of its
//!   configuration: the same root filesystem always gives the same image id.
//! - A toolchain image (`--with rust,python,node`) is the sandbox or agent
//!   image's recipe with the toolchains' Debian packages added; its digest
//!   covers the base image's digest and each toolchain's name and package
//!   list, in one order whatever order they were asked in
//!   (`tests::toolchain_references_follow_their_inputs_not_their_order`).
//! - The Debian root filesystem an image starts from is built once per
//!   recipe, package list, suite and mirror, and kept in the build folder as
//!   `rootfs-<digest>.tar` ([`base_rootfs_key`]): the agent images, whose
//!   Debian packages are the same, share one debootstrap
//!   (`tests::agent_images_share_one_root_filesystem`). It is only read:
//!   each image's own steps write new archives, and the image's id is
//!   computed from the archive it is assembled from.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::engine::{Engine, EngineError};
use nightshift_core::sandbox::{PATH, SANDBOX_GID, SANDBOX_UID, WORKSPACE};

pub const RECIPE: &str = include_str!("../../../sandbox-image/build-rootfs.sh");
pub const PACKAGES: &str = include_str!("../../../sandbox-image/packages.txt");
pub const SUITE: &str = "bookworm";
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
pub const REPOSITORY: &str = "nightshift-sandbox";

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("{doing} {path}: {source}")]
    Io {
        doing: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the root filesystem recipe failed ({status}); its last lines:\n{tail}")]
    Recipe { status: String, tail: String },
    #[error("the {preset} preset's lock file pins a version known to have been malicious: {pins}")]
    Malicious { preset: &'static str, pins: String },
    #[error("the engine holds image {reference} with id {found}, expected {expected}")]
    IdMismatch {
        reference: String,
        found: String,
        expected: String,
    },
}

pub(crate) fn io<'a>(
    doing: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> ImageError + 'a {
    move |source| ImageError::Io {
        doing,
        path: path.to_path_buf(),
        source,
    }
}

/// The image configuration (the Docker/OCI image config document). Written
/// as text with a fixed key order: its bytes are the image id's input, and
/// must not depend on how a JSON library happens to order maps in a build.
fn config_json(layer_diff_id: &str, inputs_digest: &str) -> String {
    let s = |v: &str| serde_json::Value::String(v.to_string()).to_string();
    format!(
        concat!(
            r#"{{"architecture":"amd64","config":{{"Env":[{env}],"Labels":{{"org.nightshift.inputs":{inputs}}},"#,
            r#""User":{user},"WorkingDir":{wd}}},"created":"1970-01-01T00:00:00Z","#,
            r#""history":[{{"created":"1970-01-01T00:00:00Z","created_by":{by}}}],"#,
            r#""os":"linux","rootfs":{{"diff_ids":[{diff}],"type":"layers"}}}}"#
        ),
        env = s(&format!("PATH={PATH}")),
        inputs = s(inputs_digest),
        user = s(&format!("{SANDBOX_UID}:{SANDBOX_GID}")),
        wd = s(WORKSPACE),
        by = s(&format!(
            "nightshift image build: debootstrap {SUITE} minbase + packages.txt"
        )),
        diff = s(layer_diff_id),
    )
}

/// SHA-256 over the parts, each prefixed with its length: two different
/// lists of parts never hash the same bytes.
pub(crate) fn digest_parts<P: AsRef<str>>(parts: &[P]) -> String {
    let mut h = Sha256::new();
    for part in parts {
        let part = part.as_ref();
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// Every input of the default image, in the order its digest takes them.
fn default_inputs() -> [String; 5] {
    [
        "nightshift-sandbox/v1".into(),
        RECIPE.into(),
        PACKAGES.into(),
        SUITE.into(),
        config_json("", ""),
    ]
}

/// The digest of every input of the default image.
pub fn inputs_digest() -> String {
    digest_parts(&default_inputs())
}

/// The default image's reference: what `--image` defaults to.
pub fn default_reference() -> String {
    format!("{REPOSITORY}:{}", &inputs_digest()[..16])
}

/// The recipe that installs an agent preset over the default root filesystem.
pub const AGENT_RECIPE: &str = include_str!("../../../sandbox-image/agents/install-agent.sh");
/// Package versions known to have been malicious; no lock file pins one.
pub const KNOWN_MALICIOUS: &str = include_str!("../../../sandbox-image/agents/known-malicious.txt");
/// Where agent images are kept: `nightshift-agent-<preset>:<digest>`.
pub const AGENT_REPOSITORY: &str = "nightshift-agent";

/// An agent image: the default image plus a real agent installed from
/// PyPI at build time, pinned with hashes (`sandbox-image/agents/<preset>/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    ClaudeCode,
    Codex,
    MiniSweAgent,
    Aider,
    /// The official `openai` and `anthropic` Python SDKs (for tests).
    PythonSdks,
}

macro_rules! preset_file {
    ($preset:literal, $file:literal) => {
        include_str!(concat!(
            "../../../sandbox-image/agents/",
            $preset,
            "/",
            $file
        ))
    };
}

impl Agent {
    pub const ALL: [Agent; 5] = [
        Agent::ClaudeCode,
        Agent::Codex,
        Agent::MiniSweAgent,
        Agent::Aider,
        Agent::PythonSdks,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::Codex => "codex",
            Agent::MiniSweAgent => "mini-swe-agent",
            Agent::Aider => "aider",
            Agent::PythonSdks => "python-sdks",
        }
    }

    /// The preset named `name`, or the error listing them.
    pub fn from_name(name: &str) -> Result<Agent, String> {
        Agent::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| {
                format!(
                    "no agent preset {name:?}; the presets are {}",
                    Agent::ALL.map(Agent::name).join(", ")
                )
            })
    }

    /// The lock file: every package with `==` and `--hash=sha256:`.
    pub fn requirements(self) -> &'static str {
        match self {
            Agent::ClaudeCode => preset_file!("claude-code", "requirements.txt"),
            Agent::Codex => preset_file!("codex", "requirements.txt"),
            Agent::MiniSweAgent => preset_file!("mini-swe-agent", "requirements.txt"),
            Agent::Aider => preset_file!("aider", "requirements.txt"),
            Agent::PythonSdks => preset_file!("python-sdks", "requirements.txt"),
        }
    }

    /// Debian packages added to the default image's.
    pub fn packages(self) -> &'static str {
        match self {
            Agent::ClaudeCode => preset_file!("claude-code", "packages.txt"),
            Agent::Codex => preset_file!("codex", "packages.txt"),
            Agent::MiniSweAgent => preset_file!("mini-swe-agent", "packages.txt"),
            Agent::Aider => preset_file!("aider", "packages.txt"),
            Agent::PythonSdks => preset_file!("python-sdks", "packages.txt"),
        }
    }

    /// The command the preset runs (`/usr/local/bin/nightshift-agent`).
    pub fn run_script(self) -> &'static str {
        match self {
            Agent::ClaudeCode => preset_file!("claude-code", "run.sh"),
            Agent::Codex => preset_file!("codex", "run.sh"),
            Agent::MiniSweAgent => preset_file!("mini-swe-agent", "run.sh"),
            Agent::Aider => preset_file!("aider", "run.sh"),
            Agent::PythonSdks => preset_file!("python-sdks", "run.sh"),
        }
    }

    /// The digest of every input: the default image's, the install
    /// recipe, the preset's packages, lock file and run script.
    pub fn inputs_digest(self) -> String {
        digest_parts(&[
            "nightshift-agent/v1",
            &inputs_digest(),
            self.name(),
            AGENT_RECIPE,
            self.packages(),
            self.requirements(),
            self.run_script(),
        ])
    }

    pub fn reference(self) -> String {
        format!(
            "{AGENT_REPOSITORY}-{}:{}",
            self.name(),
            &self.inputs_digest()[..16]
        )
    }
}

/// The pins of a lock file (`name==version`, lowercased) that
/// [`KNOWN_MALICIOUS`] lists.
pub fn malicious_pins(requirements: &str) -> Vec<String> {
    let known: Vec<String> = KNOWN_MALICIOUS
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_lowercase)
        .collect();
    requirements
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_lowercase)
        .filter(|pin| known.contains(pin))
        .collect()
}

/// The recipe that installs toolchains' Debian packages over a sandbox or
/// agent root filesystem.
pub const TOOLCHAIN_RECIPE: &str =
    include_str!("../../../sandbox-image/toolchains/install-toolchains.sh");

/// A toolchain installed from Debian's packages over the sandbox or an
/// agent image (`sandbox-image/toolchains/<name>.txt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Toolchain {
    Node,
    Python,
    Rust,
}

impl Toolchain {
    pub const ALL: [Toolchain; 3] = [Toolchain::Node, Toolchain::Python, Toolchain::Rust];

    pub fn name(self) -> &'static str {
        match self {
            Toolchain::Node => "node",
            Toolchain::Python => "python",
            Toolchain::Rust => "rust",
        }
    }

    /// The Debian packages it adds.
    pub fn packages(self) -> &'static str {
        match self {
            Toolchain::Node => include_str!("../../../sandbox-image/toolchains/node.txt"),
            Toolchain::Python => include_str!("../../../sandbox-image/toolchains/python.txt"),
            Toolchain::Rust => include_str!("../../../sandbox-image/toolchains/rust.txt"),
        }
    }

    /// The toolchains of a comma-separated list (`rust,python`): sorted,
    /// each once; an unknown or empty name is an error naming the known ones.
    pub fn parse_list(list: &str) -> Result<Vec<Toolchain>, String> {
        let mut out = Vec::new();
        for name in list.split(',').map(str::trim) {
            let t = Toolchain::ALL
                .into_iter()
                .find(|t| t.name() == name)
                .ok_or_else(|| {
                    format!(
                        "no toolchain {name:?} in --with {list:?}; the toolchains are {}",
                        Toolchain::ALL.map(Toolchain::name).join(", ")
                    )
                })?;
            out.push(t);
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

/// Which image: the sandbox or an agent's, with toolchains or without.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageSpec {
    pub agent: Option<Agent>,
    /// Sorted, each once (as [`Toolchain::parse_list`] gives them).
    pub toolchains: Vec<Toolchain>,
}

impl ImageSpec {
    pub fn new(agent: Option<Agent>, toolchains: &[Toolchain]) -> ImageSpec {
        let mut toolchains = toolchains.to_vec();
        toolchains.sort();
        toolchains.dedup();
        ImageSpec { agent, toolchains }
    }

    fn base_digest(&self) -> String {
        self.agent
            .map(Agent::inputs_digest)
            .unwrap_or_else(inputs_digest)
    }

    fn base_reference(&self) -> String {
        self.agent
            .map(Agent::reference)
            .unwrap_or_else(default_reference)
    }

    /// The digest of every input: the base image's, the toolchains'
    /// recipe, then each toolchain's name and package list.
    pub fn inputs_digest(&self) -> String {
        if self.toolchains.is_empty() {
            return self.base_digest();
        }
        let mut parts = vec![
            "nightshift-toolchains/v1".to_string(),
            self.base_digest(),
            TOOLCHAIN_RECIPE.to_string(),
        ];
        for t in &self.toolchains {
            parts.push(t.name().to_string());
            parts.push(t.packages().to_string());
        }
        digest_parts(&parts)
    }

    /// `nightshift-sandbox-with-python-rust:<digest>` (the base image's
    /// repository, then the toolchains); the base image's reference when
    /// there are none.
    pub fn reference(&self) -> String {
        if self.toolchains.is_empty() {
            return self.base_reference();
        }
        let base = self.base_reference();
        let repository = base.split(':').next().unwrap_or(&base);
        let names: Vec<&str> = self.toolchains.iter().map(|t| t.name()).collect();
        format!(
            "{repository}-with-{}:{}",
            names.join("-"),
            &self.inputs_digest()[..16]
        )
    }

    /// The base image's Debian packages: the sandbox's and the agent's.
    fn packages(&self) -> String {
        let mut list = PACKAGES.to_string();
        if let Some(agent) = self.agent {
            list.push('\n');
            list.push_str(agent.packages());
        }
        list
    }

    /// The toolchains' Debian packages, installed over the base image.
    fn toolchain_packages(&self) -> String {
        let lists: Vec<&str> = self.toolchains.iter().map(|t| t.packages()).collect();
        lists.join("\n")
    }
}

/// What one image build takes: its reference and digest, the Debian
/// packages, and the agent preset installed over them, if any.
struct Recipe {
    reference: String,
    digest: String,
    packages: String,
    agent: Option<Agent>,
    /// The toolchains' packages (none: empty).
    toolchain_packages: String,
}

/// The key of the Debian root filesystem a recipe starts from: the digest of
/// the recipe script, the package list, the suite and the mirror.
pub fn base_rootfs_key(packages: &str, mirror: &str) -> String {
    digest_parts(&[RECIPE, packages, SUITE, mirror])
}

/// Builds the image `spec` names unless the engine already has it (the
/// same inputs give the same reference: a no-op); returns its reference.
pub async fn build_image(
    engine: &Engine,
    scratch_root: &Path,
    mirror: &str,
    spec: &ImageSpec,
    progress: impl FnMut(&str),
) -> Result<String, ImageError> {
    if let Some(agent) = spec.agent {
        let bad = malicious_pins(agent.requirements());
        if !bad.is_empty() {
            return Err(ImageError::Malicious {
                preset: agent.name(),
                pins: bad.join(", "),
            });
        }
    }
    let recipe = Recipe {
        reference: spec.reference(),
        digest: spec.inputs_digest(),
        packages: spec.packages(),
        agent: spec.agent,
        toolchain_packages: spec.toolchain_packages(),
    };
    build_recipe(engine, scratch_root, mirror, recipe, progress).await
}

async fn build_recipe(
    engine: &Engine,
    scratch_root: &Path,
    mirror: &str,
    recipe: Recipe,
    mut progress: impl FnMut(&str),
) -> Result<String, ImageError> {
    let Recipe {
        reference,
        digest,
        packages: package_list,
        agent,
        toolchain_packages,
    } = recipe;
    if let Some(found) = engine.image(&reference).await? {
        progress(&format!("up to date: {reference} ({})", found.id));
        return Ok(reference);
    }
    let scratch = scratch_root.join(&digest[..16]);
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch).map_err(io("clearing", &scratch))?;
    }
    std::fs::create_dir_all(&scratch).map_err(io("creating", &scratch))?;
    progress(&format!(
        "building {reference} from Debian {SUITE} packages"
    ));
    // The root filesystem: once per recipe and package list, kept.
    let key = base_rootfs_key(&package_list, mirror);
    let base = scratch_root.join(format!("rootfs-{}.tar", &key[..16]));
    if base.is_file() {
        progress(&format!("root filesystem up to date: {}", base.display()));
    } else {
        let recipe = scratch.join("build-rootfs.sh");
        let packages = scratch.join("packages.txt");
        let rootfs = scratch.join("rootfs.tar");
        std::fs::write(&recipe, RECIPE).map_err(io("writing", &recipe))?;
        std::fs::write(&packages, &package_list).map_err(io("writing", &packages))?;
        run_script(
            &recipe,
            &[
                rootfs.as_os_str(),
                packages.as_os_str(),
                SUITE.as_ref(),
                mirror.as_ref(),
            ],
            &mut progress,
        )
        .await?;
        // Whole or not at all: a build killed half-way leaves no base.
        std::fs::rename(&rootfs, &base).map_err(io("keeping", &base))?;
    }
    let rootfs = base.clone();
    let rootfs = match agent {
        None => rootfs,
        Some(agent) => {
            let dir = scratch.join("preset");
            std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
            for (name, text) in [
                ("requirements.txt", agent.requirements()),
                ("run.sh", agent.run_script()),
            ] {
                let path = dir.join(name);
                std::fs::write(&path, text).map_err(io("writing", &path))?;
            }
            let install = scratch.join("install-agent.sh");
            std::fs::write(&install, AGENT_RECIPE).map_err(io("writing", &install))?;
            let out = scratch.join("agent-rootfs.tar");
            progress(&format!("installing the {} preset", agent.name()));
            run_script(
                &install,
                &[
                    rootfs.as_os_str(),
                    out.as_os_str(),
                    dir.as_os_str(),
                    agent.name().as_ref(),
                ],
                &mut progress,
            )
            .await?;
            out
        }
    };
    let rootfs = match toolchain_packages.trim().is_empty() {
        true => rootfs,
        false => {
            let list = scratch.join("toolchain-packages.txt");
            std::fs::write(&list, &toolchain_packages).map_err(io("writing", &list))?;
            let install = scratch.join("install-toolchains.sh");
            std::fs::write(&install, TOOLCHAIN_RECIPE).map_err(io("writing", &install))?;
            let out = scratch.join("toolchain-rootfs.tar");
            progress("installing the toolchains");
            run_script(
                &install,
                &[
                    rootfs.as_os_str(),
                    out.as_os_str(),
                    list.as_os_str(),
                    SUITE.as_ref(),
                    mirror.as_ref(),
                ],
                &mut progress,
            )
            .await?;
            if rootfs != base {
                let _ = std::fs::remove_file(&rootfs);
            }
            out
        }
    };

    progress("assembling the image (one layer, fixed time)");
    let archive = scratch.join("image.tar");
    let expected_id = {
        let rootfs = rootfs.clone();
        let archive = archive.clone();
        let reference = reference.clone();
        let digest = digest.clone();
        tokio::task::spawn_blocking(move || {
            assemble(&rootfs, &archive, &reference, |diff| {
                config_json(diff, &digest)
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

/// Runs one of the recipe scripts with `args`, passing its `image:` lines
/// to `progress`; its last lines of stderr name a failure.
pub(crate) async fn run_script(
    script: &Path,
    args: &[&std::ffi::OsStr],
    progress: &mut impl FnMut(&str),
) -> Result<(), ImageError> {
    let mut child = tokio::process::Command::new("bash")
        .arg(script)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(io("running", script))?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let err_task = tokio::spawn(async move {
        let mut tail = Vec::new();
        if let Some(stderr) = stderr {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tail.push(line);
                if tail.len() > 20 {
                    tail.remove(0);
                }
            }
        }
        tail
    });
    if let Some(stdout) = stdout {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            progress(line.trim_start_matches("image: "));
        }
    }
    let status = child.wait().await.map_err(io("running", script))?;
    let tail = err_task.await.unwrap_or_default();
    if !status.success() {
        return Err(ImageError::Recipe {
            status: status.to_string(),
            tail: tail.join("\n"),
        });
    }
    Ok(())
}

/// Writes a `docker save`-layout archive holding the root filesystem as its
/// one layer; returns the image id it will have.
pub(crate) fn assemble(
    rootfs: &Path,
    archive: &Path,
    reference: &str,
    config_of: impl FnOnce(&str) -> String,
) -> Result<String, ImageError> {
    let mut hasher = Sha256::new();
    let mut f = std::fs::File::open(rootfs).map_err(io("reading", rootfs))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io("reading", rootfs))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let layer_hex = hex::encode(hasher.finalize());
    let diff_id = format!("sha256:{layer_hex}");
    let config = config_of(&diff_id).into_bytes();
    let config_hex = hex::encode(Sha256::digest(&config));
    let manifest = format!(
        r#"[{{"Config":"{config_hex}.json","RepoTags":[{}],"Layers":["{layer_hex}/layer.tar"]}}]"#,
        serde_json::Value::String(reference.to_string())
    )
    .into_bytes();

    let out = std::fs::File::create(archive).map_err(io("writing", archive))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(out));
    let mut add = |name: &str, data: &[u8]| -> std::io::Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_cksum();
        tar.append_data(&mut header, name, data)
    };
    add(&format!("{config_hex}.json"), &config).map_err(io("writing", archive))?;
    add("manifest.json", &manifest).map_err(io("writing", archive))?;
    let mut layer = std::fs::File::open(rootfs).map_err(io("reading", rootfs))?;
    let size = layer.metadata().map_err(io("reading", rootfs))?.len();
    let mut header = tar::Header::new_gnu();
    header.set_size(size);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_cksum();
    tar.append_data(&mut header, format!("{layer_hex}/layer.tar"), &mut layer)
        .map_err(io("writing", archive))?;
    let mut inner = tar.into_inner().map_err(io("writing", archive))?;
    inner.flush().map_err(io("writing", archive))?;
    Ok(format!("sha256:{config_hex}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_agent_lock_pins_each_package_with_a_hash_and_none_known_malicious() {
        for agent in Agent::ALL {
            let lock = agent.requirements();
            let mut pins = 0;
            let lines: Vec<&str> = lock.lines().filter(|l| !l.starts_with('#')).collect();
            for pair in lines.chunks(2) {
                let [pin, hash] = pair else {
                    panic!("{}: a pin without its hash: {pair:?}", agent.name())
                };
                assert!(
                    pin.contains("==") && pin.ends_with(" \\"),
                    "{}: {pin}",
                    agent.name()
                );
                let hash = hash.trim().strip_prefix("--hash=sha256:").unwrap_or("");
                assert_eq!(hash.len(), 64, "{}: {pin}", agent.name());
                pins += 1;
            }
            assert!(pins > 0, "{}", agent.name());
            assert!(malicious_pins(lock).is_empty(), "{}", agent.name());
            assert_eq!(Agent::from_name(agent.name()), Ok(agent));
        }
        // The check finds a known-malicious pin.
        assert_eq!(
            malicious_pins("LiteLLM==1.82.8 \\\n    --hash=sha256:00\n"),
            ["litellm==1.82.8"]
        );
        assert!(Agent::from_name("cursor")
            .unwrap_err()
            .contains("claude-code"));
    }

    #[test]
    fn agent_references_are_distinct_and_follow_their_inputs() {
        let refs: std::collections::BTreeSet<String> =
            Agent::ALL.iter().map(|a| a.reference()).collect();
        assert_eq!(refs.len(), Agent::ALL.len());
        assert!(!refs.contains(&default_reference()));
        assert!(Agent::Codex
            .reference()
            .starts_with("nightshift-agent-codex:"));
    }

    /// The folder `sandbox-image/` of this checkout, read from disk at test
    /// time (not through `include_str!`).
    fn recipe_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .map(|d| d.join("sandbox-image"))
            .find(|d| d.join("build-rootfs.sh").is_file())
            .expect("sandbox-image/ above the crate")
    }

    /// The digest as the module note defines it, written out here apart
    /// from the code under test: SHA-256 over each part's length (8 bytes,
    /// little-endian) and bytes.
    fn independent_digest(parts: &[&str]) -> String {
        let mut h = Sha256::new();
        for part in parts {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        hex::encode(h.finalize())
    }

    /// The reference is the digest of the recipe files as they are on disk:
    /// a build input left out of it (or a stale copy of one) fails here.
    #[test]
    fn the_reference_is_the_digest_of_the_recipe_files_on_disk() {
        let dir = recipe_dir();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        let digest = independent_digest(&[
            "nightshift-sandbox/v1",
            &read("build-rootfs.sh"),
            &read("packages.txt"),
            "bookworm",
            &config_json("", ""),
        ]);
        assert_eq!(
            default_reference(),
            format!("nightshift-sandbox:{}", &digest[..16])
        );
        // An agent image's reference: the default image's digest, then the
        // preset's own files.
        let agents = dir.join("agents");
        let preset = |f: &str| std::fs::read_to_string(agents.join("codex").join(f)).unwrap();
        let digest = independent_digest(&[
            "nightshift-agent/v1",
            &inputs_digest(),
            "codex",
            &std::fs::read_to_string(agents.join("install-agent.sh")).unwrap(),
            &preset("packages.txt"),
            &preset("requirements.txt"),
            &preset("run.sh"),
        ]);
        assert_eq!(
            Agent::Codex.reference(),
            format!("nightshift-agent-codex:{}", &digest[..16])
        );
    }

    /// Changing any one input changes the digest, and so does moving a
    /// byte from one input to the next; the same inputs, copied afresh,
    /// give the same digest.
    #[test]
    fn the_digest_follows_every_input() {
        let inputs = default_inputs();
        let base = digest_parts(&inputs);
        assert_eq!(base, inputs_digest());
        let again: Vec<String> = inputs.iter().map(|i| i.chars().collect()).collect();
        assert_eq!(digest_parts(&again), base);
        let mut seen = std::collections::BTreeSet::from([base]);
        for i in 0..inputs.len() {
            let mut changed = inputs.clone();
            changed[i].push('\n');
            assert!(
                seen.insert(digest_parts(&changed)),
                "changing input {i} left the digest as it was"
            );
        }
        for i in 1..inputs.len() {
            let mut moved = inputs.clone();
            let byte = moved[i - 1].pop().unwrap();
            moved[i].insert(0, byte);
            assert!(
                seen.insert(digest_parts(&moved)),
                "a byte moved from input {} to input {i} left the digest as it was",
                i - 1
            );
        }
    }

    /// A toolchain image's reference: the base image's digest, then each
    /// toolchain's name and its package list as on disk, sorted by name;
    /// the order asked and repeats do not change it.
    #[test]
    fn toolchain_references_follow_their_inputs_not_their_order() {
        let dir = recipe_dir().join("toolchains");
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        let digest = independent_digest(&[
            "nightshift-toolchains/v1",
            &Agent::Codex.inputs_digest(),
            &read("install-toolchains.sh"),
            "python",
            &read("python.txt"),
            "rust",
            &read("rust.txt"),
        ]);
        let spec = ImageSpec::new(
            Some(Agent::Codex),
            &Toolchain::parse_list("rust,python,rust").unwrap(),
        );
        assert_eq!(
            spec.reference(),
            format!("nightshift-agent-codex-with-python-rust:{}", &digest[..16])
        );
        let plain = ImageSpec::new(None, &Toolchain::parse_list("python, rust").unwrap());
        assert!(plain
            .reference()
            .starts_with("nightshift-sandbox-with-python-rust:"));
        assert_ne!(plain.inputs_digest(), spec.inputs_digest());
        assert_eq!(ImageSpec::new(None, &[]).reference(), default_reference());
        // Each toolchain's packages are installed over the base's.
        let spec = ImageSpec::new(Some(Agent::Aider), &Toolchain::ALL);
        assert!(spec.packages().lines().any(|l| l == "git"));
        let packages = spec.toolchain_packages();
        for needed in ["python3-venv", "cargo", "python3-pip", "npm", "nodejs"] {
            assert!(packages.lines().any(|l| l == needed), "{needed}");
        }
        let err = Toolchain::parse_list("rust,go").unwrap_err();
        assert!(
            err.contains("\"go\"") && err.contains("node, python, rust"),
            "{err}"
        );
        assert!(Toolchain::parse_list("").is_err());
    }

    #[test]
    fn the_config_is_valid_json_with_its_fields() {
        let v: serde_json::Value = serde_json::from_str(&config_json("sha256:ab", "d1")).unwrap();
        assert_eq!(v["config"]["User"], "1000:1000");
        assert_eq!(v["rootfs"]["diff_ids"][0], "sha256:ab");
        assert_eq!(v["config"]["Labels"]["org.nightshift.inputs"], "d1");
    }

    #[test]
    fn agent_images_share_one_root_filesystem() {
        let key = |spec: &ImageSpec| base_rootfs_key(&spec.packages(), DEFAULT_MIRROR);
        let agents: Vec<String> = Agent::ALL
            .iter()
            .map(|a| key(&ImageSpec::new(Some(*a), &[])))
            .collect();
        assert!(agents.len() >= 5);
        assert!(agents.iter().all(|k| *k == agents[0]), "{agents:?}");
        // The sandbox image's packages differ (no venv): its own.
        let sandbox = key(&ImageSpec::new(None, &[]));
        assert_ne!(sandbox, agents[0]);
        // Toolchains are installed over the base, never into its key.
        assert_eq!(key(&ImageSpec::new(None, &[Toolchain::Rust])), sandbox);
        // Each input of the debootstrap moves it.
        let packages = ImageSpec::new(None, &[]).packages();
        assert_ne!(
            base_rootfs_key(&packages, "http://mirror.example/debian"),
            sandbox
        );
        assert_ne!(
            base_rootfs_key(&format!("{packages}\nvim\n"), DEFAULT_MIRROR),
            sandbox
        );
    }

    #[test]
    fn same_root_filesystem_gives_same_image_id() {
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs.tar");
        std::fs::write(&rootfs, b"not really a tar, but bytes are bytes").unwrap();
        let a = assemble(&rootfs, &dir.path().join("a.tar"), "x:1", |d| {
            config_json(d, "d")
        })
        .unwrap();
        let b = assemble(&rootfs, &dir.path().join("b.tar"), "x:1", |d| {
            config_json(d, "d")
        })
        .unwrap();
        assert_eq!(a, b);
        std::fs::write(&rootfs, b"different bytes").unwrap();
        let c = assemble(&rootfs, &dir.path().join("c.tar"), "x:1", |d| {
            config_json(d, "d")
        })
        .unwrap();
        assert_ne!(a, c);
    }
}
