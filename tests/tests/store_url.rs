//! `--store` (and `NIGHTSHIFT_STORE`): the store's port is built once from
//! it. `sqlite:DIR` keeps the database and the files beside it in DIR, apart
//! from the state directory, and everything (the CLI, a run's door, the
//! processes it starts) uses that one store; a store URL that names nothing
//! known is refused with the reason, never with its password.

use tests::{image, make_repo, stderr, stdout, State};

#[test]
fn a_store_placed_apart_holds_the_whole_night_and_the_state_dir_holds_none_of_it() {
    let state = State::new();
    let elsewhere = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", elsewhere.path().display());
    let repo = make_repo();
    let out = state
        .cmd()
        .env("NIGHTSHIFT_STORE", &url)
        .args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
            "sh",
            "-c",
            "echo x > x",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // The store's files are where the URL says, and only there.
    assert!(elsewhere.path().join("state.db").is_file());
    assert!(elsewhere.path().join("audit.head").is_file());
    assert!(
        !state.path().join("state.db").exists(),
        "the run wrote a store into the state directory too"
    );
    // The same store answers through the flag as through the variable.
    let runs = state
        .cmd()
        .args(["--store", &url, "runs", "--json"])
        .output()
        .unwrap();
    assert!(runs.status.success(), "{}", stderr(&runs));
    let listed: serde_json::Value = serde_json::from_slice(&runs.stdout).unwrap();
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(1),
        "{}",
        stdout(&runs)
    );
    let verify = state
        .cmd()
        .args(["--store", &url, "audit", "verify"])
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", stdout(&verify));
    // Without the URL, the state directory's own (empty) store: no run.
    let own = state.run(&["runs", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&own.stdout).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{}", stdout(&own));
}

#[test]
fn an_unknown_store_is_refused_by_name_without_its_password() {
    let state = State::new();
    for url in ["mysql://root:hunter2@db/night", "sqlite:/x?mode=ro"] {
        let out = state.cmd().args(["--store", url, "runs"]).output().unwrap();
        assert_eq!(out.status.code(), Some(3), "{url}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("store"), "{err}");
        assert!(!err.contains("hunter2"), "the password was printed: {err}");
    }
}

#[test]
fn store_migrate_brings_a_store_up_once_and_refuses_a_newer_one() {
    let state = State::new();
    let first = state.run(&["store", "migrate"]);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stdout(&first).contains("schema version 0 -> "),
        "{}",
        stdout(&first)
    );
    let again = state.run(&["store", "migrate"]);
    assert!(stdout(&again).contains("up to date"), "{}", stdout(&again));
    // A store a newer release made: refused, and left as it was.
    let db = rusqlite::Connection::open(state.path().join("state.db")).unwrap();
    db.pragma_update(None, "user_version", 999).unwrap();
    drop(db);
    for args in [&["store", "migrate"][..], &["runs"][..]] {
        let out = state.run(args);
        assert_eq!(out.status.code(), Some(7), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("newer"), "{}", stderr(&out));
    }
}

#[test]
fn a_postgres_store_holds_the_whole_night_and_the_state_dir_holds_no_database() {
    let state = State::new();
    let url = orchestrator::store_postgres::testing::fresh_database();
    let repo = make_repo();
    let with_store = |args: &[&str]| {
        state
            .cmd()
            .env("NIGHTSHIFT_STORE", &url)
            .args(args)
            .output()
            .unwrap()
    };
    let out = with_store(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "sh",
        "-c",
        "echo x > x",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!state.path().join("state.db").exists());
    let runs = with_store(&["runs", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&runs.stdout).unwrap();
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(1),
        "{}",
        stdout(&runs)
    );
    let verify = with_store(&["audit", "verify"]);
    assert!(verify.status.success(), "{}", stdout(&verify));
    let migrate = with_store(&["store", "migrate"]);
    assert!(
        stdout(&migrate).contains("up to date"),
        "{}",
        stdout(&migrate)
    );
    assert!(!stdout(&migrate).contains("password"));
}

#[test]
fn the_configuration_names_the_store_when_no_flag_or_variable_does() {
    let state = State::new();
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(
        state.path().join("config.toml"),
        format!("[store]\nurl = \"sqlite:{}\"\n", elsewhere.path().display()),
    )
    .unwrap();
    let out = state
        .cmd()
        .env_remove("NIGHTSHIFT_STORE")
        .args(["store", "migrate"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(elsewhere.path().join("state.db").is_file());
    assert!(!state.path().join("state.db").exists());
    // The flag wins over the file.
    let out = state
        .cmd()
        .args(["--store", "sqlite:", "store", "migrate"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(state.path().join("state.db").is_file());
}
