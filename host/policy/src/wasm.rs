//! Per-request policy objects backed by a component instance in its own
//! Store (made by `instance.rs`, on the request path or ahead of it).
//!
//! This is the one boundary between the wit-bindgen types of each contract
//! version and the host's contract types (`specd_policy_logic`, 0.2's):
//! a 0.2 component gets every field; a 0.1 component gets the 0.1 subset
//! (the 0.2 fields are dropped here) and is never asked `continue-drafting`.

use crate::carry::CarryKey;
use crate::instance::{
    both, refuel, AcceptanceBindings, Instance, PerVersion, Runtime, ScheduleBindings,
};
use crate::sandbox::{
    bind_acceptance, bind_acceptance_v0_2, bind_schedule, bind_schedule_v0_2, classify, HostState,
};
use crate::warm::WarmPool;
use crate::{
    validate, Acceptance, Correction, Decision, DraftStep, PolicyError, Position, Schedule,
    ScheduleInput,
};
use std::sync::Arc;
use std::time::Instant;
use wasmtime::component::ResourceAny;
use wasmtime::Store;

use bind_acceptance::exports::specd::policy::acceptance as wa;
use bind_acceptance_v0_2::exports::specd::policy::acceptance as wa2;
use bind_schedule::exports::specd::policy::schedule as ws;
use bind_schedule_v0_2::exports::specd::policy::schedule as ws2;

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

pub(crate) struct WasmSchedule {
    inner: Arc<Runtime>,
    /// Told when the schedule carries new state (what was made ahead with
    /// the old is stale).
    warm: Arc<WarmPool>,
    name: String,
    store: Store<HostState>,
    bindings: ScheduleBindings,
    resource: ResourceAny,
    carry_key: CarryKey,
    failed: Option<PolicyError>,
}

impl WasmSchedule {
    /// The request's schedule over a fresh, never-called instance.
    pub fn from_instance(
        inner: Arc<Runtime>,
        warm: Arc<WarmPool>,
        name: &str,
        instance: Instance<ScheduleBindings>,
        carry_key: CarryKey,
    ) -> Self {
        WasmSchedule {
            inner,
            warm,
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
                self.warm.poke();
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
