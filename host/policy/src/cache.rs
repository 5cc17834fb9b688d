//! Making policy startup cheap: reading a component's imports and exports
//! without compiling it, and the on-disk cache of compiled components.
//!
//! * [`inspect`] reads the top-level import and export names of a component
//!   with `wasmparser` (no validation, no compilation: microseconds).  The
//!   host uses it for the built-ins, which it compiles lazily on first use;
//!   when it compiles one, it checks that wasmtime's type information agrees.
//! * [`DiskCache`] keeps compiled components (wasmtime's `serialize` output)
//!   under `$SPECD_HOME/policies/cache/`, one file per key = sha256 of (the
//!   component's sha256, the wasmtime version, the engine's
//!   `precompile_compatibility_hash`).  Files are written atomically (a
//!   unique temporary file, then `rename`), so a reader sees a whole artifact
//!   or none; one that cannot be read or deserialized is ignored (and
//!   rewritten).  wasmtime itself also refuses an artifact made by another
//!   version or an incompatible engine configuration.

use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use wasmtime::component::Component;
use wasmtime::Engine;

/// The wasmtime version this crate was built with (from Cargo.lock, by build.rs).
pub(crate) const WASMTIME_VERSION: &str = env!("SPECD_WASMTIME_VERSION");

/// `$SPECD_HOME/policies/cache`, `SPECD_HOME` defaulting to `~/.cache/specd`.
pub(crate) fn default_cache_dir() -> Option<PathBuf> {
    Some(specd_store::home().join("policies").join("cache"))
}

pub(crate) use specd_store::{hex, sha256_hex};

/// Top-level import and export names of a component.
pub(crate) struct Inspected {
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

/// Reads the top-level import and export names without validating or
/// compiling (nested modules and components are skipped).
pub(crate) fn inspect(bytes: &[u8]) -> Result<Inspected, String> {
    use wasmparser::{Parser, Payload};
    let mut out = Inspected {
        imports: Vec::new(),
        exports: Vec::new(),
    };
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| e.to_string())? {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(r) if depth == 1 => {
                for i in r {
                    out.imports
                        .push(i.map_err(|e| e.to_string())?.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(r) if depth == 1 => {
                for e in r {
                    out.exports
                        .push(e.map_err(|e| e.to_string())?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Feeds `Hash` output into sha256 (a stable digest, unlike `DefaultHasher`).
struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn finish(&self) -> u64 {
        0
    }
}

/// The on-disk cache of compiled components for one engine.
pub(crate) struct DiskCache {
    dir: PathBuf,
    /// sha256 of (wasmtime version, engine compatibility hash), hex.
    engine_key: String,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl DiskCache {
    pub fn new(dir: PathBuf, engine: &Engine) -> Self {
        let mut h = ShaHasher(Sha256::new());
        h.write(b"specd-policy compiled component\0");
        h.write(WASMTIME_VERSION.as_bytes());
        h.write(b"\0");
        engine.precompile_compatibility_hash().hash(&mut h);
        DiskCache {
            dir,
            engine_key: hex(&h.0.finalize()),
        }
    }

    /// The cache file of a component (by its sha256).
    pub fn path(&self, component_sha256: &str) -> PathBuf {
        let mut h = Sha256::new();
        h.update(component_sha256.as_bytes());
        h.update(b"\0");
        h.update(self.engine_key.as_bytes());
        self.dir.join(format!("{}.cwasm", hex(&h.finalize())))
    }

    /// The compiled component, if a usable artifact is cached.
    pub fn load(&self, engine: &Engine, component_sha256: &str) -> Option<Component> {
        let path = self.path(component_sha256);
        if !path.is_file() {
            return None;
        }
        // SAFETY: the file is one this cache wrote (atomically, by rename)
        // from wasmtime's own `serialize` of the component whose sha256 is
        // part of the key, in a directory of the user who runs specd;
        // wasmtime checks its header, version and engine compatibility and
        // refuses anything else (then we recompile).  Files are only ever
        // replaced by rename, never modified in place, so the mapping stays
        // valid.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::debug!(path = %path.display(), "ignoring unusable compiled-policy cache file: {}", crate::sandbox::chain(&e));
                None
            }
        }
    }

    /// Stores a compiled component; failures are logged and ignored.
    pub fn store(&self, component: &Component, component_sha256: &str) {
        if let Err(e) = self.try_store(component, component_sha256) {
            tracing::debug!(dir = %self.dir.display(), "not caching a compiled policy: {e}");
        }
    }

    fn try_store(&self, component: &Component, component_sha256: &str) -> Result<(), String> {
        let bytes = component
            .serialize()
            .map_err(|e| crate::sandbox::chain(&e))?;
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        let path = self.path(component_sha256);
        let tmp = self.dir.join(format!(
            ".tmp-{}-{}-{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed),
            path.file_name().and_then(|n| n.to_str()).unwrap_or("x"),
        ));
        let written = write_synced(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map_err(|e| e.to_string())
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}
