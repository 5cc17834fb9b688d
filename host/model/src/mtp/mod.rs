//! A multi-token-prediction draft head over a target's last hidden state,
//! in the EAGLE / DeepSeek-MTP shape: the next token's embedding and the
//! target's feature, each RMS-normed, projected to the hidden size, one
//! decoder layer of the target's architecture, a final norm and the
//! target's own vocabulary head (over a subset of it, EAGLE-3's reduced
//! draft vocabulary, where the head names one).
//!
//! The head's row at position i reads the target's feature f_i (the last
//! layer's output for x_0..x_i, before the final norm) and the token
//! x_{i+1}, and predicts x_{i+2}. Chained, a draft step reads the head's
//! own output at the previous position in place of f.
//!
//! Files (`specd drafter train` writes them; `host/tools/python/
//! train_head.py` trains them): `DIR/head.safetensors` and
//! `DIR/config.json` (`"format": "specd-mtp"`).
use crate::cache::LayerCache;
use crate::llama::{Layer, LayerKind, Outputs, Seq, Want};
use crate::{Linear, Llama, LlamaConfig, Logits, QuantSource, QuantizedWeight};
use anyhow::{bail, ensure, Context, Result};
use serde::Deserialize;
use specd_mlx::{io, kernels, ops, Array, Dtype};
use std::collections::HashMap;
use std::path::Path;

pub mod eagle3;

/// `config.json` of a head: the shape it was trained for.
#[derive(Debug, Clone, Deserialize)]
pub struct MtpConfig {
    pub format: String,
    pub version: u32,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub target_vocab_size: usize,
    pub draft_vocab_size: usize,
    /// How it was made (`specd drafter train`'s record), kept as it is.
    #[serde(default)]
    pub training: serde_json::Value,
}

pub struct MtpHead {
    pub config: MtpConfig,
    /// The decoder layer, final norm and draft vocabulary head as a
    /// one-layer model (its `embed` is the target's, unless the head
    /// brings its own).
    pub body: Llama,
    /// Target token id of each draft id (`None`: the whole vocabulary).
    pub draft_ids: Option<Vec<u32>>,
    /// How a row's token and feature become the layer's output.
    pub format: Box<dyn HeadFormat>,
}

/// What tells one head format from another: how a row's token and
/// feature become its layer's output. specd's own heads and MiMo's layer
/// ([`Projected`]) and EAGLE-3 heads ([`eagle3::Eagle3`]) implement it;
/// [`MtpHead`] runs either through it and asks nothing else of them.
pub trait HeadFormat: Send + Sync {
    /// The target's layer boundaries whose rows the head reads as its
    /// features ([`crate::llama::Taps`]); empty: the last layer's output.
    fn taps(&self) -> &[usize] {
        &[]
    }
    /// The layer's output rows (before the final norm) of the head `m`
    /// for the embedded tokens `e` `[1, T, hidden]` and their `features`
    /// (the target's rows, or a chained step's own output), after what
    /// `caches` hold.
    fn rows(
        &self,
        m: &Llama,
        e: &Array,
        features: &Array,
        caches: &mut [Box<dyn LayerCache>],
    ) -> Result<Array>;
    /// Whether the format's layer is the body's own (a projection in front
    /// of a target-shaped layer), so that several sequences' rows run the
    /// layer together ([`MtpHead::forward_many`]); a format that runs a
    /// layer of its own runs them one sequence at a time.
    fn batches(&self) -> bool {
        false
    }
    /// Where it [`batches`](HeadFormat::batches): the body's layer's input
    /// rows for `e` and `features` `[1, T, hidden]`.
    fn layer_input(&self, _m: &Llama, _e: &Array, _features: &Array) -> Result<Array> {
        bail!("this head format runs a layer of its own")
    }
}

/// A format [`MtpHead::load`] knows by its `config.json` other than
/// specd's own: whether a config is one of its heads, and its loader.
struct Foreign {
    claims: fn(&serde_json::Value) -> bool,
    load: fn(&Path, &str, &serde_json::Value, &Llama) -> Result<MtpHead>,
}

/// The foreign head formats, in the order they are asked.
const FOREIGN: &[Foreign] = &[
    Foreign {
        claims: eagle3::claims,
        load: eagle3::load,
    },
    Foreign {
        claims: eagle3::claims_older,
        load: eagle3::refuse_older,
    },
];

pub struct Projected {
    pub enorm: Array,
    pub hnorm: Array,
    /// `[hidden, 2 * hidden]` over `[enorm(e); hnorm(f)]`.
    pub proj: Linear,
    /// The projection reads `[hnorm(f); enorm(e)]` (MiMo's order).
    pub hidden_first: bool,
    /// The target's final norm, applied to its features first (a head
    /// trained on the normed output, as MiMo's MTP layer is).
    pub feature_norm: Option<Array>,
}

impl HeadFormat for Projected {
    fn rows(
        &self,
        m: &Llama,
        e: &Array,
        features: &Array,
        caches: &mut [Box<dyn LayerCache>],
    ) -> Result<Array> {
        let d = m.config.hidden_size as i32;
        ensure!(
            features.dim(2) == d,
            "head features {:?}, not {d} wide",
            features.shape()
        );
        let x = self.input(m, e, features)?;
        let rows = x.dim(1);
        Ok(m.layers(
            0..1,
            x,
            &mut [Seq {
                caches,
                rows,
                logits: None,
            }],
            &mut Outputs::none(),
        )?)
    }

    fn batches(&self) -> bool {
        true
    }

    fn layer_input(&self, m: &Llama, e: &Array, features: &Array) -> Result<Array> {
        self.input(m, e, features)
    }
}

impl Projected {
    /// The layer's input rows from the embedded tokens `e` and the
    /// features `f` (both `[1, T, hidden]`).
    fn input(&self, m: &Llama, e: &Array, f: &Array) -> Result<Array> {
        let e = m.rms_norm(e, &self.enorm)?;
        let f = match &self.feature_norm {
            Some(w) => m.rms_norm(f, w)?,
            None => f.clone(),
        };
        let f = m.rms_norm(&f, &self.hnorm)?;
        let both = match self.hidden_first {
            true => [&f, &e],
            false => [&e, &f],
        };
        Ok(self.proj.forward(&ops::concatenate(&both, 2)?)?)
    }
}

/// One sequence's rows for [`MtpHead::forward_many`]: tokens x_{i+1},
/// features `[1, T, hidden]`, the head caches of the sequence.
pub struct HeadIn<'a> {
    pub tokens: &'a [u32],
    pub features: &'a Array,
    pub caches: &'a mut [Box<dyn LayerCache>],
}

/// What one head forward gives back.
pub struct HeadRows {
    /// `[T, draft vocab]` float32 (`[1, draft vocab]` for `Logits::Last`).
    pub logits: Array,
    /// `[1, T, hidden]`: the layer's output, the next chained step's feature.
    pub hidden: Array,
}

/// Where a head's tensors are and what they are called: specd's own format,
/// or a published layout.
struct Parts {
    /// Tensors by name, as float32.
    tensors: HashMap<String, Array>,
    /// What the tensors came from, for errors.
    file: String,
    enorm: &'static str,
    hnorm: &'static str,
    proj: &'static str,
    /// The layer's tensors are `{layer}input_layernorm.weight`, ...
    layer: String,
    norm: &'static str,
    /// `[hnorm(f); enorm(e)]` into the projection (MiMo), not `[e; f]`.
    hidden_first: bool,
    /// The q/k/v biases (Qwen2 layers).
    qkv_bias: bool,
}

impl MtpHead {
    /// Loads a head from its directory for `target`, refusing one trained
    /// for another shape. Its matrices are quantized to 8 bits (groups of
    /// 32) where the target runs specd's packed kernels, so a draft step
    /// costs a small fraction of a target step.
    pub fn load(dir: &Path, target: &Llama) -> Result<MtpHead> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).with_context(|| {
            format!(
                "reading {} (an MTP head is a directory with config.json and head.safetensors)",
                cfg_path.display()
            )
        })?;
        let raw: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("in {}", cfg_path.display()))?;
        if raw.get("format").is_none() {
            if let Some(f) = FOREIGN.iter().find(|f| (f.claims)(&raw)) {
                return (f.load)(dir, &text, &raw, target);
            }
        }
        let config: MtpConfig =
            serde_json::from_value(raw).with_context(|| format!("in {}", cfg_path.display()))?;
        ensure!(
            config.format == "specd-mtp" && config.version == 1,
            "{}: format {:?} version {} is not a specd MTP head (\"specd-mtp\", 1)",
            cfg_path.display(),
            config.format,
            config.version
        );
        let file = dir.join("head.safetensors");
        let tensors = io::load_safetensors(&file)
            .with_context(|| format!("loading {}", file.display()))?
            .tensors
            .into_iter()
            .collect::<HashMap<String, Array>>();
        let draft_ids = match tensors.get("draft_ids") {
            None => None,
            Some(ids) => Some(
                ids.as_type(Dtype::Int32)?
                    .to_vec_i32()?
                    .into_iter()
                    .map(|i| i as u32)
                    .collect::<Vec<u32>>(),
            ),
        };
        let parts = Parts {
            tensors,
            file: file.display().to_string(),
            enorm: "enorm.weight",
            hnorm: "hnorm.weight",
            proj: "eh_proj.weight",
            layer: "layer.".into(),
            norm: "norm.weight",
            hidden_first: false,
            qkv_bias: false,
        };
        Self::build(config, parts, draft_ids, None, target)
            .with_context(|| format!("the MTP head in {}", dir.display()))
    }

    /// The MTP layer a MiMo checkpoint carries (`model.mtp_layers.0.*`, the
    /// names and math of vLLM's `vllm/model_executor/models/mimo_mtp.py`):
    /// `input_proj` over `[hidden_layernorm(h); token_layernorm(e)]` (the
    /// hidden state first), a Qwen2 decoder layer, `final_layernorm`, the
    /// model's own head. The hidden state it reads is the model's output
    /// after its final norm. `None` where the checkpoint has no MTP layer.
    pub fn from_mimo_checkpoint(dir: &Path, target: &Llama) -> Result<Option<MtpHead>> {
        // Only a MiMo config promises MTP layers: other checkpoints' files
        // are not read a second time.
        let cfg = std::fs::read_to_string(dir.join("config.json"))
            .with_context(|| format!("reading {}/config.json", dir.display()))?;
        let cfg: serde_json::Value = serde_json::from_str(&cfg)?;
        if cfg["model_type"].as_str() != Some("mimo") {
            return Ok(None);
        }
        let mut tensors = HashMap::new();
        let files = crate::load::safetensors_files(dir)?;
        const PREFIX: &str = "model.mtp_layers.0.";
        for f in &files {
            let tf = io::load_safetensors(f).with_context(|| format!("loading {}", f.display()))?;
            for (k, a) in tf.tensors {
                if let Some(rest) = k.strip_prefix(PREFIX) {
                    tensors.insert(format!("{PREFIX}{rest}"), a);
                }
            }
        }
        if tensors.is_empty() {
            return Ok(None);
        }
        if let Some(q) = tensors.keys().find(|k| k.ends_with(".scales")) {
            bail!("{q}: quantized MTP layers are not supported (specd quantizes the head itself)");
        }
        let t = &target.config;
        let config = MtpConfig {
            format: "mimo".into(),
            version: 1,
            hidden_size: t.hidden_size,
            num_attention_heads: t.num_attention_heads,
            num_key_value_heads: t.num_key_value_heads,
            head_dim: t.head_dim,
            intermediate_size: t.intermediate_size,
            target_vocab_size: t.vocab_size,
            draft_vocab_size: t.vocab_size,
            training: serde_json::Value::Null,
        };
        let parts = Parts {
            tensors,
            file: dir.display().to_string(),
            enorm: "model.mtp_layers.0.token_layernorm.weight",
            hnorm: "model.mtp_layers.0.hidden_layernorm.weight",
            proj: "model.mtp_layers.0.input_proj.weight",
            layer: PREFIX.into(),
            norm: "model.mtp_layers.0.final_layernorm.weight",
            hidden_first: true,
            qkv_bias: true,
        };
        let feature_norm = Some(target.norm.clone());
        Self::build(config, parts, None, feature_norm, target)
            .map(Some)
            .with_context(|| format!("the MTP layer of {}", dir.display()))
    }

    fn build(
        config: MtpConfig,
        parts: Parts,
        draft_ids: Option<Vec<u32>>,
        feature_norm: Option<Array>,
        target: &Llama,
    ) -> Result<MtpHead> {
        let t = &target.config;
        let want = [
            ("hidden_size", config.hidden_size, t.hidden_size),
            (
                "num_attention_heads",
                config.num_attention_heads,
                t.num_attention_heads,
            ),
            (
                "num_key_value_heads",
                config.num_key_value_heads,
                t.num_key_value_heads,
            ),
            ("head_dim", config.head_dim, t.head_dim),
            ("target_vocab_size", config.target_vocab_size, t.vocab_size),
        ];
        for (name, head, model) in want {
            ensure!(
                head == model,
                "it was trained for another model: its {name} is {head}, the model's {model}"
            );
        }
        ensure!(
            matches!(t.arch, crate::Arch::Llama),
            "MTP heads are built for llama-family targets (this model is {:?})",
            t.arch
        );
        let tensors = Tensors::new(parts.tensors, parts.file, target);
        let h = t.hidden_size;
        let shape = LayerShape {
            prefix: parts.layer,
            hidden: h,
            qkv_in: h,
            ffn: config.intermediate_size,
            qkv_bias: parts.qkv_bias,
        };
        let layer = tensors.layer(&shape, t)?;
        // The draft vocabulary's head: the target's own rows for those ids.
        let target_head = target.lm_head.as_ref().unwrap_or(&target.embed);
        let lm_head = match &draft_ids {
            Some(ids) => {
                check_draft_ids(ids, config.draft_vocab_size, t.vocab_size)?;
                let idx = Array::from_u32(ids, &[ids.len() as i32])?;
                tensors.dense_or_q8(target_head.rows(&idx)?)?
            }
            None => target_head.clone(),
        };
        let body_config = LlamaConfig {
            num_hidden_layers: 1,
            intermediate_size: config.intermediate_size,
            vocab_size: config.draft_vocab_size,
            tie_word_embeddings: false,
            sliding_window: None,
            qkv_bias: parts.qkv_bias,
            o_bias: false,
            qk_norm: false,
            ..t.clone()
        };
        let norm = tensors.vector(parts.norm, h)?;
        let body = tensors.body(body_config, target.embed.clone(), layer, norm, lm_head)?;
        let mut proj = tensors.linear(parts.proj, h, 2 * h)?;
        if tensors.quantize {
            proj = proj.pack(false)?;
        }
        Ok(MtpHead {
            format: Box::new(Projected {
                enorm: tensors.vector(parts.enorm, h)?,
                hnorm: tensors.vector(parts.hnorm, h)?,
                proj,
                hidden_first: parts.hidden_first,
                feature_norm,
            }),
            body,
            draft_ids,
            config,
        })
    }

    /// Fresh caches for the head's layer.
    pub fn new_caches(&self) -> Vec<Box<dyn LayerCache>> {
        self.body.new_caches()
    }

    /// KV bytes one position of the head's cache takes.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.body.kv_bytes_per_token()
    }

    /// The target's layer boundaries whose rows the head reads as its
    /// features ([`crate::llama::Taps`]); empty: the last layer's output.
    pub fn taps(&self) -> &[usize] {
        self.format.taps()
    }

    /// Rows for `tokens` (x_{i+1}) and `features` (`[1, T, width]`, f_i:
    /// the target's rows, or the head's own output for a chained step)
    /// after what `caches` hold, each row's rope position its cache offset;
    /// the logits of `which` rows (a catch-up over many rows drafts from
    /// its last only).
    pub fn forward(
        &self,
        tokens: &[u32],
        features: &Array,
        caches: &mut [Box<dyn LayerCache>],
        which: Logits,
    ) -> Result<HeadRows> {
        let n = tokens.len() as i32;
        let d = self.body.config.hidden_size as i32;
        ensure!(
            features.ndim() == 3 && features.dim(0) == 1 && features.dim(1) == n,
            "head features {:?} for {n} tokens",
            features.shape()
        );
        let ids = Array::from_u32(tokens, &[n])?;
        let e = self.body.embed.rows(&ids)?.reshape(&[1, n, d])?;
        let hidden = self.format.rows(&self.body, &e, features, caches)?;
        let logits = self
            .body
            .unembed(
                &hidden,
                &[Want {
                    rows: n,
                    logits: Some(which),
                }],
                &mut Outputs::none(),
            )?
            .logits()?;
        Ok(HeadRows { logits, hidden })
    }

    /// The last row's logits and every row's output of several sequences
    /// at once (the head rounds of a batched step): the matmuls over all
    /// rows together, attention per sequence over its own cache, so each
    /// row is computed as [`MtpHead::forward`] computes it alone (specd's
    /// kernels are batch-invariant). An EAGLE-3 head runs them one by one.
    pub fn forward_many(&self, items: &mut [HeadIn<'_>]) -> Result<Vec<HeadRows>> {
        let one_by_one = |items: &mut [HeadIn<'_>]| {
            items
                .iter_mut()
                .map(|it| self.forward(it.tokens, it.features, it.caches, Logits::Last))
                .collect()
        };
        if items.len() < 2 || !self.format.batches() {
            return one_by_one(items);
        }
        let d = self.body.config.hidden_size as i32;
        let tokens: Vec<u32> = items
            .iter()
            .flat_map(|it| it.tokens.iter().copied())
            .collect();
        let t = tokens.len() as i32;
        for it in items.iter() {
            ensure!(
                it.features.shape() == [1, it.tokens.len() as i32, d],
                "head features {:?} for {} tokens",
                it.features.shape(),
                it.tokens.len()
            );
        }
        let ids = Array::from_u32(&tokens, &[t])?;
        let e = self.body.embed.rows(&ids)?.reshape(&[1, t, d])?;
        let f = ops::concatenate(&items.iter().map(|it| it.features).collect::<Vec<_>>(), 1)?;
        let x = self.format.layer_input(&self.body, &e, &f)?;
        let spans = crate::llama::spans(items.iter().map(|it| it.tokens.len() as i32));
        let mut seqs: Vec<Seq<'_>> = items
            .iter_mut()
            .map(|it| Seq {
                caches: &mut *it.caches,
                rows: it.tokens.len() as i32,
                logits: Some(Logits::Last),
            })
            .collect();
        let out = self.body.layers(0..1, x, &mut seqs, &mut Outputs::none())?;
        let wants: Vec<Want> = seqs.iter().map(Seq::want).collect();
        let heads = self.body.unembed(&out, &wants, &mut Outputs::none())?;
        let logits = heads.logits.context("a logits row per sequence")?;
        let v = logits.dim(1);
        spans
            .iter()
            .enumerate()
            .map(|(i, &(a, n))| {
                let i = i as i32;
                Ok(HeadRows {
                    logits: logits.slice(&[i, 0], &[i + 1, v])?,
                    hidden: out.slice(&[0, a, 0], &[1, a + n, d])?,
                })
            })
            .collect()
    }

    /// The target token id of draft id `i`.
    pub fn target_id(&self, i: usize) -> u32 {
        match &self.draft_ids {
            Some(ids) => ids[i],
            None => i as u32,
        }
    }
}

/// Draft ids within the target's vocabulary, one per draft vocabulary
/// entry.
fn check_draft_ids(ids: &[u32], draft_vocab: usize, vocab: usize) -> Result<()> {
    ensure!(
        ids.len() == draft_vocab,
        "the draft vocabulary map holds {} ids, the config says {draft_vocab}",
        ids.len()
    );
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        bail!("draft id {bad} is outside the model's vocabulary ({vocab})");
    }
    Ok(())
}

/// A decoder layer's place among a head's tensors and its shape.
struct LayerShape {
    /// Its tensors are `{prefix}input_layernorm.weight`, ...
    prefix: String,
    hidden: usize,
    /// What q/k/v read: the hidden size, or twice it (EAGLE-3).
    qkv_in: usize,
    ffn: usize,
    qkv_bias: bool,
}

/// A head's tensors by name, read as float32 with their shapes checked,
/// and how its matrices are kept: 8-bit, groups of 32 (MLX's affine
/// layout, which the packed kernels take) where the target runs specd's
/// packed kernels, so a draft step costs a small fraction of a target
/// step; else dense.
struct Tensors {
    map: HashMap<String, Array>,
    /// What the tensors came from, for errors.
    file: String,
    quantize: bool,
    /// The target's: the head computes as it does.
    own_kernels: bool,
}

impl Tensors {
    fn new(map: HashMap<String, Array>, file: String, target: &Llama) -> Tensors {
        Tensors {
            map,
            file,
            quantize: target.own_kernels && !kernels::mlx_ops(),
            own_kernels: target.own_kernels,
        }
    }

    fn get(&self, name: &str) -> Result<Array> {
        let a =
            (self.map.get(name)).with_context(|| format!("{} has no tensor {name}", self.file))?;
        Ok(a.as_type(Dtype::Float32)?)
    }

    fn matrix(&self, name: &str, out: usize, inp: usize) -> Result<Array> {
        let w = self.get(name)?;
        ensure!(
            w.shape() == [out as i32, inp as i32],
            "{name} in {} is {:?}, not [{out}, {inp}]",
            self.file,
            w.shape()
        );
        Ok(w)
    }

    fn linear(&self, name: &str, out: usize, inp: usize) -> Result<Linear> {
        self.dense_or_q8(self.matrix(name, out, inp)?)
    }

    fn vector(&self, name: &str, n: usize) -> Result<Array> {
        let v = self.get(name)?;
        ensure!(
            v.shape() == [n as i32],
            "{name} in {} is {:?}, not [{n}]",
            self.file,
            v.shape()
        );
        Ok(v)
    }

    fn dense_or_q8(&self, w: Array) -> Result<Linear> {
        dense_or_q8(w, self.quantize)
    }

    /// The llama decoder layer at `s`, its heads as `c` says.
    fn layer(&self, s: &LayerShape, c: &LlamaConfig) -> Result<Layer> {
        let (h, nh, nkv, hd, ff) = (
            s.hidden,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            s.ffn,
        );
        let l = &s.prefix;
        let qkv_bias = match s.qkv_bias {
            false => None,
            true => {
                let b = |p: &str, n: usize| self.vector(&format!("{l}self_attn.{p}_proj.bias"), n);
                Some(ops::concatenate(
                    &[&b("q", nh * hd)?, &b("k", nkv * hd)?, &b("v", nkv * hd)?],
                    0,
                )?)
            }
        };
        let lin = |name: &str, out: usize, inp: usize| self.linear(&format!("{l}{name}"), out, inp);
        Ok(Layer {
            attn_norm: self.vector(&format!("{l}input_layernorm.weight"), h)?,
            q: lin("self_attn.q_proj.weight", nh * hd, s.qkv_in)?,
            k: lin("self_attn.k_proj.weight", nkv * hd, s.qkv_in)?,
            v: lin("self_attn.v_proj.weight", nkv * hd, s.qkv_in)?,
            o: lin("self_attn.o_proj.weight", h, nh * hd)?,
            ffn_norm: self.vector(&format!("{l}post_attention_layernorm.weight"), h)?,
            gate: lin("mlp.gate_proj.weight", ff, h)?,
            up: lin("mlp.up_proj.weight", ff, h)?,
            down: lin("mlp.down_proj.weight", h, ff)?,
            qkv: None,
            gate_up: None,
            qkv_bias,
            o_bias: None,
            q_norm: None,
            k_norm: None,
            rope: true,
            kind: LayerKind::Llama,
        })
    }

    /// The head's one-layer model, packed for the CPU kernels where its
    /// matrices are quantized (a packed embedding stays as it is).
    fn body(
        &self,
        config: LlamaConfig,
        embed: Linear,
        layer: Layer,
        norm: Array,
        lm_head: Linear,
    ) -> Result<Llama> {
        let mut body = Llama {
            config,
            embed,
            own_kernels: self.own_kernels,
            layers: vec![layer],
            norm,
            lm_head: Some(lm_head),
            flags: crate::ForwardFlags::default(),
            first_layer: 0,
        };
        if self.quantize {
            body.pack_for_cpu()?;
        }
        Ok(body)
    }
}

/// `w` `[out, in]` float32 as a linear layer: 8-bit, groups of 32 (MLX's
/// affine layout, which the packed kernels take) with `quantize`, else
/// dense.
fn dense_or_q8(w: Array, quantize: bool) -> Result<Linear> {
    if !quantize {
        return Ok(Linear::Dense(w));
    }
    let (q, scales, biases) = ops::quantize(&w, 32, 8)?;
    let src = QuantSource {
        w: q,
        scales: scales.as_type(Dtype::Float16)?,
        biases: biases.as_type(Dtype::Float16)?,
    };
    Ok(Linear::Quantized(QuantizedWeight::new(src, 32, 8)))
}
