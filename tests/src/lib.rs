//! Shared helpers of the end-to-end tests: the real default model, loaded
//! once per test process (tests take turns through a mutex; MLX runs one
//! graph at a time).
use specd::engine::Engine;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The default model file; tests fail (never skip) when it is missing.
pub fn default_model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SPECD_TEST_GGUF") {
        return p.into();
    }
    let k = specd::store::Store::known("default").expect("default model is known");
    let p = specd::store::Store::default().path_of(k);
    assert!(
        p.exists(),
        "the default model is missing at {} (run `specd pull`)",
        p.display()
    );
    p
}

pub fn engine() -> MutexGuard<'static, Engine> {
    static E: OnceLock<Mutex<Engine>> = OnceLock::new();
    let m = E.get_or_init(|| {
        let policies = specd::cli::policy_host(None).expect("policy host");
        Mutex::new(
            Engine::load("smollm2:135m", &default_model_path(), policies)
                .expect("load the default model"),
        )
    });
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Input-grounded prompts (repeat, edit, summarize a given text or code).
pub const GROUNDED: [&str; 5] = [
    "Repeat the following text exactly: The quick brown fox jumps over the lazy dog. The early bird catches the worm. A stitch in time saves nine.",
    "Fix the typo and rewrite the sentence: Teh cat sat on the mat and looked out of the windwo at the birds.",
    "Rewrite this Python function with a docstring:\ndef add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b",
    "Summarize: The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It is named after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.",
    "Copy this list and add one more fruit at the end: apples, bananas, cherries, dates, elderberries, figs.",
];

/// Open-ended chat.
pub const OPEN: [&str; 5] = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Give me three tips for learning to cook.",
    "Why is the sky blue?",
    "Tell me a fun fact about octopuses.",
];
