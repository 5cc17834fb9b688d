//! Registry: built-ins, uploads, directories, removal, lookups by hash.

mod common;
use common::*;
use specd_policy::{Contract, PolicyErrorKind, PolicySource, RegistryError};

#[test]
fn builtins_are_listed_with_hash_and_exports() {
    let list = host().list();
    let names: Vec<&str> = list
        .iter()
        .filter(|p| p.builtin)
        .map(|p| p.name.as_str())
        .collect();
    for n in [
        "constant",
        "heuristic",
        "heuristic-transient",
        "throughput",
        "greedy",
        "rejection",
        "typical",
        "heuristic-c",
        "adaedl",
        "bandit",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    for p in list.iter().filter(|p| p.builtin) {
        assert_eq!(p.sha256.len(), 64);
        assert_eq!(p.source, PolicySource::Builtin);
        assert!(!p.imports_wasi, "{} imports WASI", p.name);
        let is_schedule = [
            "constant",
            "heuristic",
            "heuristic-transient",
            "throughput",
            "heuristic-c",
            "adaedl",
            "bandit",
        ]
        .contains(&p.name.as_str());
        assert_eq!(p.exports.schedule, is_schedule, "{}", p.name);
        assert_eq!(p.exports.acceptance, !is_schedule, "{}", p.name);
        // The new built-ins and `throughput` (it reads the batch context)
        // are contract 0.2 components, the others stay 0.1.
        let v0_2 = ["adaedl", "bandit", "throughput"].contains(&p.name.as_str());
        let want = if v0_2 { Contract::V0_2 } else { Contract::V0_1 };
        assert_eq!(p.exports.contract, want, "{}", p.name);
    }
}

#[test]
fn uploads_dirs_removal_and_hash_lookup() {
    let bytes = plugin_file("constant");
    // a built-in's name is taken (409)
    let err = host().add("greedy", &bytes).unwrap_err();
    assert_eq!(err, RegistryError::BuiltinName("greedy".into()));
    assert_eq!(err.http_status(), 409);
    assert_eq!(
        host().add("Bad Name", &bytes).unwrap_err().http_status(),
        400
    );
    // same bytes under a new name: same hash, no recompilation needed
    let info = host().add("my-constant", &bytes).unwrap();
    assert_eq!(info.source, PolicySource::Upload);
    let builtin = host()
        .list()
        .into_iter()
        .find(|p| p.name == "constant")
        .unwrap();
    assert_eq!(info.sha256, builtin.sha256);
    // select by name, by hash, by hash prefix
    for key in ["my-constant", &info.sha256[..], &info.sha256[..12]] {
        let mut s = host().schedule(key, r#"{"k":5}"#, "m").unwrap();
        assert_eq!(s.next_draft_length(&input(0, 16, &[])).unwrap(), 5, "{key}");
    }
    // wrong interface: a schedule is not an acceptance policy
    let err = host().acceptance("my-constant", "{}", 10).err().unwrap();
    assert_eq!(err.kind, PolicyErrorKind::NotFound);
    assert!(err.message.contains("schedule"), "{err}");
    // removal
    assert_eq!(host().remove("constant").unwrap_err().http_status(), 409);
    host().remove("my-constant").unwrap();
    assert_eq!(host().remove("my-constant").unwrap_err().http_status(), 404);
    assert!(
        host().schedule("constant", "{}", "m").is_ok(),
        "the built-in with the same hash stays"
    );
    let err = host().schedule("no-such-policy", "{}", "m").err().unwrap();
    assert_eq!(err.kind, PolicyErrorKind::NotFound);

    // a directory of components
    let dir = std::env::temp_dir().join(format!("specd-policy-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("dir-heuristic.wasm"), plugin_file("heuristic")).unwrap();
    std::fs::write(dir.join("dir-typical.wasm"), plugin_file("typical")).unwrap();
    std::fs::write(dir.join("notes.txt"), "ignored").unwrap();
    let infos = host().add_dir(&dir).unwrap();
    assert_eq!(
        infos.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
        vec!["dir-heuristic", "dir-typical"]
    );
    assert!(matches!(infos[0].source, PolicySource::File(_)));
    assert!(host().acceptance("dir-typical", "{}", 10).is_ok());
    // a bad file is reported with its path
    std::fs::write(dir.join("zz-broken.wasm"), b"\0asm\x0d\0\x01\0garbage").unwrap();
    let err = host().add_dir(&dir).unwrap_err();
    assert!(format!("{err:#}").contains("zz-broken.wasm"), "{err:#}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn metrics_count_calls_and_instantiations() {
    let before = host().metrics();
    let mut s = host().schedule("constant", "{}", "metrics").unwrap();
    for r in 0..10 {
        s.next_draft_length(&input(r, 16, &[])).unwrap();
    }
    let after = host().metrics();
    assert!(after.schedule_calls >= before.schedule_calls + 10);
    assert!(after.instantiations > before.instantiations);
    assert!(after
        .prometheus()
        .unwrap()
        .contains("specd_policy_failures_total{kind=\"timeout\"}"));
}

#[test]
fn quotas_refuse_with_507_and_leave_the_registry_as_it_was() {
    use specd_policy::{PolicyHost, RegistryQuota};
    // Its own host: the shared one gets user policies from other tests.
    let h = PolicyHost::new(test_config()).unwrap();
    let constant = plugin_file("constant");
    let heuristic = plugin_file("heuristic");
    let users = |h: &PolicyHost| -> Vec<String> {
        h.list()
            .into_iter()
            .filter(|p| !p.builtin)
            .map(|p| p.name)
            .collect()
    };
    let two = RegistryQuota {
        max_policies: 2,
        max_bytes: 1 << 30,
    };
    h.add_within("a", &constant, &two).unwrap();
    h.add_within("b", &heuristic, &two).unwrap();
    let err = h.add_within("c", &constant, &two).unwrap_err();
    assert_eq!(err.http_status(), 507, "{err}");
    assert!(err.to_string().contains("2 user policies"), "{err}");
    assert_eq!(users(&h), ["a", "b"]);
    // replacing a name is not one more policy
    let info = h.add_within("a", &heuristic, &two).unwrap();
    assert_eq!(users(&h), ["a", "b"]);
    assert_eq!(info.size_bytes, heuristic.len());

    // bytes: "a" and "b" hold 2 heuristics; a third passes the limit by one byte
    let total = (heuristic.len() * 3) as u64;
    let tight = RegistryQuota {
        max_policies: 16,
        max_bytes: total - 1,
    };
    let err = h.add_within("c", &heuristic, &tight).unwrap_err();
    assert_eq!(err.http_status(), 507);
    assert!(
        err.to_string().contains(&format!("{} bytes", total - 1)),
        "{err}"
    );
    assert_eq!(users(&h), ["a", "b"]);
    h.remove("b").unwrap();
    h.add_within("c", &heuristic, &tight).unwrap();
    assert_eq!(users(&h), ["a", "c"]);
    // plain `add` (start-up directories) is not limited
    h.add("d", &constant).unwrap();
    assert_eq!(users(&h), ["a", "c", "d"]);
}
