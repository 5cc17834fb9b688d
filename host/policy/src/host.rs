//! The policy host: one wasmtime engine, the registry of policies, and the
//! per-request objects made from them.

use crate::cache::sha256_hex;
use crate::carry::{Carried, PolicyConfig};
use crate::compile::{Compiled, Compiler, Loaded};
use crate::instance::{make_acceptance, make_schedule, Runtime};
use crate::metrics::Metrics;
use crate::registry::{info_of, valid_name, NameEntry, Registry};
use crate::sandbox::{chain, HostState};
use crate::warm::{WarmKey, WarmPool};
use crate::wasm::{WasmAcceptance, WasmSchedule};
use crate::{
    Acceptance, CheckError, ConformanceConfig, ConformanceReport, HostConfig, LosslessClaim,
    MetricsSnapshot, PolicyError, PolicyErrorKind, PolicyInfo, PolicySource, RegistryError,
    RegistryQuota, Schedule, Verdict,
};
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;
use wasmtime::component::Linker;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// The policy host (see the crate docs).  `Send + Sync`; cheap to share in an `Arc`.
pub struct PolicyHost {
    rt: Arc<Runtime>,
    /// Instances made ahead of requests, beside the runtime that makes them.
    warm: Arc<WarmPool>,
    compiler: Compiler,
    registry: RwLock<Registry>,
}

/// The engine (pooling allocator, fuel) and its linker with the deny-all WASI.
fn engine(cfg: &HostConfig) -> anyhow::Result<(Engine, Linker<HostState>)> {
    let mut pool = PoolingAllocationConfig::default();
    let slots = cfg.max_instances.max(1);
    let mem = cfg.memory_limit_bytes.max(64 << 10);
    // Per component: a Rust or C policy is a few core module instances
    // with one memory; a Python policy from componentize-py 0.25 is 14
    // core module instances (CPython, libc, the runtime and wit-component's
    // shims, dynamically linked) sharing one memory (13 MB to start with:
    // the pre-initialized interpreter) and two tables.  The limits leave
    // room for bigger language runtimes; the totals let every slot hold a
    // Python policy.  Unused slots cost address space, not memory.
    pool.total_component_instances(slots)
        .total_core_instances(slots * 16)
        .total_memories(slots * 2)
        .total_tables(slots * 4)
        .total_stacks(0)
        .max_memories_per_component(4)
        .max_tables_per_component(8)
        .max_core_instances_per_component(32)
        .max_memory_size(mem)
        .table_elements(10_000)
        .max_unused_warm_slots(slots.min(16));
    if pagemap_scan_available() {
        // Reset a returned slot by restoring only the pages the guest
        // dirtied (found with the PAGEMAP_SCAN ioctl) instead of madvise:
        // the next instance takes no page faults on them.  Measured: Rust
        // policies 38 -> 10 us per instantiation, a Python one 2.5 -> 1.8 ms.
        // Without the ioctl, keep_resident would memset the whole memory
        // on every reset (slower than madvise), so it stays off.
        pool.linear_memory_keep_resident(mem)
            .table_keep_resident(1 << 20)
            .pagemap_scan(wasmtime::Enabled::Auto);
    }
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
    Ok((engine, linker))
}

/// Linux 6.7 or later (the PAGEMAP_SCAN ioctl).
fn pagemap_scan_available() -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 7)
}

impl Drop for PolicyHost {
    fn drop(&mut self) {
        // Stops the warm-up thread (it holds the runtime only while working).
        self.warm.shutdown();
    }
}

/// Whether one more user policy `name` of `size` bytes fits `q` (a policy
/// already under `name` is replaced, so it does not count).
fn check_quota(
    reg: &Registry,
    name: &str,
    size: u64,
    q: &RegistryQuota,
) -> Result<(), RegistryError> {
    let (count, bytes) = reg.user_usage(name);
    if count + 1 > q.max_policies {
        return Err(RegistryError::Quota(format!(
            "it holds {count} user policies, the most allowed ({})",
            q.max_policies
        )));
    }
    if bytes + size > q.max_bytes {
        return Err(RegistryError::Quota(format!(
            "user policies take {bytes} bytes and this one ({size} bytes) would pass the limit of {} bytes",
            q.max_bytes
        )));
    }
    Ok(())
}

impl PolicyHost {
    /// Makes the engine and registers the built-in policies.  Cheap: a
    /// built-in is compiled on first use (or loaded from the on-disk cache,
    /// [`HostConfig::cache_dir`]); its exports are read from its bytes.
    pub fn new(cfg: HostConfig) -> anyhow::Result<Self> {
        let (engine, linker) = engine(&cfg)?;
        let host = PolicyHost {
            compiler: Compiler {
                disk_cache: cfg
                    .cache_dir
                    .clone()
                    .map(|dir| crate::cache::DiskCache::new(dir, &engine)),
                engine: engine.clone(),
                linker,
                max_component_bytes: cfg.max_component_bytes,
            },
            warm: Arc::new(WarmPool::new(&cfg)),
            rt: Arc::new(Runtime {
                engine,
                carried: Carried::new(cfg.carried_state_limit_bytes),
                cfg,
                metrics: Metrics::default(),
            }),
            registry: RwLock::default(),
        };
        for (name, bytes) in crate::builtin::builtin_components() {
            let loaded = host
                .compiler
                .load_lazy(bytes)
                .map_err(|e| anyhow::anyhow!("built-in policy {name}: {e}"))?;
            let mut reg = host.write();
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

    // The registry's critical sections insert or remove whole entries: a
    // panic elsewhere cannot leave it half-updated, so a poisoned lock is
    // used as it is (one panic must not fail every later request).
    fn read(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Registry> {
        self.registry
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The limits in force.
    pub fn config(&self) -> &HostConfig {
        &self.rt.cfg
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
                .register(&name, &bytes, PolicySource::File(path.clone()), None)
                .with_context(|| format!("policy file {}", path.display()))?;
            out.push(info);
        }
        Ok(out)
    }

    /// Adds (or replaces) a user policy under `name`.
    pub fn add(&self, name: &str, bytes: &[u8]) -> Result<PolicyInfo, RegistryError> {
        self.register(name, bytes, PolicySource::Upload, None)
    }

    /// [`add`](Self::add), unless the user policies would then pass `quota`
    /// ([`RegistryError::Quota`]; the registry is left as it was).  Checked
    /// before compiling and again, atomically, when the entry goes in.
    pub fn add_within(
        &self,
        name: &str,
        bytes: &[u8],
        quota: &RegistryQuota,
    ) -> Result<PolicyInfo, RegistryError> {
        self.register(name, bytes, PolicySource::Upload, Some(quota))
    }

    fn register(
        &self,
        name: &str,
        bytes: &[u8],
        source: PolicySource,
        quota: Option<&RegistryQuota>,
    ) -> Result<PolicyInfo, RegistryError> {
        if !valid_name(name) {
            return Err(RegistryError::BadName(name.to_string()));
        }
        if self.read().names.get(name).is_some_and(|e| e.builtin) {
            return Err(RegistryError::BuiltinName(name.to_string()));
        }
        if let Some(q) = quota {
            check_quota(&self.read(), name, bytes.len() as u64, q)?;
        }
        let hash = sha256_hex(bytes);
        let known = self.read().by_hash.get(&hash).cloned();
        let loaded = self.compiler.load(bytes, known)?;
        let mut reg = self.write();
        if reg.names.get(name).is_some_and(|e| e.builtin) {
            return Err(RegistryError::BuiltinName(name.to_string()));
        }
        if let Some(q) = quota {
            check_quota(&reg, name, loaded.size as u64, q)?;
        }
        let entry = NameEntry {
            hash: hash.clone(),
            builtin: false,
            source,
        };
        let info = info_of(name, &entry, &loaded);
        let mut replaced = false;
        if let Some(old) = reg.names.insert(name.to_string(), entry) {
            if old.hash != hash {
                reg.gc(&old.hash);
                replaced = true;
            }
        }
        reg.by_hash.insert(hash, loaded);
        if replaced {
            // Instances made ahead of the replaced component go.
            let live: Vec<String> = reg.by_hash.keys().cloned().collect();
            self.warm.retain_hashes(&live);
        }
        tracing::info!(policy = name, sha256 = %info.sha256, exports = %info.exports, "policy added");
        Ok(info)
    }

    /// Adds (or replaces) a user policy under `name` from `source` (the
    /// shared store's sync), without quotas (the store counts them).
    pub fn add_from(
        &self,
        name: &str,
        bytes: &[u8],
        source: PolicySource,
    ) -> Result<PolicyInfo, RegistryError> {
        self.register(name, bytes, source, None)
    }

    /// Whether a name or hash is registered.
    pub fn has(&self, name_or_hash: &str) -> bool {
        self.lookup(name_or_hash).is_some()
    }

    /// The content hash `name` means now.
    pub fn hash_of(&self, name: &str) -> Option<String> {
        self.read().names.get(name).map(|e| e.hash.clone())
    }

    /// Registers `alias` (`NAME@sha256:HEX`) as exactly the component
    /// `HEX`: `bytes` (checked against HEX), or, without them, what `name`
    /// means now if that is HEX.
    pub fn pin(&self, alias: &str, name: &str, bytes: Option<&[u8]>) -> Result<(), RegistryError> {
        let Some((_, want)) = alias.split_once("@sha256:") else {
            return Err(RegistryError::BadName(alias.to_string()));
        };
        let want = want.to_ascii_lowercase();
        let loaded = match bytes {
            Some(b) => {
                if sha256_hex(b) != want {
                    return Err(RegistryError::NotFound(alias.to_string()));
                }
                let known = self.read().by_hash.get(&want).cloned();
                self.compiler.load(b, known)?
            }
            None => {
                let reg = self.read();
                match reg.names.get(name).filter(|e| e.hash == want) {
                    Some(e) => reg.by_hash.get(&e.hash).cloned(),
                    None => None,
                }
                .ok_or_else(|| RegistryError::NotFound(alias.to_string()))?
            }
        };
        let mut reg = self.write();
        reg.names.insert(
            alias.to_string(),
            NameEntry {
                hash: want.clone(),
                builtin: false,
                source: PolicySource::Pinned,
            },
        );
        reg.by_hash.insert(want, loaded);
        Ok(())
    }

    /// Drops the pinned versions of `name` (it was deleted).
    pub fn remove_pins(&self, name: &str) {
        let prefix = format!("{name}@sha256:");
        let mut reg = self.write();
        let pins: Vec<String> = reg
            .names
            .keys()
            .filter(|n| n.starts_with(&prefix))
            .cloned()
            .collect();
        for p in pins {
            if let Some(e) = reg.names.remove(&p) {
                reg.gc(&e.hash);
            }
        }
    }

    /// Removes a user policy by name, or every name of a content hash (or
    /// unique hash prefix of at least 8 digits).
    pub fn remove(&self, name_or_hash: &str) -> Result<(), RegistryError> {
        let mut reg = self.write();
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
        let live: Vec<String> = self.read().by_hash.keys().cloned().collect();
        self.rt.carried.retain_hashes(&live);
        self.warm.retain_hashes(&live);
        Ok(())
    }

    /// Every registered policy, by name (with conformance verdicts kept
    /// on disk from earlier runs).
    pub fn list(&self) -> Vec<PolicyInfo> {
        let loaded: Vec<Arc<Loaded>> = self.read().by_hash.values().cloned().collect();
        for l in loaded.iter().filter(|l| l.exports.acceptance) {
            self.verdict_cell(l);
        }
        self.read().infos()
    }

    /// Where verdicts of the conformance harness are kept across
    /// processes: beside the compiled-component cache,
    /// `$SPECD_HOME/policies/conformance/SHA256.vN.json` (N: the harness
    /// version).
    fn verdict_path(&self, hash: &str) -> Option<PathBuf> {
        let dir = self
            .rt
            .cfg
            .cache_dir
            .as_ref()?
            .with_file_name("conformance");
        let version = crate::conformance::HARNESS_VERSION;
        Some(dir.join(format!("{hash}.v{version}.json")))
    }

    /// The verdict slot of a component, read from disk on first use.
    fn verdict_cell<'a>(&self, l: &'a Loaded) -> &'a Mutex<Option<Verdict>> {
        l.verdict.get_or_init(|| {
            let v = self
                .verdict_path(&l.sha256)
                .and_then(|p| std::fs::read(p).ok())
                .and_then(|b| serde_json::from_slice(&b).ok());
            Mutex::new(v)
        })
    }

    /// Runs the conformance harness on an acceptance policy (a fresh
    /// instance per case, config `{}`) and keeps its verdict for the
    /// component's hash (in memory and on disk).  `claim`: a claim to test
    /// instead of the policy's own (the verdict is then reported, not
    /// kept); its own is a built-in's, and "lossless" for a user component
    /// (contract 0.1 has no way to declare one).
    pub fn conformance(
        &self,
        name_or_hash: &str,
        claim: Option<LosslessClaim>,
        cfg: &ConformanceConfig,
    ) -> Result<ConformanceReport, PolicyError> {
        let (loaded, _) = self.resolve(name_or_hash, PolicyConfig::Text("{}"), false)?;
        let builtin = self
            .read()
            .names
            .get(name_or_hash)
            .is_some_and(|e| e.builtin);
        let (claim, source) = match claim {
            Some(c) => (c, "stated"),
            None => match LosslessClaim::of_builtin(name_or_hash).filter(|_| builtin) {
                Some(c) => (c, "built-in"),
                None => (LosslessClaim::Lossless, "assumed"),
            },
        };
        let report = crate::conformance::run(
            &mut |vocab| self.acceptance(name_or_hash, "{}", vocab),
            claim,
            cfg,
        )?;
        // Only a verdict on the policy's own claim is kept: testing another
        // one (`--claim`) must not change what the server admits.
        if source == "stated" {
            return Ok(report);
        }
        let verdict = Verdict::of(&report, source);
        if let Some(path) = self.verdict_path(&loaded.sha256) {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            let written = path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|_| {
                    std::fs::write(&tmp, serde_json::to_vec(&verdict).unwrap_or_default())
                })
                .and_then(|_| std::fs::rename(&tmp, &path));
            if let Err(e) = written {
                tracing::warn!(path = %path.display(), "keeping the conformance verdict: {e}");
            }
        }
        *self
            .verdict_cell(&loaded)
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(verdict);
        Ok(report)
    }

    /// Whether an acceptance policy may serve a request under
    /// `--require-lossless`: only once the conformance harness passed on
    /// its exact hash (it is run now, once, when it never was).  `Err`
    /// says why not, for the client.
    pub fn require_lossless(&self, name_or_hash: &str, greedy_request: bool) -> Result<(), String> {
        let loaded = self
            .lookup(name_or_hash)
            .ok_or_else(|| format!("no policy {name_or_hash:?}"))?;
        let known = self
            .verdict_cell(&loaded)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let verdict = match known {
            Some(v) => v,
            None => {
                let seed = crate::conformance::random_seed();
                self.conformance(name_or_hash, None, &ConformanceConfig::new(seed))
                    .map_err(|e| format!("the conformance harness could not run it: {e}"))?;
                self.verdict_cell(&loaded)
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
                    .ok_or("the conformance harness left no verdict")?
            }
        };
        verdict.admits(greedy_request).map_err(|why| {
            format!("acceptance policy {name_or_hash:?} is not verified lossless: {why}")
        })
    }

    /// User (not built-in) policies: how many, and their component bytes
    /// together, as the registry quotas count them.
    pub fn user_usage(&self) -> (usize, u64) {
        self.read().user_usage("")
    }

    /// Validates a component without registering it (`specd policy check`).
    pub fn check(&self, bytes: &[u8]) -> Result<PolicyInfo, CheckError> {
        let hash = sha256_hex(bytes);
        let known = self.read().by_hash.get(&hash).cloned();
        let loaded = self.compiler.load(bytes, known)?;
        Ok(PolicyInfo {
            name: String::new(),
            sha256: loaded.sha256.clone(),
            exports: loaded.exports,
            builtin: false,
            source: PolicySource::Checked,
            imports_wasi: loaded.imports_wasi,
            size_bytes: loaded.size,
            conformance: None,
        })
    }

    fn lookup(&self, name_or_hash: &str) -> Option<Arc<Loaded>> {
        self.read().lookup(name_or_hash)
    }

    /// The compiled component (compiling a built-in on first use); a failure
    /// is an `instantiate` error of the request.
    fn compiled<'a>(&self, name: &str, loaded: &'a Loaded) -> Result<&'a Compiled, PolicyError> {
        loaded.compiled(&self.compiler).map_err(|e| {
            self.fail(PolicyError::new(
                name,
                PolicyErrorKind::Instantiate,
                format!("compiling the component: {e}"),
            ))
        })
    }

    fn fail(&self, err: PolicyError) -> PolicyError {
        self.rt.metrics.failure(err.kind);
        tracing::warn!(policy = %err.policy, kind = %err.kind, "{}", err.message);
        err
    }

    /// The registered component a request names, compiled, with its
    /// canonical config; `schedule` picks which interface it must export.
    fn resolve(
        &self,
        name_or_hash: &str,
        config: PolicyConfig<'_>,
        schedule: bool,
    ) -> Result<(Arc<Loaded>, String), PolicyError> {
        let err = |kind, m: String| self.fail(PolicyError::new(name_or_hash, kind, m));
        let loaded = self.lookup(name_or_hash).ok_or_else(|| {
            err(
                PolicyErrorKind::NotFound,
                "no policy by that name or hash".into(),
            )
        })?;
        let (exported, compiled) = if schedule {
            (loaded.exports.schedule, "schedule")
        } else {
            (loaded.exports.acceptance, "acceptance")
        };
        if !exported {
            return Err(err(
                PolicyErrorKind::NotFound,
                if schedule {
                    format!(
                        "the component exports no schedule ({}); it is an acceptance policy",
                        loaded.exports.contract.schedule_export()
                    )
                } else {
                    format!(
                        "the component exports no acceptance ({}); it is a schedule",
                        loaded.exports.contract.acceptance_export()
                    )
                },
            ));
        }
        let c = self.compiled(name_or_hash, &loaded)?;
        if (schedule && c.schedule.is_none()) || (!schedule && c.acceptance.is_none()) {
            return Err(err(
                PolicyErrorKind::Instantiate,
                format!("compiled without {compiled} bindings"),
            ));
        }
        let config = config
            .canonical()
            .map_err(|m| err(PolicyErrorKind::Config, m))?;
        Ok((loaded, config))
    }

    /// A schedule for one request.  `config` is the request's config (JSON
    /// text, `""` = `{}`, or a parsed `serde_json::Value`); `model_key` names
    /// the model (carried state is kept per policy, model and config).
    pub fn schedule<'c>(
        &self,
        name_or_hash: &str,
        config: impl Into<PolicyConfig<'c>>,
        model_key: &str,
    ) -> Result<Box<dyn Schedule>, PolicyError> {
        let (loaded, config) = self.resolve(name_or_hash, config.into(), true)?;
        let pre = self
            .compiled(name_or_hash, &loaded)?
            .schedule
            .as_ref()
            .expect("resolved");
        let key = (loaded.sha256.clone(), model_key.to_string(), config.clone());
        let carried = self.rt.carried.get(&key);
        let t = Instant::now();
        let wkey = WarmKey::Schedule {
            name: name_or_hash.to_string(),
            carry: key.clone(),
        };
        let instance = match self.warm.take_schedule(&self.rt, &wkey, carried.as_deref()) {
            Some(i) => i,
            None => {
                let i = self
                    .or_freeing_warm(|| {
                        make_schedule(&self.rt, name_or_hash, pre, &config, carried.as_deref())
                    })
                    .map_err(|e| self.fail(e))?;
                self.warm.note_miss(&self.rt, wkey, &loaded, t.elapsed());
                i
            }
        };
        let s = WasmSchedule::from_instance(
            self.rt.clone(),
            self.warm.clone(),
            name_or_hash,
            instance,
            key,
        );
        self.rt.metrics.instantiated(t.elapsed());
        Ok(Box::new(s))
    }

    /// An acceptance policy for one request over a vocabulary of `vocab_size` tokens.
    pub fn acceptance<'c>(
        &self,
        name_or_hash: &str,
        config: impl Into<PolicyConfig<'c>>,
        vocab_size: u32,
    ) -> Result<Box<dyn Acceptance>, PolicyError> {
        let (loaded, config) = self.resolve(name_or_hash, config.into(), false)?;
        let pre = self
            .compiled(name_or_hash, &loaded)?
            .acceptance
            .as_ref()
            .expect("resolved");
        let t = Instant::now();
        let wkey = WarmKey::Acceptance {
            name: name_or_hash.to_string(),
            sha256: loaded.sha256.clone(),
            config: config.clone(),
            vocab_size,
        };
        let instance = match self.warm.take_acceptance(&self.rt, &wkey) {
            Some(i) => i,
            None => {
                let i = self
                    .or_freeing_warm(|| {
                        make_acceptance(&self.rt, name_or_hash, pre, &config, vocab_size)
                    })
                    .map_err(|e| self.fail(e))?;
                self.warm.note_miss(&self.rt, wkey, &loaded, t.elapsed());
                i
            }
        };
        let a = WasmAcceptance::from_instance(self.rt.clone(), name_or_hash, instance, vocab_size);
        self.rt.metrics.instantiated(t.elapsed());
        Ok(Box::new(a))
    }

    /// `make`, and once more after dropping the instances made ahead when
    /// it could not instantiate (they hold allocator slots a request needs).
    fn or_freeing_warm<T>(
        &self,
        make: impl Fn() -> Result<T, PolicyError>,
    ) -> Result<T, PolicyError> {
        match make() {
            Err(e) if e.kind == PolicyErrorKind::Instantiate && self.warm.clear() => make(),
            other => other,
        }
    }

    /// Counters: calls, time in policy calls and instantiation, failures by kind.
    pub fn metrics(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            warm_ready: self.warm.ready() as u64,
            ..self.rt.metrics.snapshot()
        }
    }

    /// Carried schedule state for (policy, model, config), if any (for tests
    /// and debugging).
    pub fn carried_state<'c>(
        &self,
        name_or_hash: &str,
        model_key: &str,
        config: impl Into<PolicyConfig<'c>>,
    ) -> Option<Vec<u8>> {
        let loaded = self.lookup(name_or_hash)?;
        let config = config.into().canonical().ok()?;
        self.rt
            .carried
            .get(&(loaded.sha256.clone(), model_key.to_string(), config))
    }
}
