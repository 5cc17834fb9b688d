//! How a model is loaded: what every command that loads one takes from the
//! global flags (the CLI and the server alike). A leaf: it knows the model
//! crate only, so the engine and the pipeline ranks both read it.
use crate::model::ForwardFlags;

/// The global flags a model is loaded with.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub weights: crate::model::WeightMode,
    /// Installed for the process before loading ([`crate::model::Kernels::install`]).
    pub kernels: crate::model::Kernels,
    pub switches: Switches,
}

/// Switches between two implementations of one step, to measure one against
/// the other with one build. The defaults are the faster paths; the CLI
/// sets them (hidden flags), the model and the sequence read no environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switches {
    /// Attention as one op per layer over every sequence's cache rows
    /// ([`ForwardFlags::kv_rows`]); off: the per-sequence ops it replaced.
    pub kv_rows: bool,
    /// A layer's o, gate/up and down matmuls as one op
    /// ([`ForwardFlags::fused_tail`]); off: three.
    pub fused_tail: bool,
    /// Requests' default for a sequence's `Settings::light_rounds`.
    pub light_rounds: bool,
    /// 16-bit KV caches ([`ForwardFlags::kv_half`]): off by default, as the
    /// float32 caches' results are the reference.
    pub kv_f16: bool,
}

impl Default for Switches {
    fn default() -> Switches {
        Switches {
            kv_rows: true,
            fused_tail: true,
            light_rounds: true,
            kv_f16: false,
        }
    }
}

impl Switches {
    /// The forward's switches, which a model is loaded with
    /// (`specd_model::load_model_part`) and runs for its life.
    pub fn flags(&self) -> ForwardFlags {
        ForwardFlags {
            kv_rows: self.kv_rows,
            fused_tail: self.fused_tail,
            kv_half: self.kv_f16,
        }
    }
}
