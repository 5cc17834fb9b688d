#!/usr/bin/env python3
"""llama.cpp's divergence from a saved specd run: the reference for `--weights
int8` (docs/benchmarks.md, "Accuracy").

llama.cpp multiplies the default model's Q4_1 weights with Q8_1 activations
and its tied Q8_0 head with Q8_0 activations, on an f16 KV cache: the 8-bit
method specd's `int8` follows. This runs llama-cpp-python (logits of every
position) over the chunks a `specd bench ppl --save-logits FILE` run scored
(the same token ids, read from FILE) and reports, against FILE, what `specd
bench ppl --base FILE` reports for a specd mode: the perplexity ratio, the
mean and 99th-percentile KL divergence (over FILE's top-k tokens and the
rest) and the top-1 agreement. So `int8`'s numbers against `quantized` sit
next to llama.cpp's against the same `quantized` run.

    specd bench ppl --chunks 20 --save-logits q.kl tests/data/hamlet.txt
    .venv/bin/python scripts/int8-reference.py --base q.kl [--model GGUF] [--threads N]

The model defaults to the store's default (`specd pull --path`).
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def read_saved(path: Path):
    """`bench ppl --save-logits`'s file: header, token ids, per scored token
    nll, rest mass and the top-k (id, log-probability) pairs."""
    b = path.read_bytes()
    if b[:8] != b"SPECDKL1":
        raise SystemExit(f"{path} is not a `bench ppl --save-logits` file")
    (n,) = struct.unpack_from("<I", b, 8)
    h = json.loads(b[12:12 + n])
    at = 12 + n
    ntok = h["chunks"] * h["ctx"]
    tokens = np.frombuffer(b, dtype="<u4", count=ntok, offset=at)
    at += 4 * ntok
    k = h["top_k"]
    rows = h["chunks"] * h["scored"]
    rec = np.dtype([("nll", "<f4"), ("rest", "<f4"), ("top", [("id", "<u4"), ("lp", "<f4")], (k,))])
    r = np.frombuffer(b, dtype=rec, count=rows, offset=at)
    return h, tokens.reshape(h["chunks"], h["ctx"]), r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, type=Path)
    ap.add_argument("--model")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    model = a.model
    if model is None:
        exe = Path(os.environ.get("SPECD_BIN", ROOT / "target" / "release" / "specd"))
        model = subprocess.run([str(exe), "pull", "--path"], capture_output=True, text=True,
                               check=True).stdout.strip()
    h, chunks, base = read_saved(a.base)
    sys.path.insert(0, str(ROOT / "scripts"))
    import llama_cpp
    from anchors import llama_cpp_without_amx

    llama_cpp_without_amx(llama_cpp)
    ctx = h["ctx"]
    llm = llama_cpp.Llama(model_path=model, n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, n_threads=a.threads,
                          n_threads_batch=a.threads, n_gpu_layers=0, logits_all=True, seed=0, verbose=False)
    first = ctx // 2
    nll, kl, same = [], [], 0
    for c, ids in enumerate(chunks):
        llm.reset()
        llm.eval([int(t) for t in ids])
        x = np.asarray(llm.scores[first:ctx - 1], dtype=np.float64)
        m = x.max(1, keepdims=True)
        lq = x - m - np.log(np.exp(x - m).sum(1, keepdims=True))
        rows = base[c * h["scored"]:(c + 1) * h["scored"]]
        nxt = ids[first + 1:ctx]
        nll.extend((-lq[np.arange(len(nxt)), nxt]).tolist())
        ids_k, lp = rows["top"]["id"].astype(np.int64), rows["top"]["lp"].astype(np.float64)
        r = np.arange(len(rows))[:, None]
        p = np.exp(lp)
        q_k = lq[r, ids_k]
        q_rest = np.maximum(1 - np.exp(q_k).sum(1), np.finfo(float).tiny)
        p_rest = rows["rest"].astype(np.float64)
        k = (p * (lp - q_k)).sum(1) + np.where(p_rest > 0, p_rest * (np.log(np.maximum(p_rest, 1e-300)) - np.log(q_rest)), 0)
        kl.extend(np.maximum(k, 0).tolist())
        same += int((x.argmax(1) == ids_k[:, 0]).sum())
        print(f"[{c + 1}/{len(chunks)}]", file=sys.stderr)
    nll, kl = np.array(nll), np.array(kl)
    base_nll = base["nll"].astype(np.float64)
    print(f"llama.cpp (llama-cpp-python {llama_cpp.__version__}) against {h['label']}, "
          f"{len(chunks)} chunks of {ctx}, {len(nll)} tokens scored")
    print(f"perplexity: {np.exp(nll.mean()):.4f} (base {np.exp(base_nll.mean()):.4f})")
    print(f"  perplexity ratio: {np.exp(nll.mean() - base_nll.mean()):.4f}")
    print(f"  mean KL divergence: {kl.mean():.6f} +/- {kl.std() / np.sqrt(len(kl) - 1):.6f}")
    print(f"  99th percentile KL: {np.percentile(kl, 99):.6f}")
    print(f"  top-1 agreement: {100 * same / len(kl):.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
