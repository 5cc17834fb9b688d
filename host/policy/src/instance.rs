//! A policy's component at its contract version, and fresh instances of
//! it: the wit-bindgen bindings of each version behind one type
//! ([`PerVersion`], [`both!`]), the runtime a request's instances need
//! ([`Runtime`]), and [`make_schedule`] / [`make_acceptance`], which
//! instantiate one in its own Store and call its `create`. Both the request
//! path (`host.rs`) and the instances made ahead (`warm.rs`) make them
//! here; the per-request policy objects over them are in `wasm.rs`.

use crate::carry::Carried;
use crate::metrics::Metrics;
use crate::sandbox::{
    bind_acceptance, bind_acceptance_v0_2, bind_schedule, bind_schedule_v0_2, classify, HostState,
};
use crate::{Contract, PolicyError, PolicyErrorKind};
use wasmtime::component::{InstancePre, ResourceAny};
use wasmtime::Store;

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

pub(crate) use both;

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
    pub store: Store<HostState>,
    pub bindings: B,
    pub resource: ResourceAny,
}

/// What a request's instances need of the host: the engine, the limits,
/// the counters and the carried state. The instances made ahead
/// (`warm.rs`) sit beside it, in the policy host.
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

pub(crate) fn refuel(store: &mut Store<HostState>, fuel: u64) {
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
