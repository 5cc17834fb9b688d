//! Which layers each rank holds: by equal weight bytes (rank 0 also holds
//! the embedding, final norm and head), or as the user counts them
//! (`--layers 14,16`).
use anyhow::{bail, Context, Result};
use std::ops::Range;
use std::path::Path;

/// Contiguous layer ranges, one per rank in rank order, covering every layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub ranges: Vec<Range<usize>>,
}

impl Split {
    /// From layer counts in rank order (`--layers`).
    pub fn from_counts(counts: &[usize], layers: usize, ranks: usize) -> Result<Split> {
        if counts.len() != ranks {
            bail!(
                "--layers gives {} counts for {ranks} ranks (one per rank, in rank order)",
                counts.len()
            );
        }
        if counts.contains(&0) {
            bail!("--layers: every rank holds at least one layer");
        }
        let sum: usize = counts.iter().sum();
        if sum != layers {
            bail!("--layers counts sum to {sum}, but the model has {layers} layers");
        }
        let mut start = 0;
        let ranges = counts
            .iter()
            .map(|&n| {
                start += n;
                start - n..start
            })
            .collect();
        Ok(Split { ranges })
    }

    /// Equal weight bytes per rank: `head` (embedding, norm, head: rank
    /// 0's) and each layer's bytes. Every rank gets at least one layer.
    pub fn by_bytes(head: u64, layers: &[u64], ranks: usize) -> Result<Split> {
        let n = layers.len();
        if ranks == 0 || ranks > n {
            bail!("{ranks} ranks for a model of {n} layers (each rank holds at least one)");
        }
        let total = head + layers.iter().sum::<u64>();
        // Bytes held once layers [0, e) are placed: head + their bytes.
        let mut upto = vec![head];
        for &b in layers {
            upto.push(upto.last().unwrap() + b);
        }
        let mut ends = Vec::with_capacity(ranks);
        let mut start = 0;
        for k in 1..ranks {
            let goal = total as f64 * k as f64 / ranks as f64;
            // Leave at least one layer for each rank after this one.
            let (lo, hi) = (start + 1, n - (ranks - k));
            let end = (lo..=hi)
                .min_by(|&a, &b| {
                    let d = |e: usize| (upto[e] as f64 - goal).abs();
                    d(a).total_cmp(&d(b))
                })
                .expect("a non-empty range");
            ends.push(end);
            start = end;
        }
        ends.push(n);
        let mut s = 0;
        let ranges = ends
            .into_iter()
            .map(|e| {
                let r = s..e;
                s = e;
                r
            })
            .collect();
        Ok(Split { ranges })
    }

    /// The split of the model at `path` for `ranks` ranks: `counts` where
    /// given, else by the weight bytes its file's headers give.
    pub fn of_model(path: &Path, ranks: usize, counts: Option<&[usize]>) -> Result<Split> {
        let (head, layers) = weight_bytes(path)
            .with_context(|| format!("reading the tensor sizes of {}", path.display()))?;
        match counts {
            Some(c) => Split::from_counts(c, layers.len(), ranks),
            None => Split::by_bytes(head, &layers, ranks),
        }
    }

    /// Layer counts in rank order (the `--layers` form).
    pub fn counts(&self) -> Vec<usize> {
        self.ranges.iter().map(|r| r.len()).collect()
    }
}

/// The layer index a tensor name belongs to (`blk.N.` in GGUF,
/// `model.layers.N.` in Hugging Face checkpoints); `None` for the rest.
pub fn layer_of(name: &str) -> Option<usize> {
    let rest = name
        .strip_prefix("blk.")
        .or_else(|| name.strip_prefix("model.layers."))?;
    rest.split('.').next()?.parse().ok()
}

/// Bytes of the weights outside the layers (embedding, norm, head) and of
/// each layer, from the file headers alone (no tensor is read).
pub fn weight_bytes(path: &Path) -> Result<(u64, Vec<u64>)> {
    let mut sizes: Vec<(String, u64)> = Vec::new();
    if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        for f in files {
            sizes.extend(safetensors_sizes(&f)?);
        }
    } else {
        let g = specd_text::gguf::GgufFile::open(path)?;
        let file_len = std::fs::metadata(path)?.len();
        let mut offs: Vec<(u64, &str)> = g
            .tensors
            .iter()
            .map(|t| (t.offset, t.name.as_str()))
            .collect();
        offs.sort();
        let end = file_len - g.data_offset;
        for (i, &(o, name)) in offs.iter().enumerate() {
            let next = offs.get(i + 1).map_or(end, |n| n.0);
            sizes.push((name.to_string(), next - o));
        }
    }
    let mut head = 0;
    let mut layers: Vec<u64> = Vec::new();
    for (name, b) in sizes {
        if name.starts_with("model.mtp_layers.") {
            continue;
        }
        match layer_of(&name) {
            Some(i) => {
                if layers.len() <= i {
                    layers.resize(i + 1, 0);
                }
                layers[i] += b;
            }
            None => head += b,
        }
    }
    if layers.is_empty() {
        bail!("no layer tensors found");
    }
    Ok((head, layers))
}

/// `(name, bytes)` of each tensor of a safetensors file, from its header.
fn safetensors_sizes(path: &Path) -> Result<Vec<(String, u64)>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)?;
    let n = u64::from_le_bytes(len);
    if n > 100 << 20 {
        bail!("{}: a safetensors header of {n} bytes", path.display());
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)?;
    let v: serde_json::Value = serde_json::from_slice(&header)?;
    let obj = v.as_object().context("the header is not an object")?;
    Ok(obj
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .filter_map(|(k, t)| {
            let o = t["data_offsets"].as_array()?;
            Some((k.clone(), o.get(1)?.as_u64()? - o.first()?.as_u64()?))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_bytes_give_rank_zero_fewer_layers() {
        // The default model's shape: a head of 8 layers' bytes, 30 layers.
        let s = Split::by_bytes(8, &[1; 30], 2).unwrap();
        assert_eq!(s.counts(), vec![11, 19]);
        let s = Split::by_bytes(0, &[1; 30], 3).unwrap();
        assert_eq!(s.counts(), vec![10, 10, 10]);
        // A head bigger than a share still leaves rank 0 a layer.
        let s = Split::by_bytes(100, &[1; 4], 2).unwrap();
        assert_eq!(s.counts(), vec![1, 3]);
        assert!(Split::by_bytes(0, &[1; 2], 3).is_err());
    }

    #[test]
    fn counts_must_cover_the_model() {
        assert_eq!(
            Split::from_counts(&[14, 16], 30, 2).unwrap().ranges,
            vec![0..14, 14..30]
        );
        let e = |c: &[usize]| format!("{:#}", Split::from_counts(c, 30, 2).unwrap_err());
        assert!(e(&[14, 15]).contains("sum to 29"), "{}", e(&[14, 15]));
        assert!(e(&[30]).contains("1 counts for 2 ranks"));
        assert!(e(&[0, 30]).contains("at least one"));
    }

    #[test]
    fn layer_names() {
        assert_eq!(layer_of("blk.12.attn_q.weight"), Some(12));
        assert_eq!(layer_of("model.layers.3.mlp.up_proj.weight"), Some(3));
        assert_eq!(layer_of("token_embd.weight"), None);
        assert_eq!(layer_of("model.norm.weight"), None);
    }
}
