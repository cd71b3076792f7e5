//! An SSH push through the supervisor's ssh-agent (a real `ssh-agent`
//! holding the key; the executor never reads a key file). Alone in its test
//! binary: it sets `SSH_AUTH_SOCK` for the whole process.

mod common;

use std::process::Command;

use common::loopback::{ssh_keygen, SshServer};
use common::Repos;
use orchestrator_executors::{push, Readers, RemoteConfig};

/// Kills the agent it started when dropped.
struct Agent(u32);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.0.to_string()).status();
    }
}

#[test]
fn an_ssh_push_through_the_agent_lands() {
    let repos = Repos::new();
    let commit = repos.commit("a.txt", "one");
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("id_ed25519");
    ssh_keygen(&key);
    let public = std::fs::read_to_string(keys.path().join("id_ed25519.pub")).unwrap();
    let server = SshServer::start(&public);

    let sock = keys.path().join("agent.sock");
    let out = Command::new("ssh-agent")
        .arg("-a")
        .arg(&sock)
        .arg("-s")
        .output()
        .expect("running ssh-agent");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let pid: u32 = text
        .split(';')
        .find_map(|p| p.trim().strip_prefix("SSH_AGENT_PID="))
        .and_then(|p| p.parse().ok())
        .expect("the agent's pid");
    let _agent = Agent(pid);
    let added = Command::new("ssh-add")
        .arg(&key)
        .env("SSH_AUTH_SOCK", &sock)
        .output()
        .unwrap();
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    // The key file is gone: only the agent holds the key.
    std::fs::remove_file(&key).unwrap();
    std::env::set_var("SSH_AUTH_SOCK", &sock);

    let known_hosts = keys.path().join("known_hosts");
    std::fs::write(&known_hosts, server.known_hosts_line()).unwrap();
    let config = RemoteConfig {
        ssh_agent: true,
        known_hosts: Some(known_hosts),
        timeout_secs: Some(60),
        ..RemoteConfig::new(server.url(&repos.bare), Readers::Private)
    };
    let out = push(&config, &repos.host, &commit, "refs/heads/agent/x", None).unwrap();
    assert!(!out.already_there);
    assert_eq!(
        repos.remote_ref("refs/heads/agent/x").as_deref(),
        Some(commit.as_str())
    );
}
