//! Random damage to a real inspect document never panics, never loses a
//! property from the verdict, and never lets an environment value through.

use std::collections::{BTreeMap, BTreeSet};

use orchestrator_attest::{
    attest, from_docker_inspect, parse_inspect, Expectations, HostObserved, PROPERTY_NAMES,
};
use proptest::prelude::*;
use serde_json::{json, Value};

fn hardened() -> Value {
    let path = format!(
        "{}/tests/fixtures/hardened.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn expectations() -> Expectations {
    Expectations {
        run_id: "fixture".into(),
        worktree_host_path: "/srv/nightshift/worktrees/fixture".into(),
        workspace_target: "/workspace".into(),
        door: None,
        allowed_env: BTreeMap::from([
            ("HOME".into(), "/home/agent".into()),
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("NIGHTSHIFT_RUN_ID".into(), "fixture".into()),
        ]),
        image_env: vec![],
        max_memory_bytes: 536_870_912,
        max_pids: 256,
        max_nproc: 16384,
        allowed_tmpfs: BTreeSet::from(["/tmp".into(), "/home/agent".into()]),
        seccomp_profile_digest: String::new(),
        max_shm_bytes: 8_388_608,
        max_file_bytes: 1_073_741_824,
        main_process: None,
        setup_cache: None,
        runtime: None,
    }
}

/// Every JSON pointer in the document, containers included.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let escaped = k.replace('~', "~0").replace('/', "~1");
                pointers(child, format!("{at}/{escaped}"), out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                pointers(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::from),
        Just(json!("host")),
        Just(json!("none")),
        Just(json!("0")),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[A-Za-z/]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn damaged_documents_never_panic_and_list_every_property(
        picks in prop::collection::vec((any::<prop::sample::Index>(), arb_json(), any::<bool>()), 1..4)
    ) {
        let mut doc = hardened();
        for (index, replacement, delete) in picks {
            let mut all = Vec::new();
            pointers(&doc, String::new(), &mut all);
            let pointer = index.get(&all).clone();
            match pointer.rsplit_once('/') {
                Some((parent, key)) if delete => {
                    if let Some(map) = doc.pointer_mut(parent).and_then(Value::as_object_mut) {
                        map.remove(key);
                    }
                }
                _ => {
                    if let Some(slot) = doc.pointer_mut(&pointer) {
                        *slot = replacement;
                    }
                }
            }
        }
        if let Ok(inspected) = parse_inspect(&doc) {
            let att = attest(&from_docker_inspect(&inspected), &HostObserved::default(), &expectations());
            let names: Vec<&str> = att.properties.iter().map(|p| p.name).collect();
            prop_assert_eq!(names, PROPERTY_NAMES);
            if let Err(refused) = att.ensure_passed() {
                let shown = refused.to_string();
                for p in att.failures() {
                    prop_assert!(shown.contains(p.name));
                }
            }
        }
    }

    /// The undamaged document passes, so the failures above come from the
    /// damage, and an added variable is what the next test's refusal is for.
    #[test]
    fn environment_values_never_reach_the_verdict(
        key in "[A-Z_]{1,10}",
        value in "[a-z0-9]{20,32}",
    ) {
        let secret = format!("v-{value}");
        let mut doc = hardened();
        doc["Config"]["Env"]
            .as_array_mut()
            .unwrap()
            .push(json!(format!("{key}={secret}")));
        let att = attest(&from_docker_inspect(&parse_inspect(&doc).unwrap()), &HostObserved::default(), &expectations());
        let audit = serde_json::to_string(&att).unwrap();
        prop_assert!(!att.passed());
        prop_assert!(!audit.contains(&secret));
        prop_assert!(!att.ensure_passed().unwrap_err().to_string().contains(&secret));
    }
}
