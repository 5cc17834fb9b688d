//! From component bytes to pre-instantiated bindings: size and header
//! checks, the import and export rules, compilation (or the disk cache) and
//! the typed bindings of each contract world.

use crate::cache::{inspect, sha256_hex, DiskCache};
use crate::instance::{AcceptancePre, SchedulePre};
use crate::sandbox::{chain, HostState};
use crate::{CheckError, Contract, Exports};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use wasmtime::component::{Component, Linker};
use wasmtime::Engine;

/// Compiles components for one engine and linker (the deny-all WASI).
pub(crate) struct Compiler {
    pub engine: Engine,
    pub linker: Linker<HostState>,
    pub max_component_bytes: usize,
    /// Compiled components on disk (`HostConfig::cache_dir`).
    pub disk_cache: Option<DiskCache>,
}

/// A registered component: its metadata, and the compiled, pre-instantiated
/// component, made on first use for the built-ins (their metadata comes from
/// [`inspect`]) and at registration for everything else.
pub(crate) struct Loaded {
    pub sha256: String,
    pub exports: Exports,
    pub imports_wasi: bool,
    pub size: usize,
    /// The bytes of a component compiled lazily (the embedded built-ins).
    lazy_bytes: Option<&'static [u8]>,
    compiled: OnceLock<Result<Compiled, CheckError>>,
    /// The conformance harness's verdict on this hash (read from disk on
    /// first use; `None` inside: not run yet).
    pub verdict: OnceLock<Mutex<Option<crate::Verdict>>>,
}

/// Pre-instantiated bindings of a compiled component (at its contract version).
pub(crate) struct Compiled {
    pub schedule: Option<SchedulePre>,
    pub acceptance: Option<AcceptancePre>,
}

impl Loaded {
    /// The compiled component if it is compiled already (and compiled fine).
    pub fn ready(&self) -> Option<&Compiled> {
        self.compiled.get()?.as_ref().ok()
    }

    /// The compiled component, compiling it now if it is not yet (once;
    /// concurrent callers wait for the first).
    pub fn compiled(&self, compiler: &Compiler) -> Result<&Compiled, CheckError> {
        self.compiled
            .get_or_init(|| {
                let Some(bytes) = self.lazy_bytes else {
                    return Err(CheckError::Invalid("component was never compiled".into()));
                };
                let (exports, imports_wasi, compiled) = compiler.compile(bytes, &self.sha256)?;
                if exports != self.exports || imports_wasi != self.imports_wasi {
                    return Err(CheckError::Invalid(format!(
                        "its type information (exports {exports}, imports WASI {imports_wasi}) disagrees with what was read from its bytes (exports {}, imports WASI {})",
                        self.exports, self.imports_wasi
                    )));
                }
                Ok(compiled)
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// The WASI 0.2 interfaces the deny-all WASI provides (anything else is refused).
const DENY_ALL_WASI: [&str; 6] = [
    "wasi:io/",
    "wasi:clocks/",
    "wasi:random/",
    "wasi:cli/",
    "wasi:filesystem/",
    "wasi:sockets/",
];

/// A component's header: WebAssembly, and a component rather than a core module.
fn check_magic(bytes: &[u8]) -> Result<(), CheckError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(CheckError::NotWasm);
    }
    // Core modules have layer 0 (version 1), components layer 1.
    if bytes[6..8] == [0, 0] {
        return Err(CheckError::NotAComponent);
    }
    Ok(())
}

impl Compiler {
    /// Size and header checks common to every way in (but the built-ins).
    fn check_header(&self, bytes: &[u8]) -> Result<(), CheckError> {
        let limit = self.max_component_bytes;
        if bytes.len() > limit {
            return Err(CheckError::TooLarge {
                size: bytes.len(),
                limit,
            });
        }
        check_magic(bytes)
    }

    /// Registers a built-in without compiling it: its imports and exports
    /// are read from its bytes and checked; it is compiled on first use.
    /// The size cap is for user components: an operator's small cap must
    /// not refuse the embedded built-ins (and keep the server from starting).
    pub fn load_lazy(&self, bytes: &'static [u8]) -> Result<Arc<Loaded>, CheckError> {
        check_magic(bytes)?;
        let found = inspect(bytes).map_err(CheckError::Invalid)?;
        let (exports, imports_wasi) =
            check_imports_exports(found.imports.iter().map(String::as_str), found.exports)?;
        Ok(Arc::new(Loaded {
            sha256: sha256_hex(bytes),
            exports,
            imports_wasi,
            size: bytes.len(),
            lazy_bytes: Some(bytes),
            compiled: OnceLock::new(),
            verdict: OnceLock::new(),
        }))
    }

    /// Compiles (or takes from the caches) and pre-instantiates a component,
    /// checking it against the WIT.  `known` is the registered component of
    /// the same hash, if any (compiled already, or now).
    pub fn load(
        &self,
        bytes: &[u8],
        known: Option<Arc<Loaded>>,
    ) -> Result<Arc<Loaded>, CheckError> {
        self.check_header(bytes)?;
        let hash = sha256_hex(bytes);
        if let Some(l) = known {
            l.compiled(self)?;
            return Ok(l);
        }
        let (exports, imports_wasi, compiled) = self.compile(bytes, &hash)?;
        Ok(Arc::new(Loaded {
            sha256: hash,
            exports,
            imports_wasi,
            size: bytes.len(),
            lazy_bytes: None,
            compiled: OnceLock::from(Ok(compiled)),
            verdict: OnceLock::new(),
        }))
    }

    /// The wasmtime component: from the disk cache, else compiled with
    /// Cranelift (and then cached).
    fn component(&self, bytes: &[u8], hash: &str) -> Result<Component, CheckError> {
        let t = Instant::now();
        if let Some(c) = self
            .disk_cache
            .as_ref()
            .and_then(|d| d.load(&self.engine, hash))
        {
            tracing::debug!(
                sha256 = hash,
                ms = t.elapsed().as_secs_f64() * 1e3,
                "policy component loaded from the disk cache"
            );
            return Ok(c);
        }
        let c = Component::new(&self.engine, bytes).map_err(|e| CheckError::Invalid(chain(&e)))?;
        tracing::debug!(
            sha256 = hash,
            ms = t.elapsed().as_secs_f64() * 1e3,
            "policy component compiled"
        );
        if let Some(d) = &self.disk_cache {
            d.store(&c, hash);
        }
        Ok(c)
    }

    fn compile(&self, bytes: &[u8], hash: &str) -> Result<(Exports, bool, Compiled), CheckError> {
        let engine = &self.engine;
        let component = self.component(bytes, hash)?;
        let ty = component.component_type();
        let (exports, imports_wasi) = check_imports_exports(
            ty.imports(engine).map(|(n, _)| n),
            ty.exports(engine).map(|(n, _)| n.to_string()).collect(),
        )?;
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            let detail = chain(&e);
            // Name the import wasmtime could not satisfy (e.g. wasi:http).
            let name = detail
                .split('`')
                .nth(1)
                .map(str::to_string)
                .unwrap_or_else(|| "an import".to_string());
            CheckError::ForbiddenImport { name, detail }
        })?;
        let contract = exports.contract;
        let schedule = if exports.schedule {
            Some(
                SchedulePre::new(contract, pre.clone()).map_err(|e| CheckError::Mismatch {
                    export: contract.schedule_export(),
                    detail: chain(&e),
                })?,
            )
        } else {
            None
        };
        let acceptance = if exports.acceptance {
            Some(
                AcceptancePre::new(contract, pre).map_err(|e| CheckError::Mismatch {
                    export: contract.acceptance_export(),
                    detail: chain(&e),
                })?,
            )
        } else {
            None
        };
        Ok((
            exports,
            imports_wasi,
            Compiled {
                schedule,
                acceptance,
            },
        ))
    }
}

/// Which interfaces a component exports and whether it imports WASI, from
/// its top-level import and export names; refuses what does not fit.
fn check_imports_exports<'a>(
    imports: impl Iterator<Item = &'a str>,
    export_names: Vec<String>,
) -> Result<(Exports, bool), CheckError> {
    let mut imports_wasi = false;
    for name in imports {
        if DENY_ALL_WASI.iter().any(|p| name.starts_with(p)) && name.contains("@0.2.") {
            imports_wasi = true;
        } else {
            return Err(CheckError::ForbiddenImport {
                name: name.to_string(),
                detail: String::new(),
            });
        }
    }
    // The newest contract version it exports anything of.
    let exports = Contract::ALL
        .iter()
        .rev()
        .map(|&contract| Exports {
            schedule: export_names
                .iter()
                .any(|n| *n == contract.schedule_export()),
            acceptance: export_names
                .iter()
                .any(|n| *n == contract.acceptance_export()),
            contract,
        })
        .find(|e| e.schedule || e.acceptance)
        .unwrap_or_default();
    if !exports.schedule && !exports.acceptance {
        let other: Vec<String> = export_names
            .iter()
            .filter(|n| {
                n.starts_with("specd:policy/schedule@") || n.starts_with("specd:policy/acceptance@")
            })
            .cloned()
            .collect();
        if !other.is_empty() {
            return Err(CheckError::WrongVersion { found: other });
        }
        return Err(CheckError::MissingExport {
            exports: export_names,
        });
    }
    Ok((exports, imports_wasi))
}
