use super::*;

fn hf(extra: serde_json::Value) -> Result<LlamaConfig> {
    let mut v = serde_json::json!({
        "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 512,
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    LlamaConfig::from_hf_json(&v.to_string())
}

#[test]
fn model_type_picks_the_options() {
    let c = hf(serde_json::json!({"model_type": "qwen2", "head_dim": 64, "sliding_window": 4096, "use_sliding_window": false})).unwrap();
    assert_eq!((c.qkv_bias, c.o_bias, c.qk_norm), (true, false, false));
    assert_eq!(c.head_dim, 32, "Qwen2 divides, whatever head_dim says");
    assert_eq!(c.sliding_window, None, "Qwen's window is off unless used");
    assert_eq!(c.rope_theta, 1e6);
    let c =
        hf(serde_json::json!({"model_type": "qwen3", "head_dim": 64, "rope_theta": 5e5})).unwrap();
    assert_eq!((c.qkv_bias, c.o_bias, c.qk_norm), (false, false, true));
    assert_eq!((c.head_dim, c.rope_theta), (64, 5e5));
    let c = hf(serde_json::json!({"model_type": "mistral", "sliding_window": 4096})).unwrap();
    assert_eq!((c.qkv_bias, c.qk_norm, c.head_dim), (false, false, 32));
    assert_eq!(c.sliding_window, Some(4096));
    let c = hf(
        serde_json::json!({"model_type": "llama", "attention_bias": true, "sliding_window": null}),
    )
    .unwrap();
    assert_eq!((c.qkv_bias, c.o_bias, c.sliding_window), (true, true, None));
}

#[test]
fn what_the_forward_would_get_wrong_is_an_error() {
    let err = |extra| format!("{:#}", hf(extra).unwrap_err());
    let e = err(serde_json::json!({"model_type": "olmo"}));
    assert!(
        e.contains("\"olmo\"") && e.contains("llama, mistral, qwen2, qwen3"),
        "{e}"
    );
    let e = err(serde_json::json!({"model_type": "qwen3"}));
    assert!(e.contains("head_dim"), "{e}");
    let e = err(serde_json::json!({"model_type": "qwen2", "use_sliding_window": true}));
    assert!(e.contains("use_sliding_window"), "{e}");
    let e = err(serde_json::json!({"rope_scaling": {"rope_type": "longrope", "factor": 8.0}}));
    assert!(e.contains("original_max_position_embeddings"), "{e}");
    let e = err(serde_json::json!({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}));
    assert!(e.contains("yarn") && e.contains("factor"), "{e}");
    let e = err(serde_json::json!({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}));
    assert!(e.contains("dynamic"), "{e}");
    let e = err(serde_json::json!({"partial_rotary_factor": 0.5}));
    assert!(e.contains("partial_rotary_factor"), "{e}");
    let e = err(serde_json::json!({"layer_types": ["full_attention", "sliding_attention"]}));
    assert!(e.contains("sliding_attention"), "{e}");
    let e = err(serde_json::json!({"mlp_bias": true}));
    assert!(e.contains("mlp_bias"), "{e}");
    assert!(
        hf(serde_json::json!({"rope_scaling": null, "layer_types": ["full_attention"]})).is_ok()
    );
    let c = hf(
        serde_json::json!({"model_type": "qwen3", "head_dim": 64, "rope_parameters": {"rope_type": "default", "rope_theta": 2e6}}),
    );
    assert_eq!(c.unwrap().rope_theta, 2e6);
}

fn gguf(arch: &str, extra: &[(&str, &str)]) -> Result<LlamaConfig> {
    let mut meta: HashMap<String, String> = [
        ("embedding_length", "128"),
        ("block_count", "2"),
        ("attention.head_count", "4"),
        ("attention.head_count_kv", "2"),
        ("feed_forward_length", "256"),
    ]
    .iter()
    .map(|(k, v)| (format!("{arch}.{k}"), v.to_string()))
    .collect();
    meta.insert("general.architecture".into(), arch.into());
    for (k, v) in extra {
        meta.insert(format!("{arch}.{k}"), v.to_string());
    }
    LlamaConfig::from_gguf(&meta, false)
}

#[test]
fn gguf_architectures_pick_the_options() {
    let c = gguf("llama", &[]).unwrap();
    assert!(c.rope_traditional, "llama.cpp permutes llama's q/k");
    assert_eq!((c.qkv_bias, c.qk_norm, c.head_dim), (false, false, 32));
    let c = gguf("qwen2", &[("rope.freq_base", "1000000")]).unwrap();
    assert!(!c.rope_traditional, "Qwen2's q/k are not permuted");
    assert_eq!((c.qkv_bias, c.qk_norm, c.rope_theta), (true, false, 1e6));
    let c = gguf("qwen3", &[("attention.key_length", "64")]).unwrap();
    assert!(!c.rope_traditional);
    assert_eq!((c.qkv_bias, c.qk_norm, c.head_dim), (false, true, 64));
    let c = gguf("phi3", &[("attention.sliding_window", "2047")]).unwrap();
    assert!(!c.rope_traditional, "Phi-3's q/k are not permuted");
    assert_eq!(
        (c.sliding_window, c.is_local(0), c.head_dim),
        (Some(2047), true, 32)
    );
    let c = gguf("phi3", &[("rope.dimension_count", "24")]).unwrap();
    assert_eq!(
        (c.rope_dims, c.rotary_dims(), c.head_dim),
        (Some(24), 24, 32)
    );
    let e = format!(
        "{:#}",
        gguf(
            "qwen3",
            &[
                ("attention.key_length", "32"),
                ("rope.dimension_count", "24")
            ]
        )
        .unwrap_err()
    );
    assert!(e.contains("rope.dimension_count 24"), "{e}");
    let c = gguf("phi3", &[("attention.sliding_window", "0")]).unwrap();
    assert_eq!(c.sliding_window, None, "0: Phi-4-mini's no window");
    // YaRN (Qwen 2.5's long-context files).
    let c = gguf(
        "qwen2",
        &[
            ("rope.freq_base", "1000000"),
            ("rope.scaling.type", "yarn"),
            ("rope.scaling.factor", "4"),
            ("rope.scaling.original_context_length", "32"),
        ],
    )
    .unwrap();
    let f = crate::llama::rope::yarn(4.0, 32.0, 32.0, 1.0, 32, 1e6);
    assert_eq!(c.rope_freq_factors, Some(f));
    assert_eq!(c.rope_attn_factor, Some((1.0 + 0.1 * 4f64.ln()) as f32));
    let c = gguf("phi3", &[("rope.scaling.attn_factor", "1.19")]).unwrap();
    assert_eq!(
        (c.rope_attn_factor, c.rope_freq_factors),
        (Some(1.19), None)
    );
    let e = gguf(
        "llama",
        &[
            ("rope.scaling.type", "longrope"),
            ("rope.scaling.factor", "8"),
        ],
    );
    assert!(format!("{:#}", e.unwrap_err()).contains("longrope"));
    let e = format!("{:#}", gguf("phi2", &[]).unwrap_err());
    assert!(
        e.contains("\"phi2\"") && e.contains("llama, qwen2, qwen3, phi3, gemma3"),
        "{e}"
    );
}

#[test]
fn gemma2_reads_its_caps_window_and_scale() {
    // GGUF: llama.cpp's keys and defaults.
    let c = gguf(
        "gemma2",
        &[
            ("attention.key_length", "64"),
            ("attention.sliding_window", "4096"),
            ("attn_logit_softcapping", "50"),
            ("final_logit_softcapping", "30"),
        ],
    )
    .unwrap();
    assert_eq!(c.arch, Arch::Gemma2);
    assert!(!c.rope_traditional && !c.qk_norm && c.tie_word_embeddings);
    assert_eq!(
        (c.head_dim, c.rope_theta, c.sliding_window),
        (64, 10000.0, Some(4096))
    );
    assert_eq!(
        (c.attn_logit_softcapping, c.final_logit_softcapping),
        (Some(50.0), Some(30.0))
    );
    assert_eq!(c.attn_scale(), 0.125, "1 / sqrt(head size)");
    let local: Vec<bool> = (0..4).map(|i| c.is_local(i)).collect();
    assert_eq!(local, [true, false, true, false], "even layers windowed");
    assert_eq!(c.embed_scale(), 128f32.sqrt(), "sqrt(hidden) in float32");
    // Unstated caps: llama.cpp's defaults; the 27B's scale.
    let c = gguf(
        "gemma2",
        &[
            ("attention.key_length", "32"),
            ("attention.sliding_window", "16"),
            ("block_count", "46"),
        ],
    )
    .unwrap();
    assert_eq!(
        (c.attn_logit_softcapping, c.final_logit_softcapping),
        (Some(50.0), Some(30.0))
    );
    assert_eq!(
        c.query_pre_attn_scalar,
        Some(32.0),
        "hidden / heads for 46 layers"
    );
    let e = gguf("gemma2", &[("attention.sliding_window", "16")]).unwrap_err();
    assert!(
        format!("{e:#}").contains("gemma2.attention.key_length"),
        "{e:#}"
    );

    // HF: transformers' defaults where unstated, null for none.
    let c = hf(serde_json::json!({"model_type": "gemma2", "head_dim": 64,
        "query_pre_attn_scalar": 48, "sliding_window": 16,
        "final_logit_softcapping": null}))
    .unwrap();
    assert_eq!(c.arch, Arch::Gemma2);
    assert_eq!(
        (c.attn_logit_softcapping, c.final_logit_softcapping),
        (Some(50.0), None)
    );
    assert_eq!(c.attn_scale(), (1.0 / 48f64.sqrt()) as f32);
    assert_eq!(
        (c.sliding_window, c.sliding_window_pattern),
        (Some(16), Some(2))
    );
    assert!(c.tie_word_embeddings && !c.qk_norm);
    let err = |extra| format!("{:#}", hf(extra).unwrap_err());
    let e = err(serde_json::json!({"model_type": "gemma2", "hidden_activation": "gelu"}));
    assert!(e.contains("hidden_activation"), "{e}");
    let e = err(
        serde_json::json!({"model_type": "gemma2", "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    );
    assert!(e.contains("rope_scaling"), "{e}");
    let e = err(
        serde_json::json!({"model_type": "gemma2", "layer_types": ["full_attention", "sliding_attention"]}),
    );
    assert!(e.contains("layer_types[0]"), "{e}");
    assert!(hf(serde_json::json!({"model_type": "gemma2",
        "layer_types": ["sliding_attention", "full_attention"]}))
    .is_ok());
}

#[test]
fn phi3_longrope_and_partial_rotary() {
    let c = hf(serde_json::json!({"model_type": "phi3", "sliding_window": 2047})).unwrap();
    assert_eq!(
        (c.sliding_window, c.qkv_bias, c.qk_norm),
        (Some(2047), false, false)
    );
    assert_eq!((c.rope_dims, c.rope_attn_factor), (None, None));
    // Phi-4-mini's shape: 3/4 of each 32-wide head rotated, its
    // factors one per rotated pair (12), the long ones for a context
    // beyond the original.
    let long: Vec<f64> = (0..12).map(|i| 1.0 + i as f64).collect();
    let (ones12, ones16) = (vec![1.0; 12], vec![1.0; 16]);
    let c = hf(
        serde_json::json!({"model_type": "phi3", "partial_rotary_factor": 0.75,
        "max_position_embeddings": 4096, "original_max_position_embeddings": 32,
        "rope_scaling": {"type": "longrope", "long_factor": long, "short_factor": ones12}}),
    )
    .unwrap();
    assert_eq!((c.rope_dims, c.rotary_dims()), (Some(24), 24));
    assert_eq!(c.rope_freq_factors.as_ref().unwrap()[11], 12.0);
    let want = (1.0 + 128f64.ln() / 32f64.ln()).sqrt() as f32;
    assert_eq!(c.rope_attn_factor, Some(want));
    // Factors for the whole head where only part rotates: an error.
    let e = hf(
        serde_json::json!({"model_type": "phi3", "partial_rotary_factor": 0.75,
        "original_max_position_embeddings": 32, "rope_scaling": {"type": "longrope",
        "long_factor": ones16, "short_factor": ones16}}),
    );
    assert!(format!("{:#}", e.unwrap_err()).contains("factor holds 16 values"));
}

#[test]
fn granite_reads_its_multipliers() {
    let c = hf(
        serde_json::json!({"model_type": "granite", "embedding_multiplier": 12.0,
        "attention_multiplier": 0.015625, "residual_multiplier": 0.22,
        "logits_scaling": 8.0}),
    )
    .unwrap();
    let g = c.granite.unwrap();
    assert_eq!((g.embedding, g.attention, g.logits), (12.0, 0.015625, 8.0));
    assert_eq!(c.embedding_scale(), Some(12.0));
    assert_eq!(hf(serde_json::json!({})).unwrap().embedding_scale(), None);
    let e = hf(serde_json::json!({"model_type": "granite", "embedding_multiplier": 12.0}));
    assert!(format!("{:#}", e.unwrap_err()).contains("residual_multiplier"));
    let c = gguf(
        "granite",
        &[("embedding_scale", "12"), ("logit_scale", "8")],
    )
    .unwrap();
    assert!(c.rope_traditional, "llama.cpp permutes Granite's q/k");
    let g = c.granite.unwrap();
    assert_eq!((g.embedding, g.residual, g.logits), (12.0, 1.0, 8.0));
    assert_eq!(
        g.attention,
        1.0 / (32f32).sqrt(),
        "unsaid: 1 / sqrt(head_dim)"
    );
}

#[test]
fn llama3_scaling_becomes_frequency_factors() {
    let c = hf(serde_json::json!({"rope_theta": 5e5, "rope_scaling": {
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}))
    .unwrap();
    let f = c.rope_freq_factors.unwrap();
    assert_eq!(f.len(), 16, "one per rotated pair of the 32-wide heads");
    assert_eq!((f[0], f[15]), (1.0, 32.0));
    assert_eq!(hf(serde_json::json!({})).unwrap().rope_freq_factors, None);
}

#[test]
fn smollm3_reads_its_no_rope_layers() {
    let c = hf(
        serde_json::json!({"model_type": "smollm3", "num_hidden_layers": 8,
        "no_rope_layers": [1, 0, 1, 1, 1, 1, 1, 0]}),
    )
    .unwrap();
    assert_eq!(c.no_rope_layers, vec![1, 7]);
    let c = hf(serde_json::json!({"model_type": "smollm3", "num_hidden_layers": 8})).unwrap();
    assert_eq!(
        c.no_rope_layers,
        vec![3, 7],
        "unsaid: every 4th (mlx-lm's interval)"
    );
    let c = hf(
        serde_json::json!({"model_type": "smollm3", "num_hidden_layers": 6,
        "no_rope_layer_interval": 2}),
    )
    .unwrap();
    assert_eq!(c.no_rope_layers, vec![1, 3, 5]);
    let e = hf(serde_json::json!({"model_type": "smollm3", "no_rope_layers": [1, 1, 0]}));
    assert!(format!("{:#}", e.unwrap_err()).contains("3 entries for 2 layers"));
    let e = hf(serde_json::json!({"model_type": "smollm3", "no_rope_layers": [1, 2]}));
    assert!(format!("{:#}", e.unwrap_err()).contains("no_rope_layers[1]"));
    assert!(hf(serde_json::json!({"no_rope_layers": [1, 0]}))
        .unwrap()
        .no_rope_layers
        .is_empty());
    let c = gguf("smollm3", &[("block_count", "9")]).unwrap();
    assert!(c.rope_traditional, "llama.cpp permutes SmolLM3's q/k");
    assert_eq!(c.no_rope_layers, vec![3, 7], "llama.cpp's every 4th layer");
    assert!(gguf("llama", &[("block_count", "9")])
        .unwrap()
        .no_rope_layers
        .is_empty());
}

#[test]
fn olmo2_is_its_own_layer() {
    let c = hf(serde_json::json!({"model_type": "olmo2"})).unwrap();
    assert_eq!(
        (c.arch, c.qk_norm, c.rope_traditional),
        (Arch::Olmo2, true, false)
    );
    let c = gguf("olmo2", &[]).unwrap();
    assert_eq!(c.arch, Arch::Olmo2);
    assert!(
        c.qk_norm && !c.rope_traditional,
        "llama.cpp: NEOX rope, q/k unpermuted"
    );
}
