//! Instances made ahead of requests: a small pool of fresh, never-used
//! instances per (policy, `create` arguments), refilled by one background
//! thread, so that a request whose policy is slow to instantiate (Python and
//! JavaScript components: milliseconds of interpreter start-up and page
//! faults) takes a ready one in microseconds.
//!
//! What may be done ahead: everything a request's instance is before its
//! first call, which is the Store, the instance and the guest's `create`.
//! `create` takes the request's config and, for a schedule, the carried
//! state (for an acceptance policy, the vocabulary size). A guest sees
//! nothing else that varies (the deny-all WASI has frozen clocks, fixed
//! "random" bytes, no input), so an instance created ahead with the same
//! arguments is the instance the request would have created. The pool is
//! keyed by those arguments. A schedule made ahead remembers the carried
//! bytes it was created with, and only a request that carries the same bytes
//! takes it. A request that ends and carries new state makes it stale, and it
//! is dropped unused.
//!
//! Isolation: an instance leaves the pool by move and never comes back; a
//! used instance is dropped with its request.
//!
//! Bounds (`HostConfig::warm_*`): at most `warm_instances` instances ready or
//! being made at once, all policies together (each holds a pooling-allocator
//! slot and the pages it dirtied), at most `warm_per_policy` per key, at most
//! `4 * warm_instances` keys tracked (the least recently used is forgotten).
//! A key is made ahead only once it was asked for twice (a one-off config
//! costs nothing ahead) and only while its instantiation costs at least
//! `warm_threshold_us` (Rust and C components take ~10 us: not worth a slot).

use crate::carry::CarryKey;
use crate::compile::Loaded;
use crate::instance::{
    make_acceptance, make_schedule, AcceptanceBindings, Instance, Runtime, ScheduleBindings,
};
use crate::PolicyError;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

/// What a request's instance is made for: the policy (by the name the request
/// used, which its log lines carry) and the arguments of `create`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum WarmKey {
    /// `carry`: (sha256, model key, canonical config), the key of the
    /// carried state its `create` gets.
    Schedule { name: String, carry: CarryKey },
    Acceptance {
        name: String,
        sha256: String,
        config: String,
        vocab_size: u32,
    },
}

impl WarmKey {
    fn sha256(&self) -> &str {
        match self {
            WarmKey::Schedule { carry, .. } => &carry.0,
            WarmKey::Acceptance { sha256, .. } => sha256,
        }
    }
}

enum Made {
    Schedule(Instance<ScheduleBindings>),
    Acceptance(Instance<AcceptanceBindings>),
}

struct Ready {
    made: Made,
    /// The carried state a schedule was created with.
    carried: Option<Vec<u8>>,
}

/// One key's ready instances and what is known of its cost.
struct Slot {
    loaded: Arc<Loaded>,
    ready: Vec<Ready>,
    building: bool,
    /// The last instantiation + `create` measured (on a request or ahead).
    cost: Duration,
    /// Requests that asked for this key (made ahead from the second on).
    requests: u64,
    /// Making it ahead failed in the guest (a bad config, a trap: it would
    /// fail again); it is then made on the request path, which reports the
    /// error.
    failed: bool,
    /// Making it ahead found the allocator full: not again before this.
    retry_at: Option<Instant>,
    last_used: u64,
}

#[derive(Default)]
struct State {
    slots: HashMap<WarmKey, Slot>,
    tick: u64,
    /// Instances to drop off the request path (stale or evicted).
    retire: Vec<Made>,
    shutdown: bool,
    started: bool,
    /// A request found the allocator full: nothing is made ahead before
    /// this (the slots go to requests).
    paused_until: Option<Instant>,
}

/// How long making ahead stays off after the allocator was found full.
const BACKOFF: Duration = Duration::from_secs(1);

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    limits: Limits,
}

/// The pool's bounds, from [`crate::HostConfig`].
struct Limits {
    /// Instances ready or being made, all keys together (0: off).
    total: usize,
    per_key: usize,
    threshold: Duration,
    max_keys: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Critical sections move whole entries: usable after a panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The pool (one per policy host, beside its [`Runtime`]).
pub(crate) struct WarmPool {
    shared: Arc<Shared>,
}

impl WarmPool {
    pub fn new(cfg: &crate::HostConfig) -> Self {
        // Never more than an eighth of the allocator's slots: requests need them.
        let total = cfg
            .warm_instances
            .min(cfg.max_instances as usize / 8)
            .min(256);
        WarmPool {
            shared: Arc::new(Shared {
                state: Mutex::default(),
                wake: Condvar::new(),
                limits: Limits {
                    total,
                    per_key: cfg.warm_per_policy.min(total),
                    threshold: Duration::from_micros(cfg.warm_threshold_us),
                    max_keys: total * 4,
                },
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// Something may need making or dropping (a request took an instance,
    /// or carried new state).
    pub fn poke(&self) {
        if self.limits().total > 0 {
            // Through the lock: the thread checks and goes to sleep under
            // it, so a change made before this call (carried state is
            // stored under its own lock) cannot slip between the two.
            drop(self.lock());
            self.shared.wake.notify_one();
        }
    }

    /// Instances ready now.
    pub fn ready(&self) -> usize {
        self.lock().slots.values().map(|s| s.ready.len()).sum()
    }

    /// Stops the background thread (the policy host is going away).
    pub fn shutdown(&self) {
        self.lock().shutdown = true;
        self.shared.wake.notify_all();
    }

    /// Drops every ready instance now, on this thread (frees their
    /// allocator slots for a request); whether there was any.
    pub fn clear(&self) -> bool {
        let dropped: Vec<Ready> = {
            let mut st = self.lock();
            st.paused_until = Some(Instant::now() + BACKOFF);
            st.slots
                .values_mut()
                .flat_map(|s| std::mem::take(&mut s.ready))
                .collect()
        };
        !dropped.is_empty()
    }

    /// Forgets the keys of components no longer registered.
    pub fn retain_hashes(&self, live: &[String]) {
        let mut st = self.lock();
        let State { slots, retire, .. } = &mut *st;
        slots.retain(|k, s| {
            let keep = live.iter().any(|h| h == k.sha256());
            if !keep {
                retire.extend(s.ready.drain(..).map(|r| r.made));
            }
            keep
        });
        drop(st);
        self.poke();
    }

    /// A ready instance for `key` created with `carried`; entries made with
    /// other carried bytes are stale and go to be dropped.
    fn take(&self, rt: &Runtime, key: &WarmKey, carried: Option<&[u8]>) -> Option<Made> {
        if self.limits().total == 0 {
            return None;
        }
        let mut st = self.lock();
        st.tick += 1;
        let tick = st.tick;
        let State { slots, retire, .. } = &mut *st;
        let slot = slots.get_mut(key)?;
        slot.last_used = tick;
        slot.requests += 1;
        let mut found = None;
        while let Some(r) = slot.ready.pop() {
            if r.carried.as_deref() == carried {
                found = Some(r.made);
                break;
            }
            rt.metrics.warm_discarded();
            retire.push(r.made);
        }
        drop(st);
        // Refill (and drop what went stale) off the request path.
        self.poke();
        if found.is_some() {
            rt.metrics.warm_hit();
        }
        found
    }

    /// A request made its own instance for `key` in `cost`: the key is
    /// tracked, and made ahead from its next request on if it is costly.
    pub fn note_miss(&self, rt: &Arc<Runtime>, key: WarmKey, loaded: &Arc<Loaded>, cost: Duration) {
        let pool = self;
        let limits = pool.limits();
        if limits.total == 0 {
            return;
        }
        let mut st = pool.lock();
        st.tick += 1;
        let tick = st.tick;
        match st.slots.get_mut(&key) {
            Some(s) => {
                s.cost = cost;
                s.last_used = tick;
                // take() counted this request already.
            }
            None if cost >= limits.threshold => {
                st.slots.insert(
                    key,
                    Slot {
                        loaded: loaded.clone(),
                        ready: Vec::new(),
                        building: false,
                        cost,
                        requests: 1,
                        failed: false,
                        retry_at: None,
                        last_used: tick,
                    },
                );
                evict_beyond(&mut st, limits.max_keys);
            }
            None => return,
        }
        if !st.started {
            st.started = true;
            let shared = pool.shared.clone();
            let weak = Arc::downgrade(rt);
            let spawned = std::thread::Builder::new()
                .name("specd-policy-warm".into())
                .spawn(move || {
                    lower_priority();
                    refill(shared, weak)
                });
            if let Err(e) = spawned {
                tracing::warn!("starting the policy warm-up thread: {e} (instances are made on the request path)");
            }
        }
        drop(st);
        pool.poke();
    }
}

/// Marks this thread as batch work (`SCHED_BATCH`): it gets its fair share
/// of the CPUs but never preempts the thread that woke it.  Measured on 2
/// busy cores: at the default policy, a request that took an instance (and
/// so woke this thread) lost its CPU to the refill for 2-10 ms right
/// there; at nice 19 the refill starved and the pool stayed empty.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: a plain syscall on this thread (pid 0), `param` outlives it.
        let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if r != 0 {
            tracing::debug!(
                "making the warm-up thread batch work: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// This thread's CPU time so far (Linux, macOS: `CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_time() -> Option<Duration> {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid out-pointer for the call.
        let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        if r == 0 {
            return Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32));
        }
    }
    None
}

/// Forgets the least recently used keys past `max_keys`.
fn evict_beyond(st: &mut State, max_keys: usize) {
    while st.slots.len() > max_keys {
        let Some(oldest) = st
            .slots
            .iter()
            .filter(|(_, s)| !s.building)
            .min_by_key(|(_, s)| s.last_used)
            .map(|(k, _)| k.clone())
        else {
            return;
        };
        if let Some(s) = st.slots.remove(&oldest) {
            st.retire.extend(s.ready.into_iter().map(|r| r.made));
        }
    }
}

impl WarmPool {
    /// A request's schedule instance from the pool, if one is ready for
    /// exactly these `create` arguments.
    pub fn take_schedule(
        &self,
        rt: &Runtime,
        key: &WarmKey,
        carried: Option<&[u8]>,
    ) -> Option<Instance<ScheduleBindings>> {
        match self.take(rt, key, carried)? {
            Made::Schedule(i) => Some(i),
            Made::Acceptance(_) => None,
        }
    }

    pub fn take_acceptance(
        &self,
        rt: &Runtime,
        key: &WarmKey,
    ) -> Option<Instance<AcceptanceBindings>> {
        match self.take(rt, key, None)? {
            Made::Acceptance(i) => Some(i),
            Made::Schedule(_) => None,
        }
    }
}

/// What the thread makes next: a key, its component and the carried state
/// to create it with.
struct Job {
    key: WarmKey,
    loaded: Arc<Loaded>,
    carried: Option<Vec<u8>>,
}

/// Under the lock: sends stale schedules to be dropped, then picks the most
/// recently used key that is below its depth, while the total allows.
fn next_job(st: &mut State, pool: &Limits, rt: &Runtime) -> Option<Job> {
    let State { slots, retire, .. } = &mut *st;
    for (key, slot) in slots.iter_mut() {
        if let WarmKey::Schedule { carry, .. } = key {
            if slot.ready.is_empty() {
                continue;
            }
            let now = rt.carried.get(carry);
            let (keep, stale): (Vec<Ready>, Vec<Ready>) =
                slot.ready.drain(..).partition(|r| r.carried == now);
            slot.ready = keep;
            for r in stale {
                rt.metrics.warm_discarded();
                retire.push(r.made);
            }
        }
    }
    let held: usize = slots
        .values()
        .map(|s| s.ready.len() + usize::from(s.building))
        .sum();
    if held >= pool.total {
        return None;
    }
    let now = Instant::now();
    if st.paused_until.is_some_and(|t| t > now) {
        return None;
    }
    let State { slots, .. } = &mut *st;
    let (key, slot) = slots
        .iter_mut()
        .filter(|(_, s)| {
            !s.building
                && !s.failed
                && s.retry_at.is_none_or(|t| t <= now)
                && s.requests >= 2
                && s.cost >= pool.threshold
                && s.ready.len() < pool.per_key
        })
        .max_by_key(|(_, s)| s.last_used)?;
    slot.building = true;
    let carried = match key {
        WarmKey::Schedule { carry, .. } => rt.carried.get(carry),
        WarmKey::Acceptance { .. } => None,
    };
    Some(Job {
        key: key.clone(),
        loaded: slot.loaded.clone(),
        carried,
    })
}

fn make(rt: &Runtime, job: &Job) -> Result<Made, PolicyError> {
    let compiled = job.loaded.ready().ok_or_else(|| {
        PolicyError::new(
            job.key.sha256(),
            crate::PolicyErrorKind::Instantiate,
            "not compiled",
        )
    })?;
    let missing = |what: &str| {
        PolicyError::new(
            job.key.sha256(),
            crate::PolicyErrorKind::Instantiate,
            format!("compiled without {what} bindings"),
        )
    };
    Ok(match &job.key {
        WarmKey::Schedule { name, carry } => {
            let pre = compiled
                .schedule
                .as_ref()
                .ok_or_else(|| missing("schedule"))?;
            Made::Schedule(make_schedule(
                rt,
                name,
                pre,
                &carry.2,
                job.carried.as_deref(),
            )?)
        }
        WarmKey::Acceptance {
            name,
            config,
            vocab_size,
            ..
        } => {
            let pre = compiled
                .acceptance
                .as_ref()
                .ok_or_else(|| missing("acceptance"))?;
            Made::Acceptance(make_acceptance(rt, name, pre, config, *vocab_size)?)
        }
    })
}

/// The background thread: makes instances while keys are below their depth,
/// drops stale and evicted ones, sleeps otherwise.  Holds the runtime only
/// while it works, so the host can go away.
fn refill(shared: Arc<Shared>, weak: Weak<Runtime>) {
    loop {
        let mut st = shared.lock();
        let (job, retired, rt) = loop {
            if st.shutdown {
                return;
            }
            let Some(rt) = weak.upgrade() else { return };
            let job = next_job(&mut st, &shared.limits, &rt);
            let retired = std::mem::take(&mut st.retire);
            if job.is_some() || !retired.is_empty() {
                break (job, retired, rt);
            }
            drop(rt);
            // Backing off: look again when it ends (else: when poked).
            let until = st
                .slots
                .values()
                .filter_map(|s| s.retry_at)
                .chain(st.paused_until)
                .filter(|t| *t > Instant::now())
                .min();
            st = match until {
                Some(t) => {
                    let wait = t.saturating_duration_since(Instant::now());
                    shared
                        .wake
                        .wait_timeout(st, wait)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => shared.wake.wait(st).unwrap_or_else(PoisonError::into_inner),
            };
        };
        drop(st);
        drop(retired);
        let Some(job) = job else { continue };
        let (t, cpu) = (Instant::now(), thread_cpu_time());
        let made = make(&rt, &job);
        // Wall time decides whether the key is worth making ahead (what a
        // request would wait); CPU time is what the pool costs.
        let cost = t.elapsed();
        let cpu = match (cpu, thread_cpu_time()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => cost,
        };
        let mut st = shared.lock();
        let outcome = match st.slots.get_mut(&job.key) {
            Some(slot) => {
                slot.building = false;
                match made {
                    Ok(made) => {
                        slot.cost = cost;
                        rt.metrics.warm_built(cpu);
                        slot.ready.push(Ready {
                            made,
                            carried: job.carried,
                        });
                        None
                    }
                    Err(e) if e.kind == crate::PolicyErrorKind::Instantiate => {
                        // The allocator is full (or the like): later.
                        slot.retry_at = Some(Instant::now() + BACKOFF);
                        tracing::debug!(policy = %e.policy, "making an instance ahead: {}", e.message);
                        None
                    }
                    Err(e) => {
                        slot.failed = true;
                        tracing::debug!(policy = %e.policy, kind = %e.kind, "making an instance ahead failed: {} (made on the request path from now on)", e.message);
                        None
                    }
                }
            }
            // Forgotten meanwhile.
            None => made.ok(),
        };
        drop(st);
        drop(outcome);
        drop(rt);
    }
}
