//! specd's policy host: speculative-decoding policies as sandboxed
//! WebAssembly components.
//!
//! A *schedule* answers, each round, how many tokens to draft (0 = a plain
//! decoding step); an *acceptance* policy answers how many drafted tokens to
//! keep and what to emit after them.  Both are WebAssembly components
//! implementing the WIT package `specd:policy@0.2.0` (`wit/0.2/policy.wit` at
//! the repository root, which documents every field) or its predecessor
//! `specd:policy@0.1.0` (`wit/policy.wit`), run by wasmtime.  This crate
//! knows nothing of MLX or models: it sees plain numbers.
//!
//! # Use
//!
//! ```no_run
//! use specd_policy::*;
//! let host = PolicyHost::new(HostConfig::default())?;            // built-ins are loaded
//! host.add_dir(std::path::Path::new("my-policies"))?;           // *.wasm, named by file stem
//! let mut schedule = host.schedule("heuristic", "{}", "smollm2:135m")?;
//! let mut acceptance = host.acceptance("greedy", "{}", 49152)?;
//! let k = schedule.next_draft_length(&ScheduleInput { max_draft: 16, budget_left: 100, ..Default::default() })?;
//! // ... draft k tokens, verify them ...
//! let decision = acceptance.decide(&[Position { token: 7, p: 0.9, q: 1.0, target_argmax: 7, entropy: 0.3, uniform: 0.5, ..Default::default() }])?;
//! schedule.finish();                                             // carries heuristic's k to the next request
//! # let _ = (k, decision);
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! * One [`PolicyHost`] per process (it is `Send + Sync`; share it in an
//!   `Arc`).  It holds one wasmtime `Engine` (pooling allocator, fuel), the
//!   registry of policies (built-ins, `--policy-dir`, uploads) and, per
//!   component content hash (sha256), the compiled and pre-instantiated
//!   component.  Making it is cheap (milliseconds): a built-in is compiled
//!   on first use, its exports read from its bytes without compiling; a
//!   user component is compiled (and fully checked) when it is added.
//!   Compiled components are also cached on disk
//!   ([`HostConfig::cache_dir`], default `$SPECD_HOME/policies/cache`), so
//!   a later process deserializes instead of running Cranelift.
//! * [`PolicyHost::schedule`] / [`PolicyHost::acceptance`] make the
//!   per-request objects: each owns its own wasmtime `Store` and a fresh
//!   instance, so requests never share guest state.  Drop them at the end of
//!   the request; call [`Schedule::finish`] when it ended normally so a
//!   schedule that learns across requests (`heuristic`) keeps its state,
//!   keyed by (policy hash, model key, canonical config).
//! * Every call runs under a fuel budget ([`HostConfig::fuel_per_call`]) and
//!   the instance under a memory cap ([`HostConfig::memory_limit_bytes`]).
//!   Every answer is validated (k <= max_draft; accepted <= positions; an
//!   explicit token < vocab_size).  Any failure is a [`PolicyError`]; after one
//!   the object is spent (it returns the same error again): the engine ends
//!   speculation for that request and continues with plain decoding, reports
//!   the error (it serializes as `{policy, kind, message}`) and the next
//!   request gets a fresh instance.  Failures and call times are counted in
//!   [`PolicyHost::metrics`].
//! * Components that import WASI (C with wasi-libc, ...) get a deny-all WASI:
//!   no files, sockets, environment or arguments, empty stdin, clocks frozen at
//!   0, a fixed "random" byte stream, stdout/stderr captured (capped at
//!   [`HostConfig::log_limit_bytes`] per stream and request; past the cap
//!   output is dropped and counted, never refused, so a chatty policy keeps
//!   running: [`Schedule::output_dropped`]) and written to the log
//!   (`tracing`, target `specd_policy::guest`).  WASI calls are synchronous:
//!   call policies from a plain thread (or `spawn_blocking`), never from
//!   inside an async task.  Any non-WASI import is refused at load time, by name.
//!
//! Built-in policies (embedded; built from `plugins/` by `build.rs` through
//! `scripts/build-plugins.sh`): schedules `constant`, `heuristic`,
//! `heuristic-transient`, `throughput`, `heuristic-c` (the C twin of
//! `heuristic`), and on contract 0.2 `adaedl` and `bandit`; acceptance
//! `greedy`, `rejection`, `typical`.  Their exact
//! semantics are documented in `plugins/logic/src/lib.rs`; [`native`] has the
//! same policies as plain Rust (baselines for benchmarks).

mod builtin;
mod cache;
mod carry;
mod compile;
pub mod conformance;
mod host;
mod metrics;
/// The policies' semantics as plain Rust (shared by the components, the
/// native baselines and the host's replay).
pub use specd_policy_logic as logic;
/// The contract types, one definition shared with the built-in components.
pub use specd_policy_logic::{
    Correction, Decision, DraftStep, Position, RoundRecord, ScheduleInput, RECENT_WINDOW,
};
mod instance;
pub mod native;
mod registry;
mod sandbox;
mod store;
pub mod validate;
mod warm;
mod wasm;

pub use builtin::builtin_components;
pub use carry::PolicyConfig;
pub use conformance::{ConformanceConfig, ConformanceReport, LosslessClaim, Verdict};
pub use host::PolicyHost;
pub use metrics::MetricsSnapshot;
pub use store::{PolicyStore, StoreEntry};

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

/// Where this build put every component it built: the embedded built-ins
/// and the test fixture `wasi-demo-c`, as `NAME.wasm`.
pub const BUILT_COMPONENTS_DIR: &str = env!("SPECD_PLUGINS_OUT");

/// The newest WIT package version this host implements (it implements
/// every version of [`Contract`]).
pub const WIT_PACKAGE: &str = "specd:policy@0.2.0";
/// Export name of the schedule interface (0.2; 0.1: [`Contract::schedule_export`]).
pub const SCHEDULE_EXPORT: &str = "specd:policy/schedule@0.2.0";
/// Export name of the acceptance interface (0.2).
pub const ACCEPTANCE_EXPORT: &str = "specd:policy/acceptance@0.2.0";

/// A version of the contract a component implements.  The host serves
/// each in its own terms: a 0.1 component sees the 0.1 types (the 0.2
/// fields are dropped for it at one boundary, `wasm.rs`) and is never asked
/// `continue-drafting`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum Contract {
    /// `specd:policy@0.1.0` (`wit/policy.wit`).
    #[default]
    #[serde(rename = "0.1.0")]
    V0_1,
    /// `specd:policy@0.2.0` (`wit/0.2/policy.wit`): the per-token drafting
    /// hook, draft entropy / top-1 / confidence on positions, the batch context.
    #[serde(rename = "0.2.0")]
    V0_2,
}

impl Contract {
    /// Every version this host implements, oldest first.
    pub const ALL: [Contract; 2] = [Contract::V0_1, Contract::V0_2];
    pub fn version(self) -> &'static str {
        match self {
            Contract::V0_1 => "0.1.0",
            Contract::V0_2 => "0.2.0",
        }
    }
    pub fn schedule_export(self) -> String {
        format!("specd:policy/schedule@{}", self.version())
    }
    pub fn acceptance_export(self) -> String {
        format!("specd:policy/acceptance@{}", self.version())
    }
}

impl fmt::Display for Contract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "specd:policy@{}", self.version())
    }
}

/// Limits of the policy host.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostConfig {
    /// Fuel (roughly: WebAssembly instructions) one call may burn, including
    /// a request's instantiation and `create`.  Running out is a `timeout`.
    /// The default (20 million) is a few milliseconds of CPU; the standard
    /// policies use well under 10 thousand per call.  A Python policy
    /// (componentize-py) needs more: instantiation plus `create` take
    /// between 0.3 and 1 million (measured: 0.3 million is too little), its
    /// calls less; the default leaves a wide margin.
    pub fuel_per_call: u64,
    /// Linear memory one instance may use (bytes); growing past it is a
    /// `memory_limit` failure.  The default (32 MiB) fits a Python policy,
    /// whose memory starts at 13 MB (the pre-initialized interpreter) and
    /// runs the standard policies within 14 MiB.
    pub memory_limit_bytes: usize,
    /// Guest stdout and stderr kept per request, each (bytes); the rest is
    /// dropped and counted.
    pub log_limit_bytes: usize,
    /// Largest component accepted by `add` / `check` / `add_dir` (bytes).
    /// The default (64 MiB) fits components that embed a language runtime:
    /// a Python policy built with componentize-py is about 18 MB (CPython
    /// and its standard library).
    pub max_component_bytes: usize,
    /// Instances alive at once across all requests (pooling allocator slots;
    /// a request needs one per policy).  Past it, making a policy fails with
    /// an `instantiate` error (the server refuses the request).
    pub max_instances: u32,
    /// Largest carried schedule state kept between requests (bytes).
    pub carried_state_limit_bytes: usize,
    /// Where compiled components are cached across processes (wasmtime
    /// artifacts keyed by component sha256, wasmtime version and engine
    /// configuration; written atomically, ignored when unusable); `None`:
    /// no disk cache.  Default `$SPECD_HOME/policies/cache`, `SPECD_HOME`
    /// defaulting to `~/.cache/specd`.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// Instances made ahead of requests, ready or being made, all policies
    /// together (each holds one of the `max_instances` slots, at most an
    /// eighth of them); 0 turns making ahead off.  A background thread
    /// keeps up to [`warm_per_policy`](Self::warm_per_policy) fresh,
    /// never-used instances per (policy, config, carried state or
    /// vocabulary), already through `create`, so a request takes one in
    /// microseconds instead of instantiating (a Python or JavaScript
    /// component: milliseconds).  See docs/policies.md.
    #[serde(default = "default_warm_instances")]
    pub warm_instances: usize,
    /// Ready instances kept per key.
    #[serde(default = "default_warm_per_policy")]
    pub warm_per_policy: usize,
    /// Only policies whose instantiation + `create` takes at least this
    /// long (microseconds) are made ahead: Rust and C components take ~10
    /// us, not worth a slot.
    #[serde(default = "default_warm_threshold_us")]
    pub warm_threshold_us: u64,
}

fn default_warm_instances() -> usize {
    8
}
fn default_warm_per_policy() -> usize {
    2
}
fn default_warm_threshold_us() -> u64 {
    100
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            fuel_per_call: 20_000_000,
            memory_limit_bytes: 32 << 20,
            log_limit_bytes: 16 << 10,
            max_component_bytes: 64 << 20,
            max_instances: 256,
            carried_state_limit_bytes: 64 << 10,
            cache_dir: cache::default_cache_dir(),
            warm_instances: default_warm_instances(),
            warm_per_policy: default_warm_per_policy(),
            warm_threshold_us: default_warm_threshold_us(),
        }
    }
}

/// A per-request draft-length schedule.
pub trait Schedule: Send {
    /// The policy name it was selected by.
    fn name(&self) -> &str;
    /// k for this round (0 = plain step); validated `<= input.max_draft`.
    fn next_draft_length(&mut self, input: &ScheduleInput) -> Result<u32, PolicyError>;
    /// Whether it is asked [`continue_drafting`](Self::continue_drafting)
    /// (contract 0.2 components and native schedules; never 0.1 ones).
    fn has_draft_hook(&self) -> bool {
        false
    }
    /// After each draft token of a drafter that drafts token by token,
    /// while fewer than k are drafted: true = draft on, false = stop.  The
    /// answer has no out-of-range values to refuse (a bool); a trap or a
    /// time-out is a [`PolicyError`] like any call's.  Schedules without the
    /// hook answer true.
    fn continue_drafting(&mut self, _step: &DraftStep) -> Result<bool, PolicyError> {
        Ok(true)
    }
    /// Ends the request normally: hands carried state back to the host
    /// (schedules that learn across requests).  Dropping without `finish`
    /// carries nothing.
    fn finish(self: Box<Self>);
    /// Bytes this policy printed past its output cap so far (dropped).
    fn output_dropped(&self) -> u64 {
        0
    }
}

/// A per-request acceptance policy.
pub trait Acceptance: Send {
    /// The policy name it was selected by.
    fn name(&self) -> &str;
    /// Decides one round: one entry per drafted token, in order.  Validated:
    /// `accepted <= positions.len()`, an explicit token `< vocab_size`.
    fn decide(&mut self, positions: &[Position]) -> Result<Decision, PolicyError>;
    /// Bytes this policy printed past its output cap so far (dropped).
    fn output_dropped(&self) -> u64 {
        0
    }
}

/// Why a policy failed (the `kind` of a [`PolicyError`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyErrorKind {
    /// The guest trapped (unreachable, out-of-bounds, stack overflow, ...).
    Trap,
    /// The call ran out of fuel (the per-call CPU budget).
    Timeout,
    /// The instance tried to grow its memory past the cap.
    MemoryLimit,
    /// The answer broke the contract (k > max_draft, accepted > k, token >= vocab).
    InvalidAnswer,
    /// The component could not be instantiated (pool exhausted, start trap, ...).
    Instantiate,
    /// No policy by that name or hash, or it lacks the needed export.
    NotFound,
    /// The request's config was refused (not JSON, or the policy's `create` said no).
    Config,
}

impl PolicyErrorKind {
    pub const ALL: [PolicyErrorKind; 7] = [
        PolicyErrorKind::Trap,
        PolicyErrorKind::Timeout,
        PolicyErrorKind::MemoryLimit,
        PolicyErrorKind::InvalidAnswer,
        PolicyErrorKind::Instantiate,
        PolicyErrorKind::NotFound,
        PolicyErrorKind::Config,
    ];
    /// The snake_case name used in stats, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyErrorKind::Trap => "trap",
            PolicyErrorKind::Timeout => "timeout",
            PolicyErrorKind::MemoryLimit => "memory_limit",
            PolicyErrorKind::InvalidAnswer => "invalid_answer",
            PolicyErrorKind::Instantiate => "instantiate",
            PolicyErrorKind::NotFound => "not_found",
            PolicyErrorKind::Config => "config",
        }
    }
    pub(crate) fn index(self) -> usize {
        Self::ALL.iter().position(|k| *k == self).unwrap_or(0)
    }
}

impl fmt::Display for PolicyErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy failure: ends speculation for the request (which continues as
/// plain decoding).  Serializes as `{"policy", "kind", "message"}` — the
/// `policy_failure` of the request's stats.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyError {
    pub policy: String,
    pub kind: PolicyErrorKind,
    pub message: String,
}

impl PolicyError {
    pub fn new(
        policy: impl Into<String>,
        kind: PolicyErrorKind,
        message: impl Into<String>,
    ) -> Self {
        PolicyError {
            policy: policy.into(),
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "policy {:?} failed ({}): {}",
            self.policy, self.kind, self.message
        )
    }
}

impl std::error::Error for PolicyError {}

/// Which interfaces a component exports, and at which contract version
/// (the newest it exports; a component exports one version per interface
/// in practice).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exports {
    pub schedule: bool,
    pub acceptance: bool,
    /// The contract version of its exports.
    #[serde(default)]
    pub contract: Contract,
}

impl fmt::Display for Exports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.schedule, self.acceptance) {
            (true, true) => f.write_str("schedule, acceptance"),
            (true, false) => f.write_str("schedule"),
            (false, true) => f.write_str("acceptance"),
            (false, false) => f.write_str("-"),
        }
    }
}

/// Where a registered policy came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "path")]
pub enum PolicySource {
    /// Embedded in the binary.
    Builtin,
    /// Loaded from a file (`--policy-dir`).
    File(PathBuf),
    /// Added through [`PolicyHost::add`] (HTTP upload).
    Upload,
    /// From the policy store replicas share (`--policy-store`).
    Store,
    /// An older version a request pinned (`NAME@sha256:HEX`): runnable
    /// under that name only, not listed, not counted by quotas.
    Pinned,
    /// Only checked ([`PolicyHost::check`]), not registered.
    Checked,
}

/// A policy as `specd policy list` / `GET /api/policies` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyInfo {
    pub name: String,
    /// sha256 of the component bytes, lowercase hex: the policy's identity.
    pub sha256: String,
    pub exports: Exports,
    pub builtin: bool,
    pub source: PolicySource,
    /// The component imports WASI (runs under the deny-all WASI).
    pub imports_wasi: bool,
    pub size_bytes: usize,
    /// The conformance harness's verdict on this exact component (sha256),
    /// when it was run (`specd policy check --conformance`, or the server
    /// under `--require-lossless`); acceptance policies only.
    #[serde(default)]
    pub conformance: Option<Verdict>,
}

/// Why a component does not fit (`specd policy check`, uploads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckError {
    /// Bigger than [`HostConfig::max_component_bytes`].
    TooLarge { size: usize, limit: usize },
    /// Not WebAssembly at all.
    NotWasm,
    /// A core WebAssembly module, not a component.
    NotAComponent,
    /// wasmtime refused the bytes (invalid component, unsupported feature).
    Invalid(String),
    /// Exports specd:policy interfaces, but of another version.
    WrongVersion { found: Vec<String> },
    /// Exports neither specd:policy interface (lists what it exports).
    MissingExport { exports: Vec<String> },
    /// Imports something other than WASI.
    ForbiddenImport { name: String, detail: String },
    /// An export is there but its functions or types do not match the WIT.
    Mismatch { export: String, detail: String },
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::TooLarge { size, limit } => {
                write!(f, "component is {size} bytes, over the limit of {limit} bytes")
            }
            CheckError::NotWasm => f.write_str("not a WebAssembly binary (no \\0asm header)"),
            CheckError::NotAComponent => f.write_str(
                "a core WebAssembly module, not a component: build for wasm32-wasip2 (cargo) or wrap it with a component linker (wasm-component-ld / wasm-tools component new)",
            ),
            CheckError::Invalid(m) => write!(f, "invalid component: {m}"),
            CheckError::WrongVersion { found } => write!(
                f,
                "exports {} but this host implements specd:policy@0.1.0 and {WIT_PACKAGE} (exports specd:policy/schedule and/or specd:policy/acceptance at one of those versions); rebuild against wit/0.2/policy.wit",
                found.join(", ")
            ),
            CheckError::MissingExport { exports } => write!(
                f,
                "exports none of {} (it exports: {})",
                Contract::ALL
                    .iter()
                    .rev()
                    .flat_map(|c| [c.schedule_export(), c.acceptance_export()])
                    .collect::<Vec<_>>()
                    .join(", "),
                if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") }
            ),
            CheckError::ForbiddenImport { name, detail } => write!(
                f,
                "imports `{name}`, which specd does not provide (a policy may import only the deny-all WASI 0.2: wasi:io, wasi:clocks, wasi:random, wasi:cli, wasi:filesystem, wasi:sockets){}",
                if detail.is_empty() { String::new() } else { format!(": {detail}") }
            ),
            CheckError::Mismatch { export, detail } => {
                write!(f, "export `{export}` does not match its WIT: {detail}")
            }
        }
    }
}

impl std::error::Error for CheckError {}

/// Registry failures (`add`, `remove`): map to HTTP statuses with [`RegistryError::http_status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryError {
    /// The name belongs to a built-in policy (409).
    BuiltinName(String),
    /// A built-in cannot be removed (409).
    RemoveBuiltin(String),
    /// No such policy (404).
    NotFound(String),
    /// The name is not acceptable: 1-64 chars of `a-z 0-9 . _ -`, not 64 hex digits (400).
    BadName(String),
    /// The component does not fit (400).
    Invalid(CheckError),
    /// Adding it would pass a [`RegistryQuota`] (507); says which.
    Quota(String),
}

/// Limits on the user policies (every name that is not a built-in) that
/// [`PolicyHost::add_within`] may reach.  A replaced name counts once, at its
/// new size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegistryQuota {
    /// User policies registered at once.
    pub max_policies: usize,
    /// Their component bytes together.
    pub max_bytes: u64,
}

impl RegistryError {
    pub fn http_status(&self) -> u16 {
        match self {
            RegistryError::BuiltinName(_) | RegistryError::RemoveBuiltin(_) => 409,
            RegistryError::NotFound(_) => 404,
            RegistryError::BadName(_) | RegistryError::Invalid(_) => 400,
            RegistryError::Quota(_) => 507,
        }
    }
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryError::BuiltinName(n) => write!(f, "{n:?} is the name of a built-in policy; choose another name"),
            RegistryError::RemoveBuiltin(n) => write!(f, "{n:?} is a built-in policy and cannot be removed"),
            RegistryError::NotFound(n) => write!(f, "no policy named or hashed {n:?}"),
            RegistryError::BadName(n) => write!(
                f,
                "bad policy name {n:?}: use 1-64 characters of a-z, 0-9, '.', '_', '-' (and not a 64-digit hex hash)"
            ),
            RegistryError::Invalid(e) => write!(f, "component refused: {e}"),
            RegistryError::Quota(m) => write!(f, "the policy registry is full: {m}"),
        }
    }
}

impl std::error::Error for RegistryError {}

impl From<CheckError> for RegistryError {
    fn from(e: CheckError) -> Self {
        RegistryError::Invalid(e)
    }
}
