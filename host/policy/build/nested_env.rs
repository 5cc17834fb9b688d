//! Which variables of the outer build the nested plugin build must not see.
//! Shared by `build.rs` and a test (`tests/build_env.rs`).
//!
//! The nested cargo gets its own settings and its own jobserver: the outer
//! build's target dir, target, flags and wrappers (clippy-driver) would build
//! the plugins wrongly, and the outer jobserver's file descriptors (named by
//! `CARGO_MAKEFLAGS`, `MAKEFLAGS`, `MFLAGS`) may not be valid pipes in the
//! child: cargo then fails with "failed to acquire jobserver token", once in
//! a while.  Cargo's own network and registry settings stay.

/// True when `name` must be removed from the nested build's environment.
pub fn drop_from_nested_build(name: &str) -> bool {
    const KEEP_CARGO: &[&str] = &[
        "CARGO_HOME",
        "CARGO_HTTP_",
        "CARGO_NET_",
        "CARGO_REGISTRIES_",
        "CARGO_REGISTRY_",
    ];
    if name.starts_with("CARGO_") {
        return !KEEP_CARGO
            .iter()
            .any(|k| name == *k || (k.ends_with('_') && name.starts_with(k)));
    }
    matches!(
        name,
        "MAKEFLAGS"
            | "MFLAGS"
            | "MAKELEVEL"
            | "RUSTFLAGS"
            | "RUSTDOCFLAGS"
            | "RUSTC"
            | "RUSTDOC"
            | "RUSTC_WRAPPER"
            | "RUSTC_WORKSPACE_WRAPPER"
            | "TARGET"
            | "HOST"
            | "OUT_DIR"
            | "OPT_LEVEL"
            | "PROFILE"
            | "DEBUG"
            | "NUM_JOBS"
            | "RUSTC_LINKER"
    )
}
