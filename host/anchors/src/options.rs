//! What an anchor run is asked ([`Options`]) and what one engine measures
//! ([`Prefill`], [`Decode`]): shared by the runner (`anchors`) and the
//! Python side (`python`).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub struct Options {
    /// A subset of [`ENGINES`].
    pub engines: Vec<String>,
    pub max_tokens: usize,
    /// Length of the prefill prompt, in tokens.
    pub prefill_tokens: usize,
    pub threads: usize,
    /// Timed prefill runs per engine (the median counts).
    pub reps: usize,
    pub verify_context: usize,
    pub verify_reps: usize,
    /// pip-install a missing anchor package.
    pub install: bool,
    /// Preload this BLAS into mlx-lm's process (the wheel's own is reference BLAS).
    pub mlx_lm_blas: Option<PathBuf>,
    pub python: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prefill {
    pub prompt_tokens: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
    pub reps: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Decode {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
}
