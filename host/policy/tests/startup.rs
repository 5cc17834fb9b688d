//! Cheap startup: built-ins are compiled lazily (listed from metadata read
//! without compiling) and compiled components are cached on disk.

mod common;
use common::*;
use specd_policy::{builtin_components, HostConfig, PolicyHost, PolicySource};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn cache_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("startup-tests")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn host_with_cache(dir: Option<PathBuf>) -> PolicyHost {
    PolicyHost::new(HostConfig {
        cache_dir: dir,
        ..HostConfig::default()
    })
    .expect("policy host")
}

fn cache_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The heuristic's k sequence over scripted rounds, and greedy's decisions.
fn decisions(host: &PolicyHost) -> (Vec<u32>, Vec<u32>) {
    let mut s = host.schedule("heuristic", "{}", "startup-test").unwrap();
    let mut recent = Vec::new();
    let mut ks = Vec::new();
    for round in 0..8u32 {
        let k = s.next_draft_length(&input(round, 10, &recent)).unwrap();
        ks.push(k);
        recent.push((k, if round % 3 == 0 { k / 2 } else { k }));
    }
    let mut a = host.acceptance("greedy", "{}", 1000).unwrap();
    let accepted = (0..4u32)
        .map(|i| {
            let positions: Vec<_> = (0..4u32)
                .map(|j| specd_policy::Position {
                    token: j,
                    p: 0.5,
                    q: 1.0,
                    target_argmax: if j == i { 999 } else { j },
                    entropy: 1.0,
                    uniform: 0.5,
                    ..Default::default()
                })
                .collect();
            a.decide(&positions).unwrap().accepted
        })
        .collect();
    (ks, accepted)
}

#[test]
fn new_is_cheap_and_lists_builtins_before_compiling_them() {
    let t = Instant::now();
    let host = host_with_cache(None);
    let list = host.list();
    let elapsed = t.elapsed();
    assert_eq!(list.len(), builtin_components().len());
    // Compiling the 8 built-ins took seconds; reading their metadata takes
    // milliseconds (generous bound for a loaded debug/CI machine).
    assert!(
        elapsed.as_secs_f64() < 0.5,
        "PolicyHost::new + list took {elapsed:?}"
    );
    for p in &list {
        assert_eq!(p.source, PolicySource::Builtin);
    }
}

#[test]
fn lazily_read_metadata_matches_the_compiled_component() {
    let host = host_with_cache(None);
    for info in host.list() {
        let bytes = builtin_components()
            .iter()
            .find(|(n, _)| *n == info.name)
            .unwrap()
            .1;
        // `check` compiles the built-in (it is the same component) and fails
        // if wasmtime's type information disagrees with the listed metadata.
        let checked = host
            .check(bytes)
            .unwrap_or_else(|e| panic!("{}: {e}", info.name));
        assert_eq!(checked.sha256, info.sha256, "{}", info.name);
        assert_eq!(checked.exports, info.exports, "{}", info.name);
        assert_eq!(checked.imports_wasi, info.imports_wasi, "{}", info.name);
        assert_eq!(checked.size_bytes, info.size_bytes, "{}", info.name);
        // And a fresh host, with nothing cached, compiles the same metadata
        // through a user registration (eager path).
        let fresh = host_with_cache(None);
        let added = fresh
            .add(&format!("copy-of-{}", info.name), bytes)
            .unwrap_or_else(|e| panic!("{}: {e}", info.name));
        assert_eq!(added.exports, info.exports, "{}", info.name);
        assert_eq!(added.imports_wasi, info.imports_wasi, "{}", info.name);
    }
}

#[test]
fn compiled_components_are_cached_on_disk_and_bad_files_are_ignored() {
    let dir = cache_dir("disk");
    let first = decisions(&host_with_cache(Some(dir.clone())));
    let files = cache_files(&dir);
    assert_eq!(
        files.len(),
        2,
        "one artifact per compiled component: {files:?}"
    );
    for f in &files {
        let name = f.file_name().unwrap().to_str().unwrap();
        assert!(name.ends_with(".cwasm") && !name.starts_with('.'), "{name}");
    }

    // A new host (a new process, in effect) deserializes them and decides the same.
    let sizes: Vec<u64> = files.iter().map(|f| f.metadata().unwrap().len()).collect();
    assert_eq!(decisions(&host_with_cache(Some(dir.clone()))), first);
    assert_eq!(cache_files(&dir), files);

    // Garbage and truncated artifacts are ignored, recompiled and rewritten.
    // Replaced, not rewritten in place: an earlier host's instances made
    // ahead may still map the old file, and truncating a mapped file is a
    // SIGBUS for them (the cache itself always writes by rename).
    let replace = |f: &Path, bytes: &[u8]| {
        let tmp = f.with_extension("tmp-test");
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::rename(&tmp, f).unwrap();
    };
    replace(&files[0], b"not a compiled component");
    let half = std::fs::read(&files[1]).unwrap();
    replace(&files[1], &half[..half.len() / 2]);
    assert_eq!(decisions(&host_with_cache(Some(dir.clone()))), first);
    let rewritten: Vec<u64> = files.iter().map(|f| f.metadata().unwrap().len()).collect();
    assert_eq!(rewritten, sizes);
    assert_eq!(cache_files(&dir), files, "no temporary files left behind");

    // An unusable cache directory (here: a file) only means no disk cache.
    let blocked = cache_dir("blocked");
    std::fs::create_dir_all(blocked.parent().unwrap()).unwrap();
    std::fs::write(&blocked, b"a file, not a directory").unwrap();
    assert_eq!(decisions(&host_with_cache(Some(blocked.clone()))), first);
    assert!(blocked.is_file());

    // A different engine configuration uses other artifacts.
    let other = PolicyHost::new(HostConfig {
        cache_dir: Some(dir.clone()),
        memory_limit_bytes: 64 << 20,
        ..HostConfig::default()
    })
    .unwrap();
    assert_eq!(decisions(&other), first);
    assert_eq!(cache_files(&dir).len(), 4);
}

#[test]
fn user_components_are_checked_when_added_and_cached() {
    let dir = cache_dir("user");
    let host = host_with_cache(Some(dir.clone()));
    let bytes = plugin_file("wasi-demo-c"); // not a built-in
                                            // A broken component is refused at registration, as before.
    let mut broken = bytes.clone();
    let n = broken.len();
    broken.truncate(n - 7);
    assert!(host.add("broken", &broken).is_err());
    assert!(cache_files(&dir).is_empty());
    host.add("mine", &bytes).unwrap();
    assert_eq!(cache_files(&dir).len(), 1);
    let again = host_with_cache(Some(dir.clone()));
    again.add("mine", &bytes).unwrap();
    assert_eq!(cache_files(&dir).len(), 1);
    let mut s = again.schedule("mine", "{}", "m").unwrap();
    s.next_draft_length(&input(0, 16, &[])).unwrap();
}
