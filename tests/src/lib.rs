//! Shared helpers of the end-to-end tests: the real default model, loaded
//! once per test process (tests take turns through a mutex; MLX runs one
//! graph at a time).
use specd::engine::Engine;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The default model file, where `specd pull` puts it (fetched when
/// missing); tests fail, never skip, when it cannot be had.
pub fn default_model_path() -> PathBuf {
    specd::store::default_model().expect("the default model (specd pull)")
}

pub fn engine() -> MutexGuard<'static, Engine> {
    static E: OnceLock<Mutex<Engine>> = OnceLock::new();
    default_model_engine(&E, specd::model::WeightMode::default())
}

/// The default model with 8-bit activations (`--weights int8`).
pub fn int8_engine() -> MutexGuard<'static, Engine> {
    static E: OnceLock<Mutex<Engine>> = OnceLock::new();
    default_model_engine(&E, specd::model::WeightMode::Int8)
}

fn default_model_engine(
    cell: &'static OnceLock<Mutex<Engine>>,
    mode: specd::model::WeightMode,
) -> MutexGuard<'static, Engine> {
    let m = cell.get_or_init(|| {
        let policies = specd::cli::policy_host(None).expect("policy host");
        Mutex::new(
            Engine::load("smollm2:135m", &default_model_path(), policies, mode)
                .expect("load the default model"),
        )
    });
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Gemma 3 270M (the second model family: K-quants, sliding-window layers),
/// fetched like the default model; loaded once per test process.
pub fn gemma_engine() -> MutexGuard<'static, Engine> {
    static E: OnceLock<Mutex<Engine>> = OnceLock::new();
    let m = E.get_or_init(|| {
        let path =
            specd::store::known_model(specd::store::GEMMA_MODEL).expect("gemma3:270m (specd pull)");
        let policies = specd::cli::policy_host(None).expect("policy host");
        Mutex::new(
            Engine::load(
                specd::store::GEMMA_MODEL,
                &path,
                policies,
                specd::model::WeightMode::default(),
            )
            .expect("load gemma3:270m"),
        )
    });
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The prompt suites of `specd bench spec`: input-grounded (repeat, edit,
/// summarize a given text), open-ended chat, code editing, and one task
/// type over several requests.
pub use specd::bench::{CODE_EDIT, GROUNDED, OPEN, REPETITIVE};
