"""Tiny Hugging Face checkpoints with random weights, written with mlx-lm's
own model classes (tests/py/test_hf_models.py runs specd on them and checks
it against mlx-lm).

Each directory has what a real one has: config.json (model_type and the
architecture's fields), model.safetensors (mlx-lm's `save_model`),
tokenizer.json (a byte-level BPE trained here with the `tokenizers` package,
with Qwen2's or GPT-2's split regex) and tokenizer_config.json (special
tokens, and a chat template for the Qwen ones; the Mistral one has none, like
a base model).

The random weights are shaped so greedy decoding is well defined: the final
norm is scaled up so the logits spread over tens of units (top-2 margins of
whole units, not near-ties), and the special tokens' rows are shrunk so they
are never the argmax (a generation runs its full length).
"""
from __future__ import annotations

import json
from pathlib import Path

# Qwen2's split regex (its tokenizer.json), and GPT-2's.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Qwen2.5's chat template (tools in the system turn, calls as
# <tool_call>{json}</tool_call>, results as <tool_response> in a user turn).
QWEN25_TOOLS = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)
VOCAB = 512
# Gemma 2's soft-caps in the tiny checkpoints: small enough to bite on
# random weights (Gemma 2's own are 50 and 30).
ATTN_CAP, FINAL_CAP = 3.0, 60.0

CORPUS_SEED = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Speculative decoding drafts several tokens and verifies them in one forward pass.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "In 1492, the ships sailed west; 3 of them reached the islands after 70 days.",
    "Qwen, Mistral and Llama are families of language models with rotary embeddings.",
    "Don't stop: it's what we'll do, they've said, and I'm sure you'd agree.",
    "for (int i = 0; i < 10; ++i) { total += values[i] * 2; }",
    "Caf\u00e9 cr\u00e8me, na\u00efve r\u00e9sum\u00e9 \u2014 \u00fcber stra\u00dfe, \u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3002",
]


def corpus() -> list[str]:
    """A small, varied corpus (a few thousand words) for the BPE trainer."""
    words = " ".join(CORPUS_SEED).split()
    out = list(CORPUS_SEED)
    for i in range(400):
        out.append(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)))
    return out


def write_tokenizer(d: Path, split: str, chat_template: str | None) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIALS,
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    tok.save(str(d / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>" if chat_template else "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 4096,
    }
    if chat_template:
        cfg["chat_template"] = chat_template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


# What every tiny checkpoint's config.json shares; each architecture adds its own fields.
BASE = dict(
    hidden_size=128,
    num_hidden_layers=3,
    intermediate_size=256,
    num_attention_heads=4,
    vocab_size=VOCAB,
    max_position_embeddings=4096,
)


def arch(module: str, split, chat, **config) -> dict:
    """An architecture under test: its mlx-lm module, its config.json (BASE
    and `config`), its tokenizer's split and chat template."""
    return dict(module=module, config={**BASE, **config}, split=split, chat=chat)


# The architectures under test.
ARCHS = {
    "qwen2": arch(
        "qwen2", QWEN2_SPLIT, CHATML,
        model_type="qwen2", num_key_value_heads=2, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True,
        # As Qwen2.5's configs carry them: a window that is off.
        sliding_window=4096, use_sliding_window=False,
    ),
    "qwen3": arch(
        "qwen3", QWEN2_SPLIT, CHATML,
        model_type="qwen3", num_key_value_heads=2,
        # Not hidden / heads (32): Qwen3's own head size.
        head_dim=64,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
        attention_bias=False,
    ),
    "mistral": arch(
        "llama", GPT2_SPLIT, None,
        model_type="mistral", num_key_value_heads=1, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False,
        # specd attends through a rotating cache of this size; the test
        # sequences stay inside it, where it equals full attention.
        sliding_window=4096,
    ),
    # Llama 3.1's rope scaling with a short original context (64), so the
    # factors bite at positions a tiny test reaches: wavelengths above 64
    # are slowed 8x, those between 16 and 64 blended.
    "llama3": arch(
        "llama", GPT2_SPLIT, CHATML,
        model_type="llama", num_key_value_heads=2, rms_norm_eps=1e-5,
        rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=64),
    ),
    # Gemma 3 (mlx-lm's gemma3_text): q/k norms, GeGLU, post-norms, a
    # global layer every 2nd here (local ones through a window of 512).
    "gemma3": arch(
        "gemma3_text", GPT2_SPLIT, None,
        model_type="gemma3_text", num_key_value_heads=1, head_dim=32, rms_norm_eps=1e-6,
        rope_theta=1000000.0, rope_local_base_freq=10000.0, query_pre_attn_scalar=32,
        sliding_window=512, sliding_window_pattern=2, tie_word_embeddings=False,
    ),
    # Gemma 2 (mlx-lm's gemma2, which has no window): GeGLU, post-norms,
    # soft-capped scores and logits (caps that bite on these weights), a
    # query_pre_attn_scalar other than head_dim (64), heads of 64 (specd's
    # grouped attention kernel).
    "gemma2": arch(
        "gemma2", GPT2_SPLIT, None,
        model_type="gemma2", num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
        rope_theta=10000.0, query_pre_attn_scalar=48, attn_logit_softcapping=ATTN_CAP,
        final_logit_softcapping=FINAL_CAP, sliding_window=4096, hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
    ),
    # Phi-3 (mini 4k's layout): fused q/k/v and gate/up projections, a
    # window on every layer (the test sequences stay inside it; mlx-lm's
    # phi3 has none).
    "phi3": arch(
        "phi3", GPT2_SPLIT, CHATML,
        model_type="phi3", num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, sliding_window=2047, original_max_position_embeddings=4096,
    ),
    # Granite 3 (mlx-lm's granite): llama with multipliers (Granite 3
    # 2B's: embedding 12, attention 1/64, residual 0.22, logits / 8).
    "granite": arch(
        "granite", GPT2_SPLIT, CHATML,
        model_type="granite", num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        embedding_multiplier=12.0, attention_multiplier=0.015625, residual_multiplier=0.22,
        logits_scaling=8.0,
    ),
    # SmolLM3 (mlx-lm's smollm3): llama whose layers with a 0 in
    # no_rope_layers attend without rope; four layers, the 4th NoPE (the
    # every-4th rule llama.cpp assumes for a GGUF).
    "smollm3": arch(
        "smollm3", GPT2_SPLIT, CHATML,
        model_type="smollm3", num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=5000000.0,
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0], no_rope_layer_interval=4,
    ),
    # OLMo 2 (mlx-lm's olmo2): norms after attention and the MLP, none
    # before; q/k norms over the whole projection; an untied head.
    "olmo2": arch(
        "olmo2", GPT2_SPLIT, CHATML,
        model_type="olmo2", num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=500000.0,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
    ),
    # llama with attention_bias: biases on q, k, v and o.
    "llama-bias": arch(
        "llama", GPT2_SPLIT, CHATML,
        model_type="llama", num_key_value_heads=4, rms_norm_eps=1e-5,
        rope_theta=500000.0, tie_word_embeddings=True, attention_bias=True,
    ),
}


def write_checkpoint(d: Path, arch: str, quantize: dict | None = None, seed: int = 0,
                     chat_template: str | None = None, **config_changes) -> Path:
    """Writes the tiny `arch` checkpoint into `d`; `quantize` (mlx-lm's
    `quantize_model` arguments) makes it an MLX quantized one, saved in
    bfloat16 like mlx-community's; `chat_template` replaces the
    architecture's (e.g. QWEN25_TOOLS); `config_changes` replace config.json
    fields (e.g. a short `sliding_window`)."""
    import importlib

    import mlx.core as mx
    import numpy as np
    from mlx_lm.utils import quantize_model, save_config, save_model

    spec = ARCHS[arch]
    mod = importlib.import_module(f"mlx_lm.models.{spec['module']}")
    config = dict(spec["config"], **config_changes)
    mx.random.seed(seed)
    model = mod.Model(mod.ModelArgs.from_dict(config))
    # Margins: logits of magnitude ~10s; the special tokens never win.
    inner = model.model
    inner.norm.weight = inner.norm.weight * 12.0
    heads = [inner.embed_tokens] + ([model.lm_head] if hasattr(model, "lm_head") else [])
    for h in heads:
        scale = np.ones((VOCAB, 1), dtype=np.float32)
        scale[: len(SPECIALS)] = 0.05
        h.weight = h.weight * mx.array(scale)
    # Norm weights away from 1 and biases away from 0, so a missed norm or
    # bias shows in the logits.
    for layer in inner.layers:
        norms = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm")
        for n in (n for n in norms if hasattr(layer, n)):
            ln = getattr(layer, n)
            ln.weight = 1.0 + 0.3 * mx.random.normal(ln.weight.shape)
        att = layer.self_attn
        for n in ("q_norm", "k_norm"):
            if hasattr(att, n):
                getattr(att, n).weight = 1.0 + 0.3 * mx.random.normal(getattr(att, n).weight.shape)
        for n in (n for n in ("q_proj", "k_proj", "v_proj", "o_proj") if hasattr(att, n)):
            lin = getattr(att, n)
            if "bias" in lin:
                lin.bias = 0.5 * mx.random.normal(lin.bias.shape)
    if quantize:
        model.set_dtype(mx.bfloat16)
        model, config = quantize_model(model, config, **quantize)
    mx.eval(model.parameters())
    d.mkdir(parents=True, exist_ok=True)
    save_model(d, model)
    save_config(config, d / "config.json")
    write_tokenizer(d, spec["split"], chat_template or spec["chat"])
    return d


def load_mlx(d: Path):
    """mlx-lm's model of checkpoint `d`, computing in float32."""
    import mlx.core as mx
    from mlx_lm.utils import load_model

    mx.set_default_device(mx.cpu)
    model, _ = load_model(Path(d))
    model.set_dtype(mx.float32)
    return model
