//! Per-request policy objects backed by a component instance in its own Store.
//!
//! This is the one boundary between the wit-bindgen types of each contract
//! version and the host's contract types (`specd_policy_logic`, 0.2's):
//! a 0.2 component gets every field; a 0.1 component gets the 0.1 subset
//! (the 0.2 fields are dropped here) and is never asked `continue-drafting`.

use crate::carry::{Carried, CarryKey};
use crate::metrics::Metrics;
use crate::sandbox::{
    bind_acceptance, bind_acceptance_v0_2, bind_schedule, bind_schedule_v0_2, classify, HostState,
};
use crate::{
    validate, Acceptance, Contract, Correction, Decision, DraftStep, PolicyError, PolicyErrorKind,
    Position, Schedule, ScheduleInput,
};
use std::sync::Arc;
use std::time::Instant;
use wasmtime::component::ResourceAny;
use wasmtime::Store;

use bind_acceptance::exports::specd::policy::acceptance as wa;
use bind_acceptance_v0_2::exports::specd::policy::acceptance as wa2;
use bind_schedule::exports::specd::policy::schedule as ws;
use bind_schedule_v0_2::exports::specd::policy::schedule as ws2;
use wasmtime::component::InstancePre;

/// One value per contract version (pre-instantiated bindings, instance
/// bindings): the versions' wit-bindgen types differ, the code over them is
/// one, through [`both!`].
pub(crate) enum PerVersion<A, B> {
    V0_1(A),
    V0_2(B),
}

/// `both!(x, b => expr)`: `expr` with `b` bound to whichever version `x`
/// holds; `both!(map x, b => expr)` wraps the result in that same version.
/// The arms are written once and type-checked per version (e.g. `lower()`
/// picks the version's input type there).
macro_rules! both {
    (map $x:expr, $b:ident => $e:expr) => {
        match $x {
            PerVersion::V0_1($b) => PerVersion::V0_1($e),
            PerVersion::V0_2($b) => PerVersion::V0_2($e),
        }
    };
    ($x:expr, $b:ident => $e:expr) => {
        match $x {
            PerVersion::V0_1($b) => $e,
            PerVersion::V0_2($b) => $e,
        }
    };
}

/// A compiled schedule, pre-instantiated, at its contract version.
pub(crate) type SchedulePre = PerVersion<
    bind_schedule::SchedulePolicyPre<HostState>,
    bind_schedule_v0_2::SchedulePolicyPre<HostState>,
>;
/// A compiled acceptance policy, pre-instantiated, at its contract version.
pub(crate) type AcceptancePre = PerVersion<
    bind_acceptance::AcceptancePolicyPre<HostState>,
    bind_acceptance_v0_2::AcceptancePolicyPre<HostState>,
>;
pub(crate) type ScheduleBindings =
    PerVersion<bind_schedule::SchedulePolicy, bind_schedule_v0_2::SchedulePolicy>;
pub(crate) type AcceptanceBindings =
    PerVersion<bind_acceptance::AcceptancePolicy, bind_acceptance_v0_2::AcceptancePolicy>;

impl SchedulePre {
    pub fn new(contract: Contract, pre: InstancePre<HostState>) -> wasmtime::Result<Self> {
        Ok(match contract {
            Contract::V0_1 => PerVersion::V0_1(bind_schedule::SchedulePolicyPre::new(pre)?),
            Contract::V0_2 => PerVersion::V0_2(bind_schedule_v0_2::SchedulePolicyPre::new(pre)?),
        })
    }
}

impl AcceptancePre {
    pub fn new(contract: Contract, pre: InstancePre<HostState>) -> wasmtime::Result<Self> {
        Ok(match contract {
            Contract::V0_1 => PerVersion::V0_1(bind_acceptance::AcceptancePolicyPre::new(pre)?),
            Contract::V0_2 => {
                PerVersion::V0_2(bind_acceptance_v0_2::AcceptancePolicyPre::new(pre)?)
            }
        })
    }
}

/// A fresh instance in its own Store, its resource made by `create` and
/// never called since: what a request starts from, made on the request
/// path or ahead of it (`warm.rs`).
pub(crate) struct Instance<B> {
    store: Store<HostState>,
    bindings: B,
    resource: ResourceAny,
}

/// A host contract type as one version's wit-bindgen type (for 0.1, the
/// 0.2 fields are dropped).
trait Lower<W> {
    fn lower(&self) -> W;
}

/// The schedule input in version `$w`'s types, with the fields only that
/// version has (`$extra`).
macro_rules! lower_schedule_input {
    ($w:ident $(, $extra:ident)*) => {
        impl Lower<$w::ScheduleInput> for ScheduleInput {
            fn lower(&self) -> $w::ScheduleInput {
                $w::ScheduleInput {
                    round: self.round,
                    generated: self.generated,
                    budget_left: self.budget_left,
                    max_draft: self.max_draft,
                    recent: self
                        .recent_window()
                        .iter()
                        .map(|r| $w::RoundRecord {
                            drafted: r.drafted,
                            accepted: r.accepted,
                            draft_seconds: r.draft_seconds,
                            verify_seconds: r.verify_seconds,
                        })
                        .collect(),
                    position_acceptance: self.position_acceptance.clone(),
                    draft_seconds_per_token: self.draft_seconds_per_token,
                    verify_seconds_by_len: self.verify_seconds_by_len.clone(),
                    $($extra: self.$extra,)*
                }
            }
        }
    };
}
lower_schedule_input!(ws);
lower_schedule_input!(ws2, batch_sequences, batch_rows_planned);

/// A position in version `$w`'s types (0.2 adds the draft statistics), and
/// its correction back into the host's.
macro_rules! lower_position {
    ($w:ident $(, $extra:ident)*) => {
        impl Lower<$w::Position> for Position {
            fn lower(&self) -> $w::Position {
                $w::Position {
                    token: self.token,
                    p: self.p,
                    q: self.q,
                    target_argmax: self.target_argmax,
                    entropy: self.entropy,
                    uniform: self.uniform,
                    $($extra: self.$extra,)*
                }
            }
        }

        impl From<$w::Correction> for Correction {
            fn from(c: $w::Correction) -> Correction {
                match c {
                    $w::Correction::Residual => Correction::Residual,
                    $w::Correction::TargetSample => Correction::TargetSample,
                    $w::Correction::Token(t) => Correction::Token(t),
                }
            }
        }
    };
}
lower_position!(wa);
lower_position!(wa2, draft_entropy, draft_top1, confidence);

/// What a request's instances need of the host: the engine, the limits,
/// the counters, the carried state and the instances made ahead.
pub(crate) struct Runtime {
    pub engine: wasmtime::Engine,
    pub cfg: crate::HostConfig,
    pub metrics: Metrics,
    pub carried: Carried,
    pub warm: crate::warm::WarmPool,
}

fn new_store(inner: &Runtime, policy: &str) -> Result<Store<HostState>, PolicyError> {
    let mut store = Store::new(
        &inner.engine,
        HostState::new(
            policy,
            inner.cfg.memory_limit_bytes,
            inner.cfg.log_limit_bytes,
        ),
    );
    store.limiter(|s| &mut s.limits);
    store
        .set_fuel(inner.cfg.fuel_per_call)
        .map_err(|e| PolicyError::new(policy, PolicyErrorKind::Instantiate, e.to_string()))?;
    Ok(store)
}

fn refuel(store: &mut Store<HostState>, fuel: u64) {
    // Cannot fail: fuel is enabled on the engine.
    let _ = store.set_fuel(fuel);
}

/// Instantiation errors: a trap or time-out in start code is reported as such,
/// anything else (pool exhausted, ...) as `instantiate`.
fn instantiate_error(policy: &str, store: &Store<HostState>, e: &wasmtime::Error) -> PolicyError {
    let mut err = classify(policy, "instantiating", store.data(), e);
    if err.kind == PolicyErrorKind::Trap && e.downcast_ref::<wasmtime::Trap>().is_none() {
        err.kind = PolicyErrorKind::Instantiate;
    }
    err
}

/// A fresh Store and instance for one request, its resource made by
/// `create` (the guest's constructor, under the same fuel budget as a call).
fn instantiate<B>(
    inner: &Runtime,
    name: &str,
    instantiate: impl FnOnce(&mut Store<HostState>) -> wasmtime::Result<B>,
    create: impl FnOnce(&B, &mut Store<HostState>) -> wasmtime::Result<Result<ResourceAny, String>>,
) -> Result<Instance<B>, PolicyError> {
    let mut store = new_store(inner, name)?;
    let bindings = instantiate(&mut store).map_err(|e| instantiate_error(name, &store, &e))?;
    refuel(&mut store, inner.cfg.fuel_per_call);
    let created = create(&bindings, &mut store);
    store.data_mut().flush_guest_output();
    match created {
        Ok(Ok(resource)) => Ok(Instance {
            store,
            bindings,
            resource,
        }),
        Ok(Err(msg)) => Err(PolicyError::new(name, PolicyErrorKind::Config, msg)),
        Err(e) => Err(classify(name, "create", store.data(), &e)),
    }
}

pub(crate) struct WasmSchedule {
    inner: Arc<Runtime>,
    name: String,
    store: Store<HostState>,
    bindings: ScheduleBindings,
    resource: ResourceAny,
    carry_key: CarryKey,
    failed: Option<PolicyError>,
}

/// A schedule instance for `create(config, carried)`.
pub(crate) fn make_schedule(
    inner: &Runtime,
    name: &str,
    pre: &SchedulePre,
    config: &str,
    carried: Option<&[u8]>,
) -> Result<Instance<ScheduleBindings>, PolicyError> {
    instantiate(
        inner,
        name,
        |store| Ok(both!(map pre, p => p.instantiate(store)?)),
        |b: &ScheduleBindings, store| {
            both!(b, b => b
                .specd_policy_schedule()
                .scheduler()
                .call_create(store, config, carried))
        },
    )
}

impl WasmSchedule {
    /// The request's schedule over a fresh, never-called instance.
    pub fn from_instance(
        inner: Arc<Runtime>,
        name: &str,
        instance: Instance<ScheduleBindings>,
        carry_key: CarryKey,
    ) -> Self {
        WasmSchedule {
            inner,
            name: name.to_string(),
            store: instance.store,
            bindings: instance.bindings,
            resource: instance.resource,
            carry_key,
            failed: None,
        }
    }
}

impl WasmSchedule {
    /// Counts and logs a failure; the schedule is spent from here.
    fn failed_with(&mut self, err: PolicyError) -> PolicyError {
        self.inner.metrics.failure(err.kind);
        tracing::warn!(policy = %self.name, kind = %err.kind, "{}", err.message);
        self.failed = Some(err.clone());
        err
    }
}

impl Schedule for WasmSchedule {
    fn name(&self) -> &str {
        &self.name
    }

    fn next_draft_length(&mut self, input: &ScheduleInput) -> Result<u32, PolicyError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let t = Instant::now();
        refuel(&mut self.store, self.inner.cfg.fuel_per_call);
        let out = both!(&self.bindings, b => b
            .specd_policy_schedule()
            .scheduler()
            .call_next_draft_length(&mut self.store, self.resource, &input.lower()));
        self.store.data_mut().flush_guest_output();
        self.inner.metrics.schedule_call(t.elapsed());
        let result = match out {
            Ok(k) => match validate::draft_length(&self.name, k, input) {
                Ok(k) => return Ok(k),
                Err(e) => e,
            },
            Err(e) => classify(&self.name, "next-draft-length", self.store.data(), &e),
        };
        Err(self.failed_with(result))
    }

    fn has_draft_hook(&self) -> bool {
        matches!(self.bindings, PerVersion::V0_2(_))
    }

    fn continue_drafting(&mut self, step: &DraftStep) -> Result<bool, PolicyError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let PerVersion::V0_2(b) = &self.bindings else {
            // Contract 0.1 has no hook: its schedules always draft k.
            return Ok(true);
        };
        let t = Instant::now();
        refuel(&mut self.store, self.inner.cfg.fuel_per_call);
        let wit_step = ws2::DraftStep {
            index: step.index,
            token: step.token,
            q: step.q,
            entropy: step.entropy,
            top1: step.top1,
            k: step.k,
        };
        let out = b
            .specd_policy_schedule()
            .scheduler()
            .call_continue_drafting(&mut self.store, self.resource, wit_step);
        self.store.data_mut().flush_guest_output();
        self.inner.metrics.schedule_call(t.elapsed());
        match out {
            Ok(go_on) => Ok(go_on),
            Err(e) => {
                let err = classify(&self.name, "continue-drafting", self.store.data(), &e);
                Err(self.failed_with(err))
            }
        }
    }

    fn output_dropped(&self) -> u64 {
        self.store.data().output_dropped()
    }

    fn finish(mut self: Box<Self>) {
        if self.failed.is_some() {
            return;
        }
        refuel(&mut self.store, self.inner.cfg.fuel_per_call);
        let out = both!(&self.bindings, b => b
            .specd_policy_schedule()
            .scheduler()
            .call_carry(&mut self.store, self.resource));
        self.store.data_mut().flush_guest_output();
        match out {
            Ok(bytes) => {
                self.inner.carried.store(self.carry_key.clone(), bytes);
                // Instances made ahead with the old state are stale now.
                self.inner.warm.poke();
            }
            Err(e) => {
                let err = classify(&self.name, "carry", self.store.data(), &e);
                self.inner.metrics.failure(err.kind);
                tracing::warn!(policy = %self.name, kind = %err.kind, "{} (state not carried)", err.message);
            }
        }
    }
}

pub(crate) struct WasmAcceptance {
    inner: Arc<Runtime>,
    name: String,
    store: Store<HostState>,
    bindings: AcceptanceBindings,
    resource: ResourceAny,
    vocab_size: u32,
    failed: Option<PolicyError>,
    scratch: Vec<wa::Position>,
    scratch2: Vec<wa2::Position>,
}

/// An acceptance instance for `create(config, vocab_size)`.
pub(crate) fn make_acceptance(
    inner: &Runtime,
    name: &str,
    pre: &AcceptancePre,
    config: &str,
    vocab_size: u32,
) -> Result<Instance<AcceptanceBindings>, PolicyError> {
    instantiate(
        inner,
        name,
        |store| Ok(both!(map pre, p => p.instantiate(store)?)),
        |b: &AcceptanceBindings, store| {
            both!(b, b => b
                .specd_policy_acceptance()
                .acceptor()
                .call_create(store, config, vocab_size))
        },
    )
}

impl WasmAcceptance {
    /// The request's acceptance policy over a fresh, never-called instance.
    pub fn from_instance(
        inner: Arc<Runtime>,
        name: &str,
        instance: Instance<AcceptanceBindings>,
        vocab_size: u32,
    ) -> Self {
        WasmAcceptance {
            inner,
            name: name.to_string(),
            store: instance.store,
            bindings: instance.bindings,
            resource: instance.resource,
            vocab_size,
            failed: None,
            scratch: Vec::new(),
            scratch2: Vec::new(),
        }
    }
}

impl Acceptance for WasmAcceptance {
    fn name(&self) -> &str {
        &self.name
    }

    fn output_dropped(&self) -> u64 {
        self.store.data().output_dropped()
    }

    fn decide(&mut self, positions: &[Position]) -> Result<Decision, PolicyError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if positions.is_empty() {
            return Ok(Decision {
                accepted: 0,
                correction: Correction::TargetSample,
            });
        }
        let t = Instant::now();
        refuel(&mut self.store, self.inner.cfg.fuel_per_call);
        let out = match &self.bindings {
            PerVersion::V0_1(b) => {
                self.scratch.clear();
                self.scratch
                    .extend(positions.iter().map(Lower::<wa::Position>::lower));
                b.specd_policy_acceptance()
                    .acceptor()
                    .call_decide(&mut self.store, self.resource, &self.scratch)
                    .map(|d| (d.accepted, d.correction.into()))
            }
            PerVersion::V0_2(b) => {
                self.scratch2.clear();
                self.scratch2
                    .extend(positions.iter().map(Lower::<wa2::Position>::lower));
                b.specd_policy_acceptance()
                    .acceptor()
                    .call_decide(&mut self.store, self.resource, &self.scratch2)
                    .map(|d| (d.accepted, d.correction.into()))
            }
        };
        self.store.data_mut().flush_guest_output();
        self.inner.metrics.acceptance_call(t.elapsed());
        let err = match out {
            Ok((accepted, correction)) => {
                let d = Decision {
                    accepted,
                    correction,
                };
                match validate::decision(&self.name, d, positions.len(), self.vocab_size) {
                    Ok(d) => return Ok(d),
                    Err(e) => e,
                }
            }
            Err(e) => classify(&self.name, "decide", self.store.data(), &e),
        };
        self.inner.metrics.failure(err.kind);
        tracing::warn!(policy = %self.name, kind = %err.kind, "{}", err.message);
        self.failed = Some(err.clone());
        Err(err)
    }
}
