//! Reading and writing tensor files through MLX (GGUF, safetensors).
use crate::array::wrap;
use crate::bridge::ffi;
use crate::{Array, Exception, Result};
use std::path::Path;

/// Tensors (and string metadata) read from or written to a file.
pub struct TensorFile {
    pub tensors: Vec<(String, Array)>,
    pub metadata: Vec<(String, String)>,
}

fn read_map(m: &ffi::ArrayMap) -> Result<TensorFile> {
    let mut tensors = Vec::new();
    let mut keys = ffi::map_keys(m);
    keys.sort();
    for k in keys {
        let a = wrap(ffi::map_get(m, &k))?;
        tensors.push((k, a));
    }
    let mut metadata = Vec::new();
    for k in ffi::map_meta_keys(m) {
        let v = ffi::map_meta_get(m, &k)?;
        metadata.push((k, v));
    }
    metadata.sort();
    Ok(TensorFile { tensors, metadata })
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .ok_or_else(|| Exception(format!("path is not UTF-8: {}", p.display())))
}
/// GGUF through MLX's own reader: Q4_0/Q4_1/Q8_0 tensors come back as MLX
/// affine-quantized triples (`X.weight`, `X.scales`, `X.biases`, group 32).
/// Only string metadata is returned; read the rest with a GGUF parser.
pub fn load_gguf(path: &Path) -> Result<TensorFile> {
    let m = ffi::load_gguf(path_str(path)?)?;
    read_map(&m)
}
pub fn load_safetensors(path: &Path) -> Result<TensorFile> {
    let m = ffi::load_safetensors(path_str(path)?)?;
    read_map(&m)
}
pub fn save_safetensors(
    path: &Path,
    tensors: &[(String, Array)],
    metadata: &[(String, String)],
) -> Result<()> {
    let mut m = ffi::new_map();
    for (k, a) in tensors {
        ffi::map_insert(m.pin_mut(), k, &a.0);
    }
    for (k, v) in metadata {
        ffi::map_insert_meta(m.pin_mut(), k, v);
    }
    Ok(ffi::save_safetensors(path_str(path)?, &m)?)
}
