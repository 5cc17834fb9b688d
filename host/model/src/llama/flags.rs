//! Which implementation of a step a model runs where there are two: set
//! once when the model is loaded (the engine's `Switches`), read by the
//! layers, which make the fusion choice themselves.

/// The forward's switches; the defaults are the faster paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardFlags {
    /// Attention through `kernels::attention_kv_rows` where it can (every
    /// cache of the layer a plain one); off: the per-sequence ops it
    /// replaced, to measure one against the other with one build.
    pub kv_rows: bool,
    /// A layer's o, gate/up and down matmuls as one op where they can
    /// (`kernels::layer_tail`); off: three, as `specd profile` shows them
    /// part by part.
    pub fused_tail: bool,
    /// Whether the caches attention writes in place hold f16 keys and
    /// values (half the bytes a token, and half what a step reads) instead
    /// of float32; off by default, as the float32 caches' results are the
    /// reference.
    pub kv_half: bool,
}

impl Default for ForwardFlags {
    fn default() -> ForwardFlags {
        ForwardFlags {
            kv_rows: true,
            fused_tail: true,
            kv_half: false,
        }
    }
}
