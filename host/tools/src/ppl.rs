//! `specd bench ppl`: perplexity over a text with llama.cpp's
//! `llama-perplexity` protocol, and the divergence of one run's
//! distributions from a saved run of another mode (its
//! `--kl-divergence-base` / `--kl-divergence`).
//!
//! The protocol, as `llama-perplexity` runs it: the whole text is tokenized
//! once (BOS first where the model's tokenizer adds one); the tail shorter
//! than `ctx` is dropped; chunk `c` is tokens `c ctx .. (c + 1) ctx`, its
//! first token replaced by BOS where the tokenizer adds BOS, run from empty
//! caches; the logits at positions `ctx/2 .. ctx-2` score the tokens at
//! `ctx/2 + 1 .. ctx-1` (255 for a chunk of 512). The perplexity is
//! `exp(mean nll)`, its standard error `sd(nll) / sqrt(n - 1) * ppl` (sd
//! over the n tokens scored).
//!
//! The saved distributions (`--save-logits`) are not llama.cpp's 16-bit
//! log-probabilities of the whole vocabulary (98 KB a token on a 49k
//! vocabulary): per scored token, the top `k` log-probabilities with their
//! ids and the probability mass of every other token, which is
//! `8 + 8 k` bytes a token (520 at the default k = 64). The KL divergence
//! is then taken over those k + 1 outcomes (the k tokens and "any other"),
//! a coarse-graining of the vocabulary, which never exceeds the full
//! divergence and misses only how the rest's mass is spread.
use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;
use specd::engine::Engine;
use specd::model::llama::{self, Outputs, Seq, Want};
use specd_mlx::Dtype;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The saved file's first bytes.
const MAGIC: &[u8; 8] = b"SPECDKL1";

/// What a run measures over.
#[derive(Debug, Clone)]
pub struct Protocol {
    pub ctx: usize,
    /// At most this many chunks (None: every whole chunk of the text).
    pub chunks: Option<usize>,
    /// Top log-probabilities kept per token in a saved run.
    pub top_k: usize,
}

/// The chunks of `tokens` the protocol scores: whole chunks of `ctx`
/// tokens, the first one BOS where `bos` is given.
pub fn chunks_of(
    tokens: &[u32],
    ctx: usize,
    max: Option<usize>,
    bos: Option<u32>,
) -> Vec<Vec<u32>> {
    let n = (tokens.len() / ctx).min(max.unwrap_or(usize::MAX));
    (0..n)
        .map(|c| {
            let mut ids = tokens[c * ctx..(c + 1) * ctx].to_vec();
            if let Some(b) = bos {
                ids[0] = b;
            }
            ids
        })
        .collect()
}

/// One scored token: its negative log-likelihood, the top log-probabilities
/// (descending) and the mass of every other token.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub nll: f64,
    pub rest: f64,
    pub top: Vec<(u32, f32)>,
}

/// A row's log-softmax normalizer: max + ln(sum exp(l - max)), in f64.
fn log_norm(row: &[f32]) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    max + sum.ln()
}

/// Scores one row of logits against the token that follows.
pub fn score_row(row: &[f32], next: u32, k: usize) -> Scored {
    let norm = log_norm(row);
    let nll = norm - row[next as usize] as f64;
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let k = k.min(row.len()).max(1);
    // Ties by id, so the order is a function of the row alone.
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    idx.select_nth_unstable_by(k - 1, cmp);
    let mut top: Vec<u32> = idx[..k].to_vec();
    top.sort_by(cmp);
    let mut kept = vec![false; row.len()];
    for &i in &top {
        kept[i as usize] = true;
    }
    let rest: f64 = row
        .iter()
        .enumerate()
        .filter(|(i, _)| !kept[*i])
        .map(|(_, &l)| (l as f64 - norm).exp())
        .sum();
    Scored {
        nll,
        rest,
        top: top
            .iter()
            .map(|&i| (i, (row[i as usize] as f64 - norm) as f32))
            .collect(),
    }
}

/// KL(base || this row) over base's top tokens and the rest, and whether
/// the row's argmax is base's.
pub fn kl_row(base: &Scored, row: &[f32]) -> (f64, bool) {
    let norm = log_norm(row);
    let mut kl = 0.0;
    let mut kept_q = 0.0;
    for &(id, lp) in &base.top {
        let lq = row[id as usize] as f64 - norm;
        let p = (lp as f64).exp();
        kl += p * (lp as f64 - lq);
        kept_q += lq.exp();
    }
    if base.rest > 0.0 {
        let q_rest = (1.0 - kept_q).max(f64::MIN_POSITIVE);
        kl += base.rest * (base.rest.ln() - q_rest.ln());
    }
    let argmax = row
        .iter()
        .enumerate()
        .fold((0usize, f32::NEG_INFINITY), |(bi, bl), (i, &l)| {
            if l > bl {
                (i, l)
            } else {
                (bi, bl)
            }
        })
        .0;
    (
        kl.max(0.0),
        base.top.first().map(|t| t.0 as usize) == Some(argmax),
    )
}

/// Perplexity and its standard error from the tokens' nll, as
/// llama-perplexity computes them.
pub fn perplexity(nll: &[f64]) -> (f64, f64) {
    let n = nll.len() as f64;
    let mean = nll.iter().sum::<f64>() / n;
    let mean2 = nll.iter().map(|v| v * v).sum::<f64>() / n;
    let ppl = mean.exp();
    let var = mean2 - mean * mean;
    let err = if var > 0.0 && n > 1.0 {
        (var / (n - 1.0)).sqrt() * ppl
    } else {
        0.0
    };
    (ppl, err)
}

/// The divergence from a saved run.
#[derive(Debug, Clone, Serialize)]
pub struct Divergence {
    pub base: String,
    pub base_perplexity: f64,
    /// This run's perplexity over base's, on the same tokens.
    pub ppl_ratio: f64,
    pub kl_mean: f64,
    pub kl_mean_stderr: f64,
    pub kl_p99: f64,
    pub kl_max: f64,
    /// Share of tokens whose argmax is base's.
    pub top1_agreement: f64,
    pub top_k: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub model: String,
    /// `quantized`, `int8` or `f32`; the kernels; the KV cache dtype.
    pub mode: String,
    pub file: String,
    pub ctx: usize,
    pub chunks: usize,
    pub bos: bool,
    pub tokens_scored: usize,
    pub perplexity: f64,
    pub perplexity_stderr: f64,
    pub mean_nll: f64,
    pub seconds: f64,
    pub divergence: Option<Divergence>,
}

/// The header of a saved run.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct SavedHeader {
    label: String,
    ctx: usize,
    chunks: usize,
    scored: usize,
    top_k: usize,
    vocab: usize,
    perplexity: f64,
}

struct Saved {
    header: SavedHeader,
    tokens: Vec<u32>,
    rows: Vec<Scored>,
}

fn write_saved(path: &Path, h: &SavedHeader, chunks: &[Vec<u32>], rows: &[Scored]) -> Result<()> {
    let mut out = Vec::with_capacity(64 + rows.len() * (8 + 8 * h.top_k));
    out.extend_from_slice(MAGIC);
    let json = serde_json::to_vec(h)?;
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    for t in chunks.iter().flatten() {
        out.extend_from_slice(&t.to_le_bytes());
    }
    for r in rows {
        out.extend_from_slice(&(r.nll as f32).to_le_bytes());
        out.extend_from_slice(&(r.rest as f32).to_le_bytes());
        for &(id, lp) in &r.top {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&lp.to_le_bytes());
        }
    }
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(&out)
        .with_context(|| format!("writing {}", path.display()))
}

fn read_saved(path: &Path) -> Result<Saved> {
    let mut b = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut b))
        .with_context(|| format!("reading {}", path.display()))?;
    let bad = || format!("{} is not a `bench ppl --save-logits` file", path.display());
    ensure!(b.len() >= 12 && &b[..8] == MAGIC, bad());
    let mut at = 8;
    let u32_at = |at: &mut usize| -> Result<u32> {
        let v = b
            .get(*at..*at + 4)
            .with_context(|| format!("{} is truncated", path.display()))?;
        *at += 4;
        Ok(u32::from_le_bytes(v.try_into().unwrap()))
    };
    let len = u32_at(&mut at)? as usize;
    let header: SavedHeader = serde_json::from_slice(
        b.get(at..at + len)
            .with_context(|| format!("{} is truncated", path.display()))?,
    )
    .with_context(bad)?;
    at += len;
    let ntok = header.chunks * header.ctx;
    let rows_n = header.chunks * header.scored;
    let need = at + 4 * ntok + rows_n * (8 + 8 * header.top_k);
    ensure!(
        b.len() == need,
        "{} holds {} bytes, its header says {need}",
        path.display(),
        b.len()
    );
    let f32_at = |at: &mut usize| -> f32 {
        let v = f32::from_le_bytes(b[*at..*at + 4].try_into().unwrap());
        *at += 4;
        v
    };
    let u32_at = |at: &mut usize| -> u32 {
        let v = u32::from_le_bytes(b[*at..*at + 4].try_into().unwrap());
        *at += 4;
        v
    };
    let tokens = (0..ntok).map(|_| u32_at(&mut at)).collect();
    let mut rows = Vec::with_capacity(rows_n);
    for _ in 0..rows_n {
        let nll = f32_at(&mut at) as f64;
        let rest = f32_at(&mut at) as f64;
        let top = (0..header.top_k)
            .map(|_| {
                let id = u32_at(&mut at);
                (id, f32_at(&mut at))
            })
            .collect();
        rows.push(Scored { nll, rest, top });
    }
    Ok(Saved {
        header,
        tokens,
        rows,
    })
}

/// The engine's mode in words (`quantized, specd kernels, f32 KV`).
pub fn mode_of(e: &Engine) -> String {
    let kernels = match specd_mlx::kernels::mlx_ops() {
        true => "mlx kernels",
        false => "specd kernels",
    };
    let kv = if e.switches.kv_f16 {
        "f16 KV"
    } else {
        "f32 KV"
    };
    format!("{}, {kernels}, {kv}", e.weights.name())
}

/// Runs the protocol over `file` on the engine's model; saves the scored
/// distributions to `save`, compares with the saved run `base`.
pub fn run(
    e: &Engine,
    file: &Path,
    p: &Protocol,
    save: Option<&PathBuf>,
    base: Option<&PathBuf>,
    progress: &mut dyn FnMut(&str),
) -> Result<Report> {
    ensure!(
        p.ctx >= 4,
        "--ctx must be at least 4 (half of it is scored)"
    );
    ensure!(
        p.ctx <= e.context_length(),
        "--ctx {} is over the model's context length of {} tokens",
        p.ctx,
        e.context_length()
    );
    ensure!(p.top_k >= 1, "--kl-top-k must be at least 1");
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading {} (a UTF-8 text)", file.display()))?;
    let t0 = std::time::Instant::now();
    let tokens = e.tokenizer.encode_prompt(&text)?;
    let bos = match e.tokenizer.add_bos() {
        true => e.tokenizer.bos_id(),
        false => None,
    };
    let chunks = chunks_of(&tokens, p.ctx, p.chunks, bos);
    if chunks.is_empty() {
        bail!(
            "{} is {} tokens, less than one chunk of --ctx {}",
            file.display(),
            tokens.len(),
            p.ctx
        );
    }
    let base = base.map(|b| read_saved(b)).transpose()?;
    let first = p.ctx / 2;
    let scored = p.ctx - 1 - first;
    if let Some(b) = &base {
        let h = &b.header;
        ensure!(
            h.ctx == p.ctx && h.chunks == chunks.len() && b.tokens == chunks.concat(),
            "the base run scored other tokens ({} chunks of {} against {} of {} here): same file, --ctx and --chunks",
            h.chunks,
            h.ctx,
            chunks.len(),
            p.ctx
        );
    }
    let m = &e.model;
    let mut nll = Vec::with_capacity(chunks.len() * scored);
    let mut saved = Vec::new();
    let mut kl = Vec::new();
    let mut same = 0usize;
    let mut vocab = 0usize;
    let d = m.config.hidden_size as i32;
    for (c, ids) in chunks.iter().enumerate() {
        let mut caches = m.new_caches();
        let mut seq = [Seq {
            caches: &mut caches,
            rows: ids.len() as i32,
            logits: None,
        }];
        let x = m.embed(&llama::ids(ids)?)?;
        let h = m.layers(m.layer_count(), x, &mut seq, &mut Outputs::none())?;
        // Only the scored rows go through the head (its matmul is a row's
        // alone on either kernels, so these are the rows a full run has).
        let h = h.slice(&[0, first as i32, 0], &[1, (p.ctx - 1) as i32, d])?;
        let want = Want {
            rows: h.dim(1),
            logits: Some(specd::model::Logits::All),
        };
        let logits = m
            .unembed(&h, &[want], &mut Outputs::none())?
            .logits()?
            .as_type(Dtype::Float32)?;
        logits.eval()?;
        vocab = logits.dim(1) as usize;
        let v = logits.to_vec_f32()?;
        drop(caches);
        for (i, row) in v.chunks(vocab).enumerate() {
            let next = ids[first + i + 1];
            ensure!(
                (next as usize) < vocab,
                "token id {next} is outside the logits' vocabulary ({vocab})"
            );
            if let Some(b) = &base {
                let (k, top1) = kl_row(&b.rows[c * scored + i], row);
                kl.push(k);
                same += top1 as usize;
            }
            let s = match save {
                Some(_) => score_row(row, next, p.top_k),
                None => Scored {
                    nll: log_norm(row) - row[next as usize] as f64,
                    rest: 0.0,
                    top: Vec::new(),
                },
            };
            nll.push(s.nll);
            if save.is_some() {
                saved.push(s);
            }
        }
        let (ppl, _) = perplexity(&nll);
        let secs = t0.elapsed().as_secs_f64();
        let left = secs / (c + 1) as f64 * (chunks.len() - c - 1) as f64;
        progress(&format!(
            "[{}/{}] perplexity {ppl:.4} ({:.1} s a chunk, ~{left:.0} s left)",
            c + 1,
            chunks.len(),
            secs / (c + 1) as f64
        ));
    }
    let (ppl, err) = perplexity(&nll);
    let mean_nll = nll.iter().sum::<f64>() / nll.len() as f64;
    let mode = mode_of(e);
    if let Some(path) = save {
        let h = SavedHeader {
            label: format!("{} ({mode})", e.name),
            ctx: p.ctx,
            chunks: chunks.len(),
            scored,
            top_k: p.top_k.min(vocab),
            vocab,
            perplexity: ppl,
        };
        write_saved(path, &h, &chunks, &saved)?;
    }
    let divergence = base.map(|b| {
        let n = kl.len() as f64;
        let kl_mean = kl.iter().sum::<f64>() / n;
        let kl_var = kl.iter().map(|v| (v - kl_mean).powi(2)).sum::<f64>() / n;
        let mut sorted = kl.clone();
        sorted.sort_by(f64::total_cmp);
        let base_nll: Vec<f64> = b.rows.iter().map(|r| r.nll).collect();
        let (base_ppl, _) = perplexity(&base_nll);
        let base_mean = base_nll.iter().sum::<f64>() / n;
        Divergence {
            base: b.header.label.clone(),
            base_perplexity: base_ppl,
            ppl_ratio: (mean_nll - base_mean).exp(),
            kl_mean,
            kl_mean_stderr: if n > 1.0 {
                (kl_var / (n - 1.0)).sqrt()
            } else {
                0.0
            },
            kl_p99: percentile(&sorted, 0.99),
            kl_max: *sorted.last().unwrap_or(&0.0),
            top1_agreement: same as f64 / n,
            top_k: b.header.top_k,
        }
    });
    Ok(Report {
        model: e.name.clone(),
        mode,
        file: file.display().to_string(),
        ctx: p.ctx,
        chunks: chunks.len(),
        bos: bos.is_some(),
        tokens_scored: nll.len(),
        perplexity: ppl,
        perplexity_stderr: err,
        mean_nll,
        seconds: t0.elapsed().as_secs_f64(),
        divergence,
    })
}

/// The `q` quantile of sorted values (linear between the two nearest).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let x = q * (sorted.len() - 1) as f64;
    let (i, f) = (x.floor() as usize, x - x.floor());
    let j = (i + 1).min(sorted.len() - 1);
    sorted[i] + f * (sorted[j] - sorted[i])
}

/// The report as text.
pub fn text(r: &Report) -> String {
    let mut s = format!(
        "{} ({}), {}: {} chunks of {} tokens (BOS first: {}), {} tokens scored\nperplexity: {:.4} +/- {:.4}\n",
        r.model,
        r.mode,
        r.file,
        r.chunks,
        r.ctx,
        if r.bos { "yes" } else { "no" },
        r.tokens_scored,
        r.perplexity,
        r.perplexity_stderr
    );
    if let Some(d) = &r.divergence {
        s += &format!(
            "against {} (perplexity {:.4}):\n  perplexity ratio: {:.4}\n  mean KL divergence: {:.4e} +/- {:.1e}\n  99th percentile KL: {:.4e}\n  max KL: {:.4e}\n  top-1 agreement: {:.2}%\n  (KL over the base's top {} tokens and the rest)\n",
            d.base,
            d.base_perplexity,
            d.ppl_ratio,
            d.kl_mean,
            d.kl_mean_stderr,
            d.kl_p99,
            d.kl_max,
            100.0 * d.top1_agreement,
            d.top_k
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_drop_the_tail_and_put_bos_first() {
        let t: Vec<u32> = (10..30).collect();
        let c = chunks_of(&t, 8, None, Some(1));
        assert_eq!(c.len(), 2);
        assert_eq!(c[0], vec![1, 11, 12, 13, 14, 15, 16, 17]);
        assert_eq!(c[1][0], 1);
        assert_eq!(c[1][1], 19);
        assert_eq!(
            chunks_of(&t, 8, Some(1), None),
            vec![(10..18).collect::<Vec<_>>()]
        );
    }

    #[test]
    fn perplexity_and_error_follow_llama_perplexity() {
        let nll = [1.0, 2.0, 3.0, 2.0];
        let (ppl, err) = perplexity(&nll);
        assert!((ppl - 2f64.exp()).abs() < 1e-12);
        // population variance 0.5, / (n - 1) = 3
        assert!((err - (0.5f64 / 3.0).sqrt() * ppl).abs() < 1e-12);
    }

    #[test]
    fn kl_of_a_row_against_itself_is_zero_and_against_another_positive() {
        let row: Vec<f32> = (0..50).map(|i| ((i * 7) % 13) as f32 * 0.3).collect();
        let s = score_row(&row, 3, 5);
        assert_eq!(s.top.len(), 5);
        assert!(s.top.windows(2).all(|w| w[0].1 >= w[1].1));
        let (kl, top1) = kl_row(&s, &row);
        assert!(kl.abs() < 1e-6 && top1, "{kl}");
        let other: Vec<f32> = row.iter().rev().copied().collect();
        let (kl, _) = kl_row(&s, &other);
        assert!(kl > 0.01);
        let total: f64 = s.top.iter().map(|t| (t.1 as f64).exp()).sum::<f64>() + s.rest;
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn saved_runs_read_back() {
        let dir = std::env::temp_dir().join(format!("specd-ppl-{}", std::process::id()));
        let row: Vec<f32> = (0..20).map(|i| i as f32 * 0.1).collect();
        let rows = vec![score_row(&row, 2, 3), score_row(&row, 7, 3)];
        let h = SavedHeader {
            label: "x".into(),
            ctx: 4,
            chunks: 2,
            scored: 1,
            top_k: 3,
            vocab: 20,
            perplexity: 1.5,
        };
        write_saved(&dir, &h, &[vec![1, 2, 3, 4], vec![5, 6, 7, 8]], &rows).unwrap();
        let s = read_saved(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(s.tokens, (1..9).collect::<Vec<u32>>());
        assert_eq!(s.rows.len(), 2);
        assert_eq!(s.rows[1].top, rows[1].top);
        assert!((s.rows[0].nll - rows[0].nll).abs() < 1e-6);
    }
}
