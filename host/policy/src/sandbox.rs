//! The per-request sandbox: store state, resource limits, deny-all WASI, and
//! turning wasmtime errors into [`PolicyError`]s.

use crate::{PolicyError, PolicyErrorKind};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{
    HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView,
};

/// A module of wasmtime's bindings of one world of one contract version.
macro_rules! bindings {
    ($module:ident, $wit:tt, $world:tt) => {
        pub(crate) mod $module {
            wasmtime::component::bindgen!({ path: $wit, world: $world });
        }
    };
}

bindings!(bind_schedule, "../../wit", "schedule-policy");
bindings!(bind_acceptance, "../../wit", "acceptance-policy");
// Contract 0.2 (`wit/0.2`).  Both versions' bindings live side by side;
// `wasm.rs` converts each to the one set of contract types.
bindings!(bind_schedule_v0_2, "../../wit/0.2", "schedule-policy");
bindings!(bind_acceptance_v0_2, "../../wit/0.2", "acceptance-policy");

/// Store data of one request's instance.
pub(crate) struct HostState {
    pub limits: Limits,
    wasi: Option<Box<GuestWasi>>,
    log_limit: usize,
    /// Policy name, for the log lines of captured output.
    pub policy: String,
}

struct GuestWasi {
    ctx: WasiCtx,
    table: ResourceTable,
    stdout: CappedPipe,
    stderr: CappedPipe,
    logged_out: usize,
    logged_err: usize,
    warned_out: bool,
    warned_err: bool,
}

impl HostState {
    pub fn new(policy: &str, memory_limit: usize, log_limit: usize) -> Self {
        HostState {
            limits: Limits {
                memory_limit,
                memory_exceeded: false,
            },
            wasi: None,
            log_limit,
            policy: policy.to_string(),
        }
    }

    /// Writes guest output captured since the last call to the log.
    pub fn flush_guest_output(&mut self) {
        let Some(w) = self.wasi.as_mut() else { return };
        for (pipe, logged, warned, stream) in [
            (&w.stdout, &mut w.logged_out, &mut w.warned_out, "stdout"),
            (&w.stderr, &mut w.logged_err, &mut w.warned_err, "stderr"),
        ] {
            let out = pipe.lock();
            if out.kept.len() > *logged {
                let text = String::from_utf8_lossy(&out.kept[*logged..]);
                for line in text.lines() {
                    tracing::info!(target: "specd_policy::guest", policy = %self.policy, stream, "{line}");
                }
                *logged = out.kept.len();
            }
            if out.dropped > 0 && !*warned {
                *warned = true;
                tracing::warn!(target: "specd_policy::guest", policy = %self.policy, stream,
                    "guest output reached the {} byte cap; the rest is dropped (and counted)", pipe.cap);
            }
        }
    }

    /// Bytes of guest output dropped past the cap so far (stdout + stderr).
    pub fn output_dropped(&self) -> u64 {
        self.wasi
            .as_ref()
            .map_or(0, |w| w.stdout.lock().dropped + w.stderr.lock().dropped)
    }
}

/// A guest's stdout or stderr: keeps the first `cap` bytes for the log and
/// counts the rest as dropped.  It never refuses a write: a stream that
/// fails makes wasi-libc or Rust's `print!` trap, and a policy that prints
/// too much must keep running, only quieter.
#[derive(Clone)]
pub(crate) struct CappedPipe {
    cap: usize,
    out: Arc<Mutex<Captured>>,
}

#[derive(Default)]
pub(crate) struct Captured {
    pub kept: Vec<u8>,
    pub dropped: u64,
}

impl CappedPipe {
    pub fn new(cap: usize) -> Self {
        CappedPipe {
            cap,
            out: Arc::default(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Captured> {
        // Nothing can be left half-written by a panic here: the data is
        // plain bytes and a counter.
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, bytes: &[u8]) {
        let mut out = self.lock();
        let room = self.cap.saturating_sub(out.kept.len()).min(bytes.len());
        out.kept.extend_from_slice(&bytes[..room]);
        out.dropped += (bytes.len() - room) as u64;
    }
}

/// What `check-write` grants per call: any amount works, since every
/// write is taken.
const WRITE_PERMIT: usize = 64 << 10;

impl OutputStream for CappedPipe {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedPipe {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for CappedPipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// The deny-all WASI context: nothing to read, nothing to reach, nothing
/// that varies.
fn deny_all_wasi(log_limit: usize) -> GuestWasi {
    let stdout = CappedPipe::new(log_limit);
    let stderr = CappedPipe::new(log_limit);
    let ctx = WasiCtxBuilder::new()
        // no preopened directories, no env, no args, no network (the defaults)
        .stdin(wasmtime_wasi::p2::pipe::MemoryInputPipe::new(
            Vec::<u8>::new(),
        ))
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .wall_clock(FrozenClock)
        .monotonic_clock(FrozenClock)
        .secure_random(wasmtime_wasi::Deterministic::new(vec![0x5a]))
        .insecure_random(wasmtime_wasi::Deterministic::new(vec![0x5a]))
        .insecure_random_seed(0)
        .max_random_size(4096)
        .allow_ip_name_lookup(false)
        .allow_tcp(false)
        .allow_udp(false)
        .build();
    GuestWasi {
        ctx,
        table: ResourceTable::new(),
        stdout,
        stderr,
        logged_out: 0,
        logged_err: 0,
        warned_out: false,
        warned_err: false,
    }
}

/// Clocks that never move: time is not a capability policies get (they get
/// measured timings as numbers in their input).
struct FrozenClock;

impl HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Time does not pass for policies: `subscribe-duration` / `subscribe-instant`
/// of `wasi:clocks/monotonic-clock` return a pollable that is ready at once,
/// so a guest cannot block the host thread in `poll` (host calls burn no
/// fuel).  Shadows wasmtime-wasi's real sleeps.
pub(crate) fn freeze_sleeps(
    linker: &mut wasmtime::component::Linker<HostState>,
) -> wasmtime::Result<()> {
    use wasmtime::component::Resource;
    use wasmtime_wasi::p2::DynPollable;

    struct Ready;
    #[wasmtime_wasi::async_trait]
    impl wasmtime_wasi::p2::Pollable for Ready {
        async fn ready(&mut self) {}
    }
    fn ready(state: &mut HostState) -> wasmtime::Result<(Resource<DynPollable>,)> {
        let view = state.ctx();
        let r = view.table.push(Ready)?;
        Ok((wasmtime_wasi::p2::subscribe(view.table, r)?,))
    }

    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    clock.func_wrap(
        "subscribe-duration",
        |mut cx: wasmtime::StoreContextMut<'_, HostState>, (_d,): (u64,)| ready(cx.data_mut()),
    )?;
    clock.func_wrap(
        "subscribe-instant",
        |mut cx: wasmtime::StoreContextMut<'_, HostState>, (_i,): (u64,)| ready(cx.data_mut()),
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The monotonic clock interface as wasmtime-wasi 48 registers it.
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        // Built on first use: components that import nothing never pay for it.
        let log_limit = self.log_limit;
        let w = self
            .wasi
            .get_or_insert_with(|| Box::new(deny_all_wasi(log_limit)));
        WasiCtxView {
            ctx: &mut w.ctx,
            table: &mut w.table,
        }
    }
}

/// Memory cap; remembers that it refused so the trap is reported as a
/// memory-limit failure.
pub(crate) struct Limits {
    memory_limit: usize,
    pub memory_exceeded: bool,
}

impl wasmtime::ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.memory_exceeded = true;
            wasmtime::bail!("memory limit: the policy asked for {desired} bytes of linear memory, the cap is {}", self.memory_limit);
        }
        Ok(true)
    }
    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// Classifies a wasmtime error from a guest call.
pub(crate) fn classify(
    policy: &str,
    what: &str,
    state: &HostState,
    err: &wasmtime::Error,
) -> PolicyError {
    let kind = if state.limits.memory_exceeded {
        PolicyErrorKind::MemoryLimit
    } else {
        match err.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::OutOfFuel) | Some(wasmtime::Trap::Interrupt) => {
                PolicyErrorKind::Timeout
            }
            _ => PolicyErrorKind::Trap,
        }
    };
    PolicyError::new(policy, kind, format!("{what}: {}", describe(err)))
}

/// A short description of a guest failure: the causes without wasmtime's
/// backtrace context, one line.
pub(crate) fn describe(err: &wasmtime::Error) -> String {
    if matches!(
        err.downcast_ref::<wasmtime::Trap>(),
        Some(wasmtime::Trap::OutOfFuel) | Some(wasmtime::Trap::Interrupt)
    ) {
        return "ran out of its CPU budget (fuel): an endless loop, or too much work for one call"
            .to_string();
    }
    let mut parts: Vec<String> = Vec::new();
    for cause in err.chain() {
        let s = cause.to_string();
        if s.starts_with("error while executing at wasm backtrace") {
            continue;
        }
        let line = s.lines().next().unwrap_or("").trim().to_string();
        if !line.is_empty() && !parts.iter().any(|p| p.contains(&line)) {
            parts.push(line);
        }
    }
    if parts.is_empty() {
        err.to_string()
            .lines()
            .next()
            .unwrap_or("unknown error")
            .to_string()
    } else {
        parts.join(": ")
    }
}

/// The error and its causes on one line.
pub(crate) fn chain(err: &wasmtime::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in err.chain() {
        let s = cause.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_pipe_keeps_the_first_bytes_and_counts_the_rest() {
        let mut pipe = CappedPipe::new(10);
        for _ in 0..3 {
            OutputStream::write(&mut pipe, bytes::Bytes::from_static(b"hello")).unwrap();
            assert_eq!(pipe.clone().check_write().unwrap(), WRITE_PERMIT);
        }
        let out = pipe.lock();
        assert_eq!(out.kept, b"hellohello");
        assert_eq!(out.dropped, 5);
    }
}
