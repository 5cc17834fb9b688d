//! The standard specd policies as plain Rust.
//!
//! This crate is the logic inside the built-in policy components (each
//! component under `plugins/rust/` is a thin wit-bindgen shim over one type
//! here, see [`schedule_component!`] and [`acceptance_component!`]) and the
//! native baselines of the host (`specd_policy::native`), so both decide the
//! same way by construction.  The reference semantics each policy follows are
//! stated on its type.  Nothing here knows about WebAssembly.
//!
//! `no_std` + `alloc`, so that the components need no WASI at all: Rust's
//! `std` on wasm32-wasip2 imports WASI (stderr for panic messages,
//! environment, exit), and a component with no imports is the smallest
//! possible sandbox.
#![no_std]

extern crate alloc;

mod acceptances;
mod components;
mod contract;
mod schedules;

pub use acceptances::{Greedy, Rejection, Typical};
pub use contract::{
    parse_config, AcceptanceLogic, Correction, Decision, DraftStep, Position, RoundRecord,
    ScheduleInput, ScheduleLogic, RECENT_WINDOW,
};
pub use schedules::{
    batch_share, estimate_verify, AdaEdl, Bandit, Constant, Heuristic, HeuristicTransient,
    Throughput, ThroughputCarry, CARRY_WEIGHT, PROBE_AFTER,
};
// The component macros (`#[macro_export]`, in `components`) live at the
// crate root: `specd_policy_logic::schedule_component!` and the others.
