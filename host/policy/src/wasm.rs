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

/// A compiled schedule, pre-instantiated, at its contract version.
pub(crate) enum SchedulePre {
    V0_1(bind_schedule::SchedulePolicyPre<HostState>),
    V0_2(bind_schedule_v0_2::SchedulePolicyPre<HostState>),
}

impl SchedulePre {
    pub fn new(contract: Contract, pre: InstancePre<HostState>) -> wasmtime::Result<Self> {
        Ok(match contract {
            Contract::V0_1 => SchedulePre::V0_1(bind_schedule::SchedulePolicyPre::new(pre)?),
            Contract::V0_2 => SchedulePre::V0_2(bind_schedule_v0_2::SchedulePolicyPre::new(pre)?),
        })
    }
}

/// A compiled acceptance policy, pre-instantiated, at its contract version.
pub(crate) enum AcceptancePre {
    V0_1(bind_acceptance::AcceptancePolicyPre<HostState>),
    V0_2(bind_acceptance_v0_2::AcceptancePolicyPre<HostState>),
}

impl AcceptancePre {
    pub fn new(contract: Contract, pre: InstancePre<HostState>) -> wasmtime::Result<Self> {
        Ok(match contract {
            Contract::V0_1 => AcceptancePre::V0_1(bind_acceptance::AcceptancePolicyPre::new(pre)?),
            Contract::V0_2 => {
                AcceptancePre::V0_2(bind_acceptance_v0_2::AcceptancePolicyPre::new(pre)?)
            }
        })
    }
}

pub(crate) enum ScheduleBindings {
    V0_1(bind_schedule::SchedulePolicy),
    V0_2(bind_schedule_v0_2::SchedulePolicy),
}

pub(crate) enum AcceptanceBindings {
    V0_1(bind_acceptance::AcceptancePolicy),
    V0_2(bind_acceptance_v0_2::AcceptancePolicy),
}

/// A fresh instance in its own Store, its resource made by `create` and
/// never called since: what a request starts from, made on the request
/// path or ahead of it (`warm.rs`).
pub(crate) struct Instance<B> {
    store: Store<HostState>,
    bindings: B,
    resource: ResourceAny,
}

/// The 0.1 schedule input: the 0.2 batch context is dropped.
fn input_v0_1(input: &ScheduleInput) -> ws::ScheduleInput {
    ws::ScheduleInput {
        round: input.round,
        generated: input.generated,
        budget_left: input.budget_left,
        max_draft: input.max_draft,
        recent: input
            .recent_window()
            .iter()
            .map(|r| ws::RoundRecord {
                drafted: r.drafted,
                accepted: r.accepted,
                draft_seconds: r.draft_seconds,
                verify_seconds: r.verify_seconds,
            })
            .collect(),
        position_acceptance: input.position_acceptance.clone(),
        draft_seconds_per_token: input.draft_seconds_per_token,
        verify_seconds_by_len: input.verify_seconds_by_len.clone(),
    }
}

fn input_v0_2(input: &ScheduleInput) -> ws2::ScheduleInput {
    ws2::ScheduleInput {
        round: input.round,
        generated: input.generated,
        budget_left: input.budget_left,
        max_draft: input.max_draft,
        recent: input
            .recent_window()
            .iter()
            .map(|r| ws2::RoundRecord {
                drafted: r.drafted,
                accepted: r.accepted,
                draft_seconds: r.draft_seconds,
                verify_seconds: r.verify_seconds,
            })
            .collect(),
        position_acceptance: input.position_acceptance.clone(),
        draft_seconds_per_token: input.draft_seconds_per_token,
        verify_seconds_by_len: input.verify_seconds_by_len.clone(),
        batch_sequences: input.batch_sequences,
        batch_rows_planned: input.batch_rows_planned,
    }
}

/// The 0.1 position: the 0.2 draft statistics are dropped.
fn position_v0_1(p: &Position) -> wa::Position {
    wa::Position {
        token: p.token,
        p: p.p,
        q: p.q,
        target_argmax: p.target_argmax,
        entropy: p.entropy,
        uniform: p.uniform,
    }
}

fn position_v0_2(p: &Position) -> wa2::Position {
    wa2::Position {
        token: p.token,
        p: p.p,
        q: p.q,
        target_argmax: p.target_argmax,
        entropy: p.entropy,
        uniform: p.uniform,
        draft_entropy: p.draft_entropy,
        draft_top1: p.draft_top1,
        confidence: p.confidence,
    }
}

fn correction_v0_1(c: wa::Correction) -> Correction {
    match c {
        wa::Correction::Residual => Correction::Residual,
        wa::Correction::TargetSample => Correction::TargetSample,
        wa::Correction::Token(t) => Correction::Token(t),
    }
}

fn correction_v0_2(c: wa2::Correction) -> Correction {
    match c {
        wa2::Correction::Residual => Correction::Residual,
        wa2::Correction::TargetSample => Correction::TargetSample,
        wa2::Correction::Token(t) => Correction::Token(t),
    }
}

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
        |store| {
            Ok(match pre {
                SchedulePre::V0_1(p) => ScheduleBindings::V0_1(p.instantiate(store)?),
                SchedulePre::V0_2(p) => ScheduleBindings::V0_2(p.instantiate(store)?),
            })
        },
        |b: &ScheduleBindings, store| match b {
            ScheduleBindings::V0_1(b) => b
                .specd_policy_schedule()
                .scheduler()
                .call_create(store, config, carried),
            ScheduleBindings::V0_2(b) => b
                .specd_policy_schedule()
                .scheduler()
                .call_create(store, config, carried),
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
        let out = match &self.bindings {
            ScheduleBindings::V0_1(b) => b
                .specd_policy_schedule()
                .scheduler()
                .call_next_draft_length(&mut self.store, self.resource, &input_v0_1(input)),
            ScheduleBindings::V0_2(b) => b
                .specd_policy_schedule()
                .scheduler()
                .call_next_draft_length(&mut self.store, self.resource, &input_v0_2(input)),
        };
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
        matches!(self.bindings, ScheduleBindings::V0_2(_))
    }

    fn continue_drafting(&mut self, step: &DraftStep) -> Result<bool, PolicyError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let ScheduleBindings::V0_2(b) = &self.bindings else {
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
        let out = match &self.bindings {
            ScheduleBindings::V0_1(b) => b
                .specd_policy_schedule()
                .scheduler()
                .call_carry(&mut self.store, self.resource),
            ScheduleBindings::V0_2(b) => b
                .specd_policy_schedule()
                .scheduler()
                .call_carry(&mut self.store, self.resource),
        };
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
        |store| {
            Ok(match pre {
                AcceptancePre::V0_1(p) => AcceptanceBindings::V0_1(p.instantiate(store)?),
                AcceptancePre::V0_2(p) => AcceptanceBindings::V0_2(p.instantiate(store)?),
            })
        },
        |b: &AcceptanceBindings, store| match b {
            AcceptanceBindings::V0_1(b) => b
                .specd_policy_acceptance()
                .acceptor()
                .call_create(store, config, vocab_size),
            AcceptanceBindings::V0_2(b) => b
                .specd_policy_acceptance()
                .acceptor()
                .call_create(store, config, vocab_size),
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
            AcceptanceBindings::V0_1(b) => {
                self.scratch.clear();
                self.scratch.extend(positions.iter().map(position_v0_1));
                b.specd_policy_acceptance()
                    .acceptor()
                    .call_decide(&mut self.store, self.resource, &self.scratch)
                    .map(|d| (d.accepted, correction_v0_1(d.correction)))
            }
            AcceptanceBindings::V0_2(b) => {
                self.scratch2.clear();
                self.scratch2.extend(positions.iter().map(position_v0_2));
                b.specd_policy_acceptance()
                    .acceptor()
                    .call_decide(&mut self.store, self.resource, &self.scratch2)
                    .map(|d| (d.accepted, correction_v0_2(d.correction)))
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
