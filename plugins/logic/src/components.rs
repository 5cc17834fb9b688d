//! The component macros: a [`ScheduleLogic`](crate::ScheduleLogic) or
//! [`AcceptanceLogic`](crate::AcceptanceLogic) type made a WebAssembly
//! component by a thin wit-bindgen shim.  `#[macro_export]` puts every macro
//! at the crate root (`specd_policy_logic::schedule_component!`), and inside
//! them `$crate::` names the root's re-exports.

// For the docs' links only (the macros name everything through `$crate::`).
#[cfg(doc)]
use crate::{acceptance_component, schedule_component, AcceptanceLogic, ScheduleLogic};

/// The `no_std` runtime of a component: a global allocator (dlmalloc over
/// `memory.grow`) and a panic handler that traps.  Expanded by
/// [`schedule_component!`] and [`acceptance_component!`]; the cdylib needs
/// `#![no_std]`, `extern crate alloc;` and a `dlmalloc` dependency with the
/// `global` feature.
#[macro_export]
macro_rules! component_runtime {
    () => {
        // memcpy, memcmp, memset, ... come from the target's bundled wasi-libc
        // (pure functions: they import nothing).
        #[cfg(target_arch = "wasm32")]
        #[link(name = "c")]
        extern "C" {}
        #[global_allocator]
        static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;
        // The canonical ABI allocates arguments through `cabi_realloc`; it must
        // use the Rust allocator (the generated code frees with it).
        // wit-bindgen leaves it to wasi-libc on wasm32-wasip2, whose malloc
        // is a different heap, so it is defined here.
        #[cfg(target_arch = "wasm32")]
        #[no_mangle]
        unsafe extern "C" fn cabi_realloc(
            old_ptr: *mut u8,
            old_len: usize,
            align: usize,
            new_len: usize,
        ) -> *mut u8 {
            use ::alloc::alloc::{alloc, realloc, Layout};
            let ptr = if old_len == 0 {
                if new_len == 0 {
                    return align as *mut u8;
                }
                alloc(Layout::from_size_align_unchecked(new_len, align))
            } else {
                realloc(
                    old_ptr,
                    Layout::from_size_align_unchecked(old_len, align),
                    new_len,
                )
            };
            if ptr.is_null() {
                ::core::arch::wasm32::unreachable()
            }
            ptr
        }
        #[cfg(target_arch = "wasm32")]
        #[panic_handler]
        fn panic(_: &::core::panic::PanicInfo) -> ! {
            ::core::arch::wasm32::unreachable()
        }
    };
}

/// Makes a component exporting `specd:policy/schedule@0.1.0` from a
/// [`ScheduleLogic`] type.  Use in a `#![no_std]` `cdylib` crate depending on
/// `wit-bindgen`, `dlmalloc` and this crate, with the WIT at
/// `$manifest/../../../wit`:
///
/// ```ignore
/// #![no_std]
/// extern crate alloc;
/// specd_policy_logic::schedule_component!(specd_policy_logic::Heuristic);
/// ```
#[macro_export]
macro_rules! schedule_component {
    // `$batch`: the batch context `(sequences, rows planned)` from the input
    // `$i`; `$extra`: the exports a later contract adds.
    (@with $logic:ty, $wit:literal, |$i:ident| $batch:expr, { $($extra:tt)* }) => {
        $crate::component_runtime!();
        wit_bindgen::generate!({ path: $wit, world: "schedule-policy" });
        use exports::specd::policy::schedule as wit_schedule;
        struct Component;
        struct State(::core::cell::RefCell<$logic>);
        impl wit_schedule::Guest for Component {
            type Scheduler = State;
        }
        impl wit_schedule::GuestScheduler for State {
            fn create(
                config: ::alloc::string::String,
                carried: Option<::alloc::vec::Vec<u8>>,
            ) -> Result<wit_schedule::Scheduler, ::alloc::string::String> {
                let logic = <$logic as $crate::ScheduleLogic>::create(&config, carried.as_deref())?;
                Ok(wit_schedule::Scheduler::new(State(::core::cell::RefCell::new(logic))))
            }
            fn next_draft_length(&self, $i: wit_schedule::ScheduleInput) -> u32 {
                let (batch_sequences, batch_rows_planned) = $batch;
                let input = $crate::ScheduleInput {
                    round: $i.round,
                    generated: $i.generated,
                    budget_left: $i.budget_left,
                    max_draft: $i.max_draft,
                    recent: $i
                        .recent
                        .iter()
                        .map(|r| $crate::RoundRecord {
                            drafted: r.drafted,
                            accepted: r.accepted,
                            draft_seconds: r.draft_seconds,
                            verify_seconds: r.verify_seconds,
                        })
                        .collect(),
                    position_acceptance: $i.position_acceptance,
                    draft_seconds_per_token: $i.draft_seconds_per_token,
                    verify_seconds_by_len: $i.verify_seconds_by_len,
                    batch_sequences,
                    batch_rows_planned,
                };
                $crate::ScheduleLogic::next_draft_length(&mut *self.0.borrow_mut(), &input)
            }
            fn carry(&self) -> Option<::alloc::vec::Vec<u8>> {
                $crate::ScheduleLogic::carry(&*self.0.borrow())
            }
            $($extra)*
        }
        export!(Component);
    };
    ($logic:ty) => {
        // Contract 0.1 has no batch context and no per-token hook.
        $crate::schedule_component!(@with $logic, "../../../wit", |i| (0, 0), {});
    };
}

/// Makes a component exporting `specd:policy/acceptance@0.1.0` from an
/// [`AcceptanceLogic`] type (see [`schedule_component!`]).
#[macro_export]
macro_rules! acceptance_component {
    (@with $logic:ty, $wit:literal, |$p:ident| $draft:expr) => {
        $crate::component_runtime!();
        wit_bindgen::generate!({ path: $wit, world: "acceptance-policy" });
        use exports::specd::policy::acceptance as wit_acceptance;
        struct Component;
        struct State(::core::cell::RefCell<$logic>);
        impl wit_acceptance::Guest for Component {
            type Acceptor = State;
        }
        impl wit_acceptance::GuestAcceptor for State {
            fn create(config: ::alloc::string::String, vocab_size: u32) -> Result<wit_acceptance::Acceptor, ::alloc::string::String> {
                let logic = <$logic as $crate::AcceptanceLogic>::create(&config, vocab_size)?;
                Ok(wit_acceptance::Acceptor::new(State(::core::cell::RefCell::new(logic))))
            }
            fn decide(&self, positions: ::alloc::vec::Vec<wit_acceptance::Position>) -> wit_acceptance::Decision {
                let positions: ::alloc::vec::Vec<$crate::Position> = positions
                    .iter()
                    .map(|$p| {
                        let (draft_entropy, draft_top1, confidence) = $draft;
                        $crate::Position {
                            token: $p.token,
                            p: $p.p,
                            q: $p.q,
                            target_argmax: $p.target_argmax,
                            entropy: $p.entropy,
                            uniform: $p.uniform,
                            draft_entropy,
                            draft_top1,
                            confidence,
                        }
                    })
                    .collect();
                let d = $crate::AcceptanceLogic::decide(&mut *self.0.borrow_mut(), &positions);
                wit_acceptance::Decision {
                    accepted: d.accepted,
                    correction: match d.correction {
                        $crate::Correction::Residual => wit_acceptance::Correction::Residual,
                        $crate::Correction::TargetSample => wit_acceptance::Correction::TargetSample,
                        $crate::Correction::Token(t) => wit_acceptance::Correction::Token(t),
                    },
                }
            }
        }
        export!(Component);
    };
    ($logic:ty) => {
        // 0.1 positions have no draft statistics.
        $crate::acceptance_component!(@with $logic, "../../../wit", |p| (None, None, None));
    };
}

/// Makes a component exporting `specd:policy/acceptance@0.2.0` from an
/// [`AcceptanceLogic`] type: as [`acceptance_component!`], but its positions
/// carry the draft distribution's entropy and top-1 and the drafter's
/// confidence; the WIT at `$manifest/../../../wit/0.2`.
#[macro_export]
macro_rules! acceptance_component_v0_2 {
    ($logic:ty) => {
        $crate::acceptance_component!(@with $logic, "../../../wit/0.2",
            |p| (p.draft_entropy, p.draft_top1, p.confidence));
    };
}

/// Makes a component exporting `specd:policy/schedule@0.2.0` (the
/// per-token `continue-drafting` hook, the batch context) from a
/// [`ScheduleLogic`] type; as [`schedule_component!`], with the WIT at
/// `$manifest/../../../wit/0.2`.
#[macro_export]
macro_rules! schedule_component_v0_2 {
    ($logic:ty) => {
        $crate::schedule_component!(@with $logic, "../../../wit/0.2",
            |i| (i.batch_sequences, i.batch_rows_planned), {
            fn continue_drafting(&self, s: wit_schedule::DraftStep) -> bool {
                let step = $crate::DraftStep {
                    index: s.index,
                    token: s.token,
                    q: s.q,
                    entropy: s.entropy,
                    top1: s.top1,
                    k: s.k,
                };
                $crate::ScheduleLogic::continue_drafting(&mut *self.0.borrow_mut(), &step)
            }
        });
    };
}
