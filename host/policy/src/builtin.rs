//! The built-in policy components, embedded at build time (see build.rs).

include!(concat!(env!("OUT_DIR"), "/builtins.rs"));

/// The embedded built-in components: (name, component bytes).
pub fn builtin_components() -> &'static [(&'static str, &'static [u8])] {
    BUILTINS
}
