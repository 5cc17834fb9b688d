//! Per-request policy objects backed by a component instance in its own Store.

use crate::carry::{Carried, CarryKey};
use crate::metrics::Metrics;
use crate::sandbox::{bind_acceptance, bind_schedule, classify, HostState};
use crate::{
    validate, Acceptance, Correction, Decision, PolicyError, PolicyErrorKind, Position, Schedule,
    ScheduleInput,
};
use std::sync::Arc;
use std::time::Instant;
use wasmtime::component::ResourceAny;
use wasmtime::Store;

use bind_acceptance::exports::specd::policy::acceptance as wa;
use bind_schedule::exports::specd::policy::schedule as ws;

/// What a request's instances need of the host: the engine, the limits,
/// the counters and the carried state.
pub(crate) struct Runtime {
    pub engine: wasmtime::Engine,
    pub cfg: crate::HostConfig,
    pub metrics: Metrics,
    pub carried: Carried,
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
) -> Result<(Store<HostState>, B, ResourceAny), PolicyError> {
    let mut store = new_store(inner, name)?;
    let bindings = instantiate(&mut store).map_err(|e| instantiate_error(name, &store, &e))?;
    refuel(&mut store, inner.cfg.fuel_per_call);
    let created = create(&bindings, &mut store);
    store.data_mut().flush_guest_output();
    match created {
        Ok(Ok(r)) => Ok((store, bindings, r)),
        Ok(Err(msg)) => Err(PolicyError::new(name, PolicyErrorKind::Config, msg)),
        Err(e) => Err(classify(name, "create", store.data(), &e)),
    }
}

pub(crate) struct WasmSchedule {
    inner: Arc<Runtime>,
    name: String,
    store: Store<HostState>,
    bindings: bind_schedule::SchedulePolicy,
    resource: ResourceAny,
    carry_key: CarryKey,
    failed: Option<PolicyError>,
}

impl WasmSchedule {
    pub fn new(
        inner: Arc<Runtime>,
        name: &str,
        pre: &bind_schedule::SchedulePolicyPre<HostState>,
        config: &str,
        carried: Option<Vec<u8>>,
        carry_key: CarryKey,
    ) -> Result<Self, PolicyError> {
        let (store, bindings, resource) = instantiate(
            &inner,
            name,
            |store| pre.instantiate(store),
            |b: &bind_schedule::SchedulePolicy, store| {
                b.specd_policy_schedule()
                    .scheduler()
                    .call_create(store, config, carried.as_deref())
            },
        )?;
        Ok(WasmSchedule {
            inner,
            name: name.to_string(),
            store,
            bindings,
            resource,
            carry_key,
            failed: None,
        })
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
        let wit_input = ws::ScheduleInput {
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
        };
        refuel(&mut self.store, self.inner.cfg.fuel_per_call);
        let out = self
            .bindings
            .specd_policy_schedule()
            .scheduler()
            .call_next_draft_length(&mut self.store, self.resource, &wit_input);
        self.store.data_mut().flush_guest_output();
        self.inner.metrics.schedule_call(t.elapsed());
        let result = match out {
            Ok(k) => match validate::draft_length(&self.name, k, input) {
                Ok(k) => return Ok(k),
                Err(e) => e,
            },
            Err(e) => classify(&self.name, "next-draft-length", self.store.data(), &e),
        };
        self.inner.metrics.failure(result.kind);
        tracing::warn!(policy = %self.name, kind = %result.kind, "{}", result.message);
        self.failed = Some(result.clone());
        Err(result)
    }

    fn output_dropped(&self) -> u64 {
        self.store.data().output_dropped()
    }

    fn finish(mut self: Box<Self>) {
        if self.failed.is_some() {
            return;
        }
        refuel(&mut self.store, self.inner.cfg.fuel_per_call);
        let out = self
            .bindings
            .specd_policy_schedule()
            .scheduler()
            .call_carry(&mut self.store, self.resource);
        self.store.data_mut().flush_guest_output();
        match out {
            Ok(bytes) => self.inner.carried.store(self.carry_key.clone(), bytes),
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
    bindings: bind_acceptance::AcceptancePolicy,
    resource: ResourceAny,
    vocab_size: u32,
    failed: Option<PolicyError>,
    scratch: Vec<wa::Position>,
}

impl WasmAcceptance {
    pub fn new(
        inner: Arc<Runtime>,
        name: &str,
        pre: &bind_acceptance::AcceptancePolicyPre<HostState>,
        config: &str,
        vocab_size: u32,
    ) -> Result<Self, PolicyError> {
        let (store, bindings, resource) = instantiate(
            &inner,
            name,
            |store| pre.instantiate(store),
            |b: &bind_acceptance::AcceptancePolicy, store| {
                b.specd_policy_acceptance()
                    .acceptor()
                    .call_create(store, config, vocab_size)
            },
        )?;
        Ok(WasmAcceptance {
            inner,
            name: name.to_string(),
            store,
            bindings,
            resource,
            vocab_size,
            failed: None,
            scratch: Vec::new(),
        })
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
        self.scratch.clear();
        self.scratch.extend(positions.iter().map(|p| wa::Position {
            token: p.token,
            p: p.p,
            q: p.q,
            target_argmax: p.target_argmax,
            entropy: p.entropy,
            uniform: p.uniform,
        }));
        refuel(&mut self.store, self.inner.cfg.fuel_per_call);
        let out = self
            .bindings
            .specd_policy_acceptance()
            .acceptor()
            .call_decide(&mut self.store, self.resource, &self.scratch);
        self.store.data_mut().flush_guest_output();
        self.inner.metrics.acceptance_call(t.elapsed());
        let err = match out {
            Ok(d) => {
                let d = Decision {
                    accepted: d.accepted,
                    correction: match d.correction {
                        wa::Correction::Residual => Correction::Residual,
                        wa::Correction::TargetSample => Correction::TargetSample,
                        wa::Correction::Token(t) => Correction::Token(t),
                    },
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
