//! What a model file or directory is, read from its header alone (no
//! weights loaded): its architecture, quantization, size, and whether specd
//! runs it, for `specd list` and the server's Ollama listing.
//!
//! "Runs" asks the loader's own checks (the model crate's config readers and
//! tensor decoder), so it says what loading would say, for every
//! architecture the model crate learns.
use std::collections::HashMap;
use std::path::Path;

/// A model file described.
#[derive(Debug, Clone)]
pub struct Described {
    /// `gguf` or `safetensors`.
    pub format: &'static str,
    /// GGUF `general.architecture`, or config.json's `model_type`.
    pub architecture: String,
    /// GGUF's file type (`Q4_K_M`), or a directory's quantization (`4-bit`)
    /// or weight type (`F32`).
    pub quantization: String,
    /// Bytes on disk (a directory's files together).
    pub size: u64,
    /// `Err(why)` where loading it would fail.
    pub runs: Result<(), String>,
}

/// Reads what [`Described`] holds from `path` (a GGUF file or a Hugging
/// Face directory).
pub fn describe(path: &Path) -> Described {
    let size = crate::store::size_of(path);
    if path.is_dir() {
        return describe_dir(path, size);
    }
    let meta = match specd_text::GgufFile::open(path) {
        Ok(m) => m,
        Err(e) => {
            return Described {
                format: "gguf",
                architecture: "?".into(),
                quantization: "?".into(),
                size,
                runs: Err(format!("{e:#}")),
            }
        }
    };
    let architecture = meta.architecture().unwrap_or("?").to_string();
    let quantization = meta
        .get("general.file_type")
        .and_then(|v| v.as_i128())
        .and_then(|t| file_type_name(t as u32))
        .map(str::to_string)
        .unwrap_or_else(|| most_common_type(&meta));
    Described {
        format: "gguf",
        architecture,
        quantization,
        size,
        runs: gguf_runs(&meta),
    }
}

/// What the GGUF loader checks before reading weights: the config from the
/// metadata (as specd-mlx hands it over: numbers and strings as text), and
/// that every tensor's type is one it decodes.
fn gguf_runs(meta: &specd_text::GgufMeta) -> Result<(), String> {
    let text: HashMap<String, String> = meta
        .keys()
        .filter_map(|k| {
            let v = meta.get(k)?;
            let t = match (v.as_str(), v.as_i128(), v.as_f64()) {
                (Some(s), _, _) => s.to_string(),
                (None, Some(i), _) => i.to_string(),
                (None, None, Some(f)) => f.to_string(),
                _ => return None,
            };
            Some((k.to_string(), t))
        })
        .collect();
    let has_output = meta.tensor("output.weight").is_some();
    crate::model::LlamaConfig::from_gguf(&text, has_output).map_err(|e| format!("{e:#}"))?;
    let mut seen = std::collections::HashSet::new();
    for t in &meta.tensors {
        // No rows decode from no bytes: only the type is asked.
        if seen.insert(t.ggml_type) {
            crate::model::ggml::decode(&t.name, t.ggml_type, &[], 0, 0)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// A directory: config.json's `model_type` and quantization, else the
/// weights' type from the first safetensors header.
fn describe_dir(dir: &Path, size: u64) -> Described {
    let text = std::fs::read_to_string(dir.join("config.json"));
    let cfg: serde_json::Value = text
        .as_deref()
        .ok()
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default();
    let architecture = cfg["model_type"].as_str().unwrap_or("?").to_string();
    let q = cfg
        .get("quantization")
        .or_else(|| cfg.get("quantization_config"));
    let quantization = match q {
        Some(q) => {
            let method = q["quant_method"].as_str();
            match (q["bits"].as_u64(), method) {
                (Some(b), Some(m)) => format!("{m} {b}-bit"),
                (Some(b), None) => format!("{b}-bit"),
                (None, Some(m)) => m.to_string(),
                (None, None) => "quantized".into(),
            }
        }
        None => safetensors_dtype(dir).unwrap_or_else(|| "?".into()),
    };
    let runs = match &text {
        Err(e) => Err(format!("no readable config.json: {e}")),
        Ok(t) => match crate::model::LlamaConfig::from_hf_json(t) {
            Err(e) => Err(format!("{e:#}")),
            Ok(_) => match crate::model::load::safetensors_files(dir) {
                Ok(f) if f.is_empty() => Err("no *.safetensors files".into()),
                Ok(_) => Ok(()),
                Err(e) => Err(format!("{e:#}")),
            },
        },
    };
    Described {
        format: "safetensors",
        architecture,
        quantization,
        size,
        runs,
    }
}

/// The type most of the first safetensors file's tensors have (`F32`,
/// `BF16`), from its JSON header.
fn safetensors_dtype(dir: &Path) -> Option<String> {
    use std::io::Read;
    let first = crate::model::load::safetensors_files(dir)
        .ok()?
        .into_iter()
        .next()?;
    let mut f = std::fs::File::open(first).ok()?;
    let mut n = [0u8; 8];
    f.read_exact(&mut n).ok()?;
    let n = u64::from_le_bytes(n);
    if n > 100 << 20 {
        return None;
    }
    let mut head = vec![0u8; n as usize];
    f.read_exact(&mut head).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&head).ok()?;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for (k, t) in v.as_object()? {
        if k != "__metadata__" {
            *counts.entry(t["dtype"].as_str()?).or_default() += 1;
        }
    }
    let (t, _) = counts.into_iter().max_by_key(|&(t, n)| (n, t))?;
    Some(t.to_string())
}

/// The type of most matrices (tensors of 2 dimensions), where a GGUF states
/// no file type.
fn most_common_type(meta: &specd_text::GgufMeta) -> String {
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for t in meta.tensors.iter().filter(|t| t.shape.len() >= 2) {
        *counts.entry(t.ggml_type).or_default() += 1;
    }
    counts.into_iter().max_by_key(|&(t, n)| (n, t)).map_or_else(
        || "?".into(),
        |(t, _)| specd_text::gguf::ggml_type::name(t).to_ascii_uppercase(),
    )
}

/// llama.cpp's names for `general.file_type` (its `llama_ftype`).
fn file_type_name(t: u32) -> Option<&'static str> {
    Some(match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

/// Bytes as people read them: `103 MB`, `1.3 GB`.
pub fn human_size(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.0} MB", n / 1e6)
    } else {
        format!("{:.0} KB", n / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_model_is_described_from_its_header() {
        let p = crate::store::default_model().expect("the default model (specd pull)");
        let d = describe(&p);
        assert_eq!(
            (d.format, d.architecture.as_str(), d.quantization.as_str()),
            ("gguf", "llama", "Q4_1")
        );
        assert_eq!(d.size, std::fs::metadata(&p).unwrap().len());
        assert_eq!(d.runs, Ok(()));
    }

    #[test]
    fn what_the_loader_refuses_says_why() {
        let dir = std::env::temp_dir().join(format!("specd-describe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            r#"{"model_type": "bert", "quantization": {"bits": 4, "group_size": 64}}"#,
        )
        .unwrap();
        let d = describe(&dir);
        assert_eq!(
            (d.format, d.architecture.as_str(), d.quantization.as_str()),
            ("safetensors", "bert", "4-bit")
        );
        let why = d.runs.unwrap_err();
        assert!(why.contains("bert"), "{why}");
        std::fs::write(dir.join("x.gguf"), b"not a gguf").unwrap();
        let d = describe(&dir.join("x.gguf"));
        assert!(d.runs.unwrap_err().contains("GGUF"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
