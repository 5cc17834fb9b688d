//! The nested plugin build (build.rs -> scripts/build-plugins.sh -> cargo)
//! runs with its own jobserver and settings: nothing of the outer build's
//! `CARGO_MAKEFLAGS` / `MAKEFLAGS` / `MFLAGS` reaches it.

#[path = "../build/nested_env.rs"]
mod nested_env;

use nested_env::drop_from_nested_build;

/// Outer-build variables the nested cargo must never see.
const OUTER_ONLY: &[&str] = &[
    "CARGO_MAKEFLAGS",
    "MAKEFLAGS",
    "MFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_TARGET",
    "CARGO_MANIFEST_DIR",
    "CARGO_PKG_NAME",
    "RUSTFLAGS",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "TARGET",
    "OUT_DIR",
    "NUM_JOBS",
];

#[test]
fn the_filter_drops_jobserver_and_build_settings_and_keeps_the_rest() {
    for name in OUTER_ONLY {
        assert!(
            drop_from_nested_build(name),
            "{name} must not reach the nested build"
        );
    }
    for name in [
        "PATH",
        "HOME",
        "CARGO_HOME",
        "CARGO_HTTP_CAINFO",
        "CARGO_NET_OFFLINE",
        "CARGO_REGISTRIES_CRATES_IO_PROTOCOL",
        "RUSTUP_HOME",
        "RUSTUP_TOOLCHAIN",
        "SSL_CERT_FILE",
    ] {
        assert!(
            !drop_from_nested_build(name),
            "{name} must reach the nested build"
        );
    }
}

#[test]
fn the_plugin_build_of_this_binary_ran_without_the_outer_jobserver() {
    if env!("SPECD_PLUGINS_BUILT_HERE") != "1" {
        // SPECD_PLUGINS_PREBUILT: no nested build ran; the filter test above
        // still checks what it would get.
        return;
    }
    let file = std::path::Path::new(env!("SPECD_PLUGINS_OUT")).join("nested-build-env.txt");
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{}: {e} (written by build-plugins.sh)", file.display()));
    let names: Vec<&str> = text.lines().collect();
    assert!(
        names.contains(&"PATH"),
        "{file:?} lists the environment: {names:?}"
    );
    for name in OUTER_ONLY {
        assert!(!names.contains(name), "the nested build saw {name}");
    }
}
