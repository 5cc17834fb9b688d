//! The policy host: engine, registry, component cache, carried state.

use crate::cache::{inspect, sha256_hex, DiskCache};
use crate::metrics::Metrics;
use crate::sandbox::{bind_acceptance, bind_schedule, chain, HostState};
use crate::wasm::{WasmAcceptance, WasmSchedule};
use crate::{
    Acceptance, CheckError, Exports, HostConfig, MetricsSnapshot, PolicyError, PolicyErrorKind,
    PolicyInfo, PolicySource, RegistryError, Schedule, ACCEPTANCE_EXPORT, SCHEDULE_EXPORT,
};
use anyhow::Context as _;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// The policy host (see the crate docs).  `Send + Sync`; cheap to share in an `Arc`.
pub struct PolicyHost {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub engine: Engine,
    linker: Linker<HostState>,
    pub cfg: HostConfig,
    registry: RwLock<Registry>,
    /// Carried schedule state: (policy sha256, model key, canonical config) -> bytes.
    carried: Mutex<HashMap<(String, String, String), Vec<u8>>>,
    pub metrics: Metrics,
    /// Compiled components on disk (`HostConfig::cache_dir`).
    disk_cache: Option<DiskCache>,
}

#[derive(Default)]
struct Registry {
    by_hash: HashMap<String, Arc<Loaded>>,
    names: BTreeMap<String, NameEntry>,
}

#[derive(Clone)]
struct NameEntry {
    hash: String,
    builtin: bool,
    source: PolicySource,
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
}

/// Pre-instantiated bindings of a compiled component.
pub(crate) struct Compiled {
    pub schedule: Option<bind_schedule::SchedulePolicyPre<HostState>>,
    pub acceptance: Option<bind_acceptance::AcceptancePolicyPre<HostState>>,
}

impl Loaded {
    /// The compiled component, compiling it now if it is not yet (once;
    /// concurrent callers wait for the first).
    fn compiled(&self, inner: &Inner) -> Result<&Compiled, CheckError> {
        self.compiled
            .get_or_init(|| {
                let Some(bytes) = self.lazy_bytes else {
                    return Err(CheckError::Invalid("component was never compiled".into()));
                };
                let (exports, imports_wasi, compiled) = inner.compile(bytes, &self.sha256)?;
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

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
        && !(name.len() == 64 && name.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Canonical form of a JSON config (sorted keys, no spaces); `""` means `{}`.
pub(crate) fn canonical_config(config: &str) -> Result<String, String> {
    if config.trim().is_empty() {
        return Ok("{}".into());
    }
    let v: serde_json::Value =
        serde_json::from_str(config).map_err(|e| format!("config is not JSON: {e}"))?;
    Ok(v.to_string())
}

impl PolicyHost {
    /// Makes the engine and registers the built-in policies.  Cheap: a
    /// built-in is compiled on first use (or loaded from the on-disk cache,
    /// [`HostConfig::cache_dir`]); its exports are read from its bytes.
    pub fn new(cfg: HostConfig) -> anyhow::Result<Self> {
        let mut pool = PoolingAllocationConfig::default();
        let slots = cfg.max_instances.max(1);
        let mem = cfg.memory_limit_bytes.max(64 << 10);
        pool.total_component_instances(slots)
            .total_core_instances(slots * 2)
            .total_memories(slots * 2)
            .total_tables(slots * 2)
            .total_stacks(0)
            .max_memories_per_component(2)
            .max_tables_per_component(2)
            .max_core_instances_per_component(8)
            .max_memory_size(mem)
            .table_elements(10_000)
            .max_unused_warm_slots(slots.min(16));
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .consume_fuel(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
            // A policy needs little address space: reserve 2x the cap per
            // memory instead of wasmtime's 4 GiB, so many hosts (tests) and
            // many slots stay cheap in virtual memory.
            .memory_reservation((mem as u64 * 2).next_power_of_two())
            .memory_guard_size(64 << 10)
            .memory_reservation_for_growth(0)
            .max_wasm_stack(512 << 10);
        let engine = Engine::new(&config)
            .map_err(|e| anyhow::anyhow!("making the wasmtime engine: {}", chain(&e)))?;
        let mut linker = Linker::<HostState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| anyhow::anyhow!("adding deny-all WASI: {}", chain(&e)))?;
        crate::sandbox::freeze_sleeps(&mut linker)
            .map_err(|e| anyhow::anyhow!("adding deny-all WASI: {}", chain(&e)))?;
        let disk_cache = cfg
            .cache_dir
            .clone()
            .map(|dir| DiskCache::new(dir, &engine));
        let host = PolicyHost {
            inner: Arc::new(Inner {
                engine,
                linker,
                cfg,
                registry: RwLock::new(Registry::default()),
                carried: Mutex::new(HashMap::new()),
                metrics: Metrics::default(),
                disk_cache,
            }),
        };
        for (name, bytes) in crate::builtin::builtin_components() {
            let loaded = host
                .inner
                .load_lazy(bytes)
                .map_err(|e| anyhow::anyhow!("built-in policy {name}: {e}"))?;
            let mut reg = host.inner.registry.write().unwrap();
            reg.names.insert(
                name.to_string(),
                NameEntry {
                    hash: loaded.sha256.clone(),
                    builtin: true,
                    source: PolicySource::Builtin,
                },
            );
            reg.by_hash.insert(loaded.sha256.clone(), loaded);
        }
        Ok(host)
    }

    /// The limits in force.
    pub fn config(&self) -> &HostConfig {
        &self.inner.cfg
    }

    /// Adds every `*.wasm` in `dir` (not recursive), each named by its file
    /// stem.  Fails on the first file that does not fit (with its path).
    pub fn add_dir(&self, dir: &Path) -> anyhow::Result<Vec<PolicyInfo>> {
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .with_context(|| format!("reading policy directory {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "wasm") && p.is_file())
            .collect();
        paths.sort();
        let mut out = Vec::new();
        for path in paths {
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            let info = self
                .register(&name, &bytes, PolicySource::File(path.clone()))
                .with_context(|| format!("policy file {}", path.display()))?;
            out.push(info);
        }
        Ok(out)
    }

    /// Adds (or replaces) a user policy under `name`.
    pub fn add(&self, name: &str, bytes: &[u8]) -> Result<PolicyInfo, RegistryError> {
        self.register(name, bytes, PolicySource::Upload)
    }

    fn register(
        &self,
        name: &str,
        bytes: &[u8],
        source: PolicySource,
    ) -> Result<PolicyInfo, RegistryError> {
        if !valid_name(name) {
            return Err(RegistryError::BadName(name.to_string()));
        }
        if self
            .inner
            .registry
            .read()
            .unwrap()
            .names
            .get(name)
            .is_some_and(|e| e.builtin)
        {
            return Err(RegistryError::BuiltinName(name.to_string()));
        }
        let hash = sha256_hex(bytes);
        let cached = self
            .inner
            .registry
            .read()
            .unwrap()
            .by_hash
            .get(&hash)
            .cloned();
        let loaded = match cached {
            Some(l) => l,
            None => self.inner.load(bytes)?,
        };
        let mut reg = self.inner.registry.write().unwrap();
        if reg.names.get(name).is_some_and(|e| e.builtin) {
            return Err(RegistryError::BuiltinName(name.to_string()));
        }
        let entry = NameEntry {
            hash: hash.clone(),
            builtin: false,
            source,
        };
        let info = info_of(name, &entry, &loaded);
        if let Some(old) = reg.names.insert(name.to_string(), entry) {
            if old.hash != hash {
                reg.gc(&old.hash);
            }
        }
        reg.by_hash.insert(hash, loaded);
        tracing::info!(policy = name, sha256 = %info.sha256, exports = %info.exports, "policy added");
        Ok(info)
    }

    /// Removes a user policy by name, or every name of a content hash (or
    /// unique hash prefix of at least 8 digits).
    pub fn remove(&self, name_or_hash: &str) -> Result<(), RegistryError> {
        let mut reg = self.inner.registry.write().unwrap();
        let names: Vec<String> = if reg.names.contains_key(name_or_hash) {
            vec![name_or_hash.to_string()]
        } else {
            let hash = reg
                .resolve_hash(name_or_hash)
                .ok_or_else(|| RegistryError::NotFound(name_or_hash.to_string()))?;
            reg.names
                .iter()
                .filter(|(_, e)| e.hash == hash)
                .map(|(n, _)| n.clone())
                .collect()
        };
        if names.is_empty() {
            return Err(RegistryError::NotFound(name_or_hash.to_string()));
        }
        if let Some(n) = names.iter().find(|n| reg.names[*n].builtin) {
            return Err(RegistryError::RemoveBuiltin(n.clone()));
        }
        for n in names {
            if let Some(e) = reg.names.remove(&n) {
                reg.gc(&e.hash);
                tracing::info!(policy = %n, sha256 = %e.hash, "policy removed");
            }
        }
        drop(reg);
        let live: Vec<String> = self
            .inner
            .registry
            .read()
            .unwrap()
            .by_hash
            .keys()
            .cloned()
            .collect();
        self.inner
            .carried
            .lock()
            .unwrap()
            .retain(|(h, _, _), _| live.contains(h));
        Ok(())
    }

    /// Every registered policy, by name.
    pub fn list(&self) -> Vec<PolicyInfo> {
        let reg = self.inner.registry.read().unwrap();
        reg.names
            .iter()
            .filter_map(|(n, e)| reg.by_hash.get(&e.hash).map(|l| info_of(n, e, l)))
            .collect()
    }

    /// Validates a component without registering it (`specd policy check`).
    pub fn check(&self, bytes: &[u8]) -> Result<PolicyInfo, CheckError> {
        let loaded = self.inner.load(bytes)?;
        Ok(PolicyInfo {
            name: String::new(),
            sha256: loaded.sha256.clone(),
            exports: loaded.exports,
            builtin: false,
            source: PolicySource::Checked,
            imports_wasi: loaded.imports_wasi,
            size_bytes: loaded.size,
        })
    }

    fn lookup(&self, name_or_hash: &str) -> Option<Arc<Loaded>> {
        let reg = self.inner.registry.read().unwrap();
        let hash = match reg.names.get(name_or_hash) {
            Some(e) => e.hash.clone(),
            None => reg.resolve_hash(name_or_hash)?,
        };
        reg.by_hash.get(&hash).cloned()
    }

    /// The compiled component (compiling a built-in on first use); a failure
    /// is an `instantiate` error of the request.
    fn compiled<'a>(&self, name: &str, loaded: &'a Loaded) -> Result<&'a Compiled, PolicyError> {
        loaded.compiled(&self.inner).map_err(|e| {
            self.fail(PolicyError::new(
                name,
                PolicyErrorKind::Instantiate,
                format!("compiling the component: {e}"),
            ))
        })
    }

    fn fail(&self, err: PolicyError) -> PolicyError {
        self.inner.metrics.failure(err.kind);
        tracing::warn!(policy = %err.policy, kind = %err.kind, "{}", err.message);
        err
    }

    /// A schedule for one request.  `config_json` is the request's config
    /// (`""` = `{}`); `model_key` names the model (carried state is kept per
    /// policy, model and config).
    pub fn schedule(
        &self,
        name_or_hash: &str,
        config_json: &str,
        model_key: &str,
    ) -> Result<Box<dyn Schedule>, PolicyError> {
        let loaded = self.lookup(name_or_hash).ok_or_else(|| {
            self.fail(PolicyError::new(
                name_or_hash,
                PolicyErrorKind::NotFound,
                "no policy by that name or hash",
            ))
        })?;
        if !loaded.exports.schedule {
            return Err(self.fail(PolicyError::new(
                name_or_hash,
                PolicyErrorKind::NotFound,
                format!("the component exports no schedule ({SCHEDULE_EXPORT}); it is an acceptance policy"),
            )));
        }
        let Some(pre) = self.compiled(name_or_hash, &loaded)?.schedule.clone() else {
            return Err(self.fail(PolicyError::new(
                name_or_hash,
                PolicyErrorKind::Instantiate,
                "compiled without schedule bindings",
            )));
        };
        let config = canonical_config(config_json)
            .map_err(|m| self.fail(PolicyError::new(name_or_hash, PolicyErrorKind::Config, m)))?;
        let key = (loaded.sha256.clone(), model_key.to_string(), config.clone());
        let carried = self.inner.carried.lock().unwrap().get(&key).cloned();
        let t = Instant::now();
        let s = WasmSchedule::new(
            self.inner.clone(),
            name_or_hash,
            &pre,
            &config,
            carried,
            key,
        )
        .map_err(|e| self.fail(e))?;
        self.inner.metrics.instantiated(t.elapsed());
        Ok(Box::new(s))
    }

    /// An acceptance policy for one request over a vocabulary of `vocab_size` tokens.
    pub fn acceptance(
        &self,
        name_or_hash: &str,
        config_json: &str,
        vocab_size: u32,
    ) -> Result<Box<dyn Acceptance>, PolicyError> {
        let loaded = self.lookup(name_or_hash).ok_or_else(|| {
            self.fail(PolicyError::new(
                name_or_hash,
                PolicyErrorKind::NotFound,
                "no policy by that name or hash",
            ))
        })?;
        if !loaded.exports.acceptance {
            return Err(self.fail(PolicyError::new(
                name_or_hash,
                PolicyErrorKind::NotFound,
                format!(
                    "the component exports no acceptance ({ACCEPTANCE_EXPORT}); it is a schedule"
                ),
            )));
        }
        let Some(pre) = self.compiled(name_or_hash, &loaded)?.acceptance.clone() else {
            return Err(self.fail(PolicyError::new(
                name_or_hash,
                PolicyErrorKind::Instantiate,
                "compiled without acceptance bindings",
            )));
        };
        let config = canonical_config(config_json)
            .map_err(|m| self.fail(PolicyError::new(name_or_hash, PolicyErrorKind::Config, m)))?;
        let t = Instant::now();
        let a = WasmAcceptance::new(self.inner.clone(), name_or_hash, &pre, &config, vocab_size)
            .map_err(|e| self.fail(e))?;
        self.inner.metrics.instantiated(t.elapsed());
        Ok(Box::new(a))
    }

    /// Counters: calls, time in policy calls and instantiation, failures by kind.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// Carried schedule state for (policy, model, config), if any (for tests
    /// and debugging).
    pub fn carried_state(
        &self,
        name_or_hash: &str,
        model_key: &str,
        config_json: &str,
    ) -> Option<Vec<u8>> {
        let loaded = self.lookup(name_or_hash)?;
        let config = canonical_config(config_json).ok()?;
        self.inner
            .carried
            .lock()
            .unwrap()
            .get(&(loaded.sha256.clone(), model_key.to_string(), config))
            .cloned()
    }
}

impl Inner {
    /// Size and header checks common to every way in.
    fn check_header(&self, bytes: &[u8]) -> Result<(), CheckError> {
        let limit = self.cfg.max_component_bytes;
        if bytes.len() > limit {
            return Err(CheckError::TooLarge {
                size: bytes.len(),
                limit,
            });
        }
        if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
            return Err(CheckError::NotWasm);
        }
        // Core modules have layer 0 (version 1), components layer 1.
        if bytes[6..8] == [0, 0] {
            return Err(CheckError::NotAComponent);
        }
        Ok(())
    }

    /// Registers a built-in without compiling it: its imports and exports
    /// are read from its bytes and checked; it is compiled on first use.
    fn load_lazy(&self, bytes: &'static [u8]) -> Result<Arc<Loaded>, CheckError> {
        self.check_header(bytes)?;
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
        }))
    }

    /// Compiles (or takes from the caches) and pre-instantiates a component,
    /// checking it against the WIT.
    fn load(&self, bytes: &[u8]) -> Result<Arc<Loaded>, CheckError> {
        self.check_header(bytes)?;
        let hash = sha256_hex(bytes);
        let known = self.registry.read().unwrap().by_hash.get(&hash).cloned();
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
        let schedule = if exports.schedule {
            Some(
                bind_schedule::SchedulePolicyPre::new(pre.clone()).map_err(|e| {
                    CheckError::Mismatch {
                        export: SCHEDULE_EXPORT.into(),
                        detail: chain(&e),
                    }
                })?,
            )
        } else {
            None
        };
        let acceptance = if exports.acceptance {
            Some(bind_acceptance::AcceptancePolicyPre::new(pre).map_err(|e| {
                CheckError::Mismatch {
                    export: ACCEPTANCE_EXPORT.into(),
                    detail: chain(&e),
                }
            })?)
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

    /// Stores (or clears) carried state at the end of a request.
    pub fn store_carried(&self, key: (String, String, String), bytes: Option<Vec<u8>>) {
        let mut map = self.carried.lock().unwrap();
        match bytes {
            Some(b) if b.len() <= self.cfg.carried_state_limit_bytes => {
                map.insert(key, b);
            }
            Some(b) => {
                tracing::warn!(sha256 = %key.0, len = b.len(), "carried state over the cap; dropped");
                map.remove(&key);
            }
            None => {
                map.remove(&key);
            }
        }
    }
}

impl Registry {
    fn resolve_hash(&self, s: &str) -> Option<String> {
        let s = s.strip_prefix("sha256:").unwrap_or(s);
        if s.len() < 8 || !s.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let s = s.to_ascii_lowercase();
        let mut found = self.by_hash.keys().filter(|h| h.starts_with(&s));
        let first = found.next()?;
        if found.next().is_some() {
            return None;
        }
        Some(first.clone())
    }

    /// Drops a compiled component no name refers to any more.
    fn gc(&mut self, hash: &str) {
        if !self.names.values().any(|e| e.hash == hash) {
            self.by_hash.remove(hash);
        }
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
    let exports = Exports {
        schedule: export_names.iter().any(|n| n == SCHEDULE_EXPORT),
        acceptance: export_names.iter().any(|n| n == ACCEPTANCE_EXPORT),
    };
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

fn info_of(name: &str, e: &NameEntry, l: &Loaded) -> PolicyInfo {
    PolicyInfo {
        name: name.to_string(),
        sha256: l.sha256.clone(),
        exports: l.exports,
        builtin: e.builtin,
        source: e.source.clone(),
        imports_wasi: l.imports_wasi,
        size_bytes: l.size,
    }
}
