#!/usr/bin/env python3
"""One anchor engine's greedy decode and prefill speed, as one JSON object.

`specd bench anchors` runs this once per anchor (one process each, so the
engines never share a process, a thread pool or an allocator) with the same
token ids, token count and thread count it uses for itself:

    python anchors.py check ENGINE            # exit 0 when ENGINE is importable
    python anchors.py install ENGINE          # pip install ENGINE into this python
    python anchors.py run ENGINE < CONFIG     # measure; one JSON object on stdout
    python anchors.py ppl llama.cpp < CONFIG  # perplexity (below)

ENGINE is `mlx-lm` (a Hugging Face directory, e.g. from `specd convert`) or
`llama.cpp` (llama-cpp-python on the GGUF file). CONFIG is JSON:

    {"model": PATH, "decode_prompt": [ids], "prefill_prompt": [ids],
     "max_tokens": N, "eos": [ids], "threads": T, "reps": R}

Measured the same way as specd measures itself:
- prefill: the whole `prefill_prompt` through the model up to the last
  position's logits, in one batch; the median of R timed runs after a warm-up.
- decode: `decode_prompt[:-1]` is prefilled (untimed), then the engine's own
  greedy generation loop runs from the last prompt token; N forwards for N
  tokens, stopping early at a token in `eos`; after a short warm-up generation.

The output: {"engine", "version", "threads", "load_seconds",
"prefill": {"prompt_tokens", "seconds", "tokens_per_second", "reps"},
"decode": {"prompt_tokens", "generated_tokens", "seconds", "tokens_per_second"},
"tokens": [generated ids]}, or {"engine", "error", "install"} with exit 1.

`ppl` runs llama-perplexity's protocol through llama-cpp-python's API (the
pinned version ships no perplexity tool, but returns every position's
logits with logits_all=True): CONFIG {"model": GGUF, "file": TEXT, "ctx": C,
"chunks": N or null, "threads": T, "tokens": [specd's ids of TEXT]}. The
text is tokenized once by llama.cpp (BOS first where the model adds it), the
tail shorter than C dropped, each chunk of C tokens run from an empty cache
(its first token BOS where the model adds it), the logits at C/2 .. C-2
score the next token; ppl = exp(mean nll), stderr sd(nll)/sqrt(n-1) ppl.
Output: {"engine", "version", "perplexity", "stderr", "tokens_scored",
"chunks", "ctx", "bos", "seconds", "same_tokens"} (same_tokens: llama.cpp's
ids of the text equal specd's).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import traceback

# What `install` puts into this interpreter (as pinned in
# tests/py/requirements.txt). llama-cpp-python is a source package: pip builds
# llama.cpp with cmake and a C++ compiler, minutes on 2 cores; CMAKE_ARGS (as
# the Makefile's LLAMA_CPP_CMAKE_ARGS) leave out what the package never loads.
PIP = {
    "mlx-lm": ["mlx[cpu]==0.32.4", "mlx-lm==0.32.2"],
    "llama.cpp": ["llama-cpp-python==0.3.16"],
}
LLAMA_CPP_CMAKE_ARGS = (
    "-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
    "-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF"
)
NEEDS = {
    "mlx-lm": "",
    "llama.cpp": " (it compiles llama.cpp: needs cmake and a C++ compiler, "
    "e.g. `apt-get install cmake g++`)",
}
WARMUP_TOKENS = 8


def install_hint(engine: str) -> str:
    return f"{sys.executable} -m pip install {' '.join(PIP[engine])}{NEEDS[engine]}"


def import_engine(engine: str):
    if engine == "mlx-lm":
        import mlx.core  # noqa: F401
        import mlx_lm  # noqa: F401

        return mlx_lm.__version__
    if engine == "llama.cpp":
        import llama_cpp

        return llama_cpp.__version__
    raise ValueError(f"unknown engine {engine!r}: mlx-lm or llama.cpp")


def median_seconds(f, reps: int) -> float:
    f()  # warm-up
    times = []
    for _ in range(max(1, reps)):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def timed_generation(gen, n: int, eos: set[int]) -> tuple[list[int], float]:
    """Runs a token generator until n tokens or an eos token (excluded)."""
    out: list[int] = []
    t = time.perf_counter()
    for tok in gen:
        tok = int(tok)
        if tok in eos:
            break
        out.append(tok)
        if len(out) >= n:
            break
    return out, time.perf_counter() - t


def run_mlx_lm(cfg: dict) -> dict:
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    mx.set_default_device(mx.cpu)
    t = time.perf_counter()
    model, _ = load_model(__import__("pathlib").Path(cfg["model"]))
    mx.eval(model.parameters())
    load_seconds = time.perf_counter() - t
    eos = set(cfg["eos"])

    def prefilled(ids: list[int]):
        """A cache holding ids (evaluated), as generate_step prefills."""
        cache = make_prompt_cache(model)
        if ids:
            model(mx.array(ids)[None], cache=cache)
            mx.eval([c.state for c in cache])
        return cache

    long_ids = cfg["prefill_prompt"]

    def prefill():
        cache = make_prompt_cache(model)
        x = mx.array(long_ids)[None]
        inner, args = getattr(model, "model", None), getattr(model, "args", None)
        if inner is not None and args is not None:
            # One batch; the head only on the last position, as specd and
            # llama.cpp do (mlx-lm's llama forward, the head applied to one row).
            h = inner(x, cache)[:, -1:, :]
            # Tied: the args say so (llama), or the model has no lm_head
            # (gemma3_text drops it when the weights tie it).
            head = getattr(model, "lm_head", None)
            if getattr(args, "tie_word_embeddings", False) or head is None:
                logits = inner.embed_tokens.as_linear(h)
            else:
                logits = head(h)
        else:
            # Another architecture: all positions' logits.
            logits = model(x, cache=cache)[:, -1, :]
        mx.eval(logits)

    prefill_s = median_seconds(prefill, cfg["reps"])

    ids = cfg["decode_prompt"]

    def decode(n: int):
        cache = prefilled(ids[:-1])
        gen = generate_step(mx.array(ids[-1:]), model, max_tokens=n, prompt_cache=cache)
        return timed_generation((tok for tok, _ in gen), n, eos)

    decode(WARMUP_TOKENS)
    tokens, decode_s = decode(cfg["max_tokens"])
    import mlx_lm

    return result("mlx-lm", mlx_lm.__version__, cfg, load_seconds, prefill_s, tokens, decode_s)


def llama_cpp_without_amx(llama_cpp) -> bool:
    """On a CPU with AMX-INT8, loads models without ggml's extra buffer types.

    There ggml repacks Q4_0 / Q4_1 weights for its AMX kernels, which give
    wrong logits (upstream llama.cpp PR #16315: "The AMX backend produces
    garbage with Q4_0 and Q4_1 quantizations", not fixed in the pinned
    version). Measured on the default model: the first greedy token's top
    logit 28.7 ("The") against 24.9 ("Once") without them, where specd,
    mlx-lm and llama.cpp on other CPUs agree on "Once". An anchor that
    computes something else is no anchor, so its plain CPU kernels run.
    Returns whether it did that."""
    if b"AMX_INT8 = 1" not in llama_cpp.llama_print_system_info():
        return False
    default = llama_cpp.llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    # Llama() reads the defaults through this module attribute.
    llama_cpp.llama_cpp.llama_model_default_params = params
    return True


def run_llama_cpp(cfg: dict) -> dict:
    import llama_cpp

    long_ids = cfg["prefill_prompt"]
    ids = cfg["decode_prompt"]
    batch = max(512, len(long_ids))
    no_amx = llama_cpp_without_amx(llama_cpp)
    t = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=cfg["model"],
        n_ctx=max(len(long_ids), len(ids) + cfg["max_tokens"]) + 64,
        n_batch=batch,
        n_ubatch=batch,
        n_threads=cfg["threads"],
        n_threads_batch=cfg["threads"],
        n_gpu_layers=0,
        logits_all=False,
        seed=0,
        verbose=False,
    )
    load_seconds = time.perf_counter() - t
    eos = set(cfg["eos"])

    def prefill():
        llm.reset()
        llm.eval(long_ids)  # one batch; logits of the last position only

    prefill_s = median_seconds(prefill, cfg["reps"])

    def decode(n: int):
        llm.reset()
        llm.eval(ids[:-1])
        # generate() finds ids[:-1] in the cache and evaluates only the last token.
        gen = llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0)
        return timed_generation(gen, n, eos)

    decode(WARMUP_TOKENS)
    tokens, decode_s = decode(cfg["max_tokens"])
    r = result("llama.cpp", llama_cpp.__version__, cfg, load_seconds, prefill_s, tokens, decode_s)
    if no_amx:
        r["backend_note"] = "AMX repacking off (wrong Q4 logits upstream, llama.cpp #16315)"
    return r


def ppl_llama_cpp(cfg: dict) -> dict:
    import llama_cpp
    import numpy as np

    ctx = int(cfg["ctx"])
    no_amx = llama_cpp_without_amx(llama_cpp)
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=cfg["model"],
        n_ctx=ctx,
        n_batch=ctx,
        n_ubatch=ctx,
        n_threads=cfg["threads"],
        n_threads_batch=cfg["threads"],
        n_gpu_layers=0,
        logits_all=True,
        seed=0,
        verbose=False,
    )
    text = open(cfg["file"], encoding="utf-8").read()
    # add_bos=True is llama.cpp's add_special: BOS only where the model adds it.
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    bos = llm.tokenize(b"", add_bos=True, special=False)
    bos_id = bos[0] if bos else None
    n_chunks = len(tokens) // ctx
    if cfg.get("chunks"):
        n_chunks = min(n_chunks, int(cfg["chunks"]))
    if n_chunks < 1:
        raise ValueError(f"{cfg['file']} is {len(tokens)} tokens, less than one chunk of {ctx}")
    first = ctx // 2
    nll = []
    for c in range(n_chunks):
        ids = list(tokens[c * ctx:(c + 1) * ctx])
        if bos_id is not None:
            ids[0] = bos_id
        llm.reset()
        llm.eval(ids)
        logits = np.asarray(llm.scores[first:ctx - 1], dtype=np.float64)
        m = logits.max(axis=1, keepdims=True)
        lse = (m[:, 0] + np.log(np.exp(logits - m).sum(axis=1)))
        nxt = np.asarray(ids[first + 1:ctx])
        nll.extend((lse - logits[np.arange(len(nxt)), nxt]).tolist())
        print(f"llama.cpp ppl: [{c + 1}/{n_chunks}] {float(np.exp(np.mean(nll))):.4f}", file=sys.stderr)
    v = np.asarray(nll)
    ppl = float(np.exp(v.mean()))
    var = float((v * v).mean() - v.mean() ** 2)
    err = float(np.sqrt(var / (len(v) - 1)) * ppl) if var > 0 and len(v) > 1 else 0.0
    out = {
        "engine": "llama.cpp",
        "version": llama_cpp.__version__,
        "perplexity": ppl,
        "stderr": err,
        "tokens_scored": len(v),
        "chunks": n_chunks,
        "ctx": ctx,
        "bos": bos_id is not None,
        "seconds": time.perf_counter() - t0,
        "same_tokens": list(tokens) == list(cfg.get("tokens") or []),
    }
    if no_amx:
        out["backend_note"] = "AMX repacking off (wrong Q4 logits upstream, llama.cpp #16315)"
    return out


def result(engine, version, cfg, load_seconds, prefill_s, tokens, decode_s) -> dict:
    n_long = len(cfg["prefill_prompt"])
    return {
        "engine": engine,
        "version": version,
        "threads": cfg["threads"],
        "load_seconds": load_seconds,
        "prefill": {
            "prompt_tokens": n_long,
            "seconds": prefill_s,
            "tokens_per_second": n_long / prefill_s if prefill_s > 0 else 0.0,
            "reps": cfg["reps"],
        },
        "decode": {
            "prompt_tokens": len(cfg["decode_prompt"]),
            "generated_tokens": len(tokens),
            "seconds": decode_s,
            "tokens_per_second": len(tokens) / decode_s if decode_s > 0 else 0.0,
        },
        "tokens": tokens,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("check", "install", "run", "ppl") or argv[2] not in PIP:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, engine = argv[1], argv[2]
    if cmd == "install":
        import os

        env = dict(os.environ)
        if engine == "llama.cpp":
            env.setdefault("CMAKE_ARGS", LLAMA_CPP_CMAKE_ARGS)
            env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        return subprocess.call([sys.executable, "-m", "pip", "install", *PIP[engine]], env=env)
    try:
        version = import_engine(engine)
    except Exception as e:  # ImportError, or a broken native library
        print(json.dumps({
            "engine": engine,
            "error": f"{engine} is not importable in {sys.executable}: {type(e).__name__}: {e}",
            "install": install_hint(engine),
        }))
        return 3
    if cmd == "check":
        print(json.dumps({"engine": engine, "version": version}))
        return 0
    try:
        cfg = json.load(sys.stdin)
        cfg.setdefault("reps", 3)
        if cmd == "ppl":
            if engine != "llama.cpp":
                raise ValueError(f"no perplexity driver for {engine}: llama.cpp only")
            out = ppl_llama_cpp(cfg)
        else:
            out = run_mlx_lm(cfg) if engine == "mlx-lm" else run_llama_cpp(cfg)
    except Exception as e:
        traceback.print_exc()
        print(json.dumps({"engine": engine, "error": f"{type(e).__name__}: {e}", "install": install_hint(engine)}))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
