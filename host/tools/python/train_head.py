#!/usr/bin/env python3
"""Train a specd MTP draft head (EAGLE / DeepSeek-MTP shape) on features dumped by the Rust side.

  python train_head.py --data DIR --out OUT [--steps 1000] [--batch-tokens 4096] [--seq-len 256]
      [--lr 1e-3] [--seed 0] [--draft-vocab 8192] [--eval-every 100] [--save-every 200]
      [--unroll 2] [--held-back-fraction 0.1] [--resume] [--threads N]
  python train_head.py --check OUT --data DIR     # step-1 argmax (target ids) on first held-back seq

Head math (the Rust side runs exactly this), for step-1 row i (rope position i, label a_{i+1}):
  u   = concat(rms(embed[x_{i+1}], enorm), rms(f_i, hnorm)) @ eh_proj.T
  out = llama_layer(u)                 # causal attention over the head's own rows
  logits = rms(out, norm) @ lm_head[draft_ids].T
Step 2 (training-time test) at row j uses out1_{j-1} instead of f_j (same token x_{j+1}, label
a_{j+1}); its query attends to the step-1 keys/values at positions < j plus its own key/value.
Loss = CE(step1) + 0.5 * CE(step2).
"""
import argparse, json, math, os, sys, time
from functools import partial
import numpy as np
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten
from safetensors.numpy import load_file

ARCH = ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "rms_norm_eps", "rope_theta", "rope_traditional", "vocab_size"]
# init.* tensor (target's last decoder layer) -> head parameter name
INIT = {"init.attn_norm": "layer.input_layernorm.weight", "init.q": "layer.self_attn.q_proj.weight",
        "init.k": "layer.self_attn.k_proj.weight", "init.v": "layer.self_attn.v_proj.weight",
        "init.o": "layer.self_attn.o_proj.weight", "init.ffn_norm": "layer.post_attention_layernorm.weight",
        "init.gate": "layer.mlp.gate_proj.weight", "init.up": "layer.mlp.up_proj.weight",
        "init.down": "layer.mlp.down_proj.weight"}


def die(msg):
    print(f"train_head: error: {msg}", file=sys.stderr)
    sys.exit(2)


def load_st(path):
    if not os.path.isfile(path):
        die(f"missing {path}")
    try:
        return load_file(path)
    except Exception as e:  # corrupt / unsupported dtype
        die(f"cannot read {path}: {e}")


def load_target(d):
    """target.json + target.safetensors, shape-checked. Returns a dict: config fields + arrays."""
    p = os.path.join(d, "target.json")
    cfg = json.load(open(p)) if os.path.isfile(p) else die(f"missing {p} (is --data a dump directory?)")
    if [k for k in ARCH if k not in cfg]:
        die(f"{p} lacks {[k for k in ARCH if k not in cfg]}")
    if cfg.get("arch", "llama") != "llama":
        die(f"unsupported arch {cfg.get('arch')!r}")
    H, V, I = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    if nh % nkv:
        die("num_attention_heads must be a multiple of num_key_value_heads")
    w = load_st(os.path.join(d, "target.safetensors"))
    want = {"embed": (V, H), "lm_head": (V, H), "norm": (H,), "init.attn_norm": (H,),
            "init.q": (nh * hd, H), "init.k": (nkv * hd, H), "init.v": (nkv * hd, H),
            "init.o": (H, nh * hd), "init.ffn_norm": (H,), "init.gate": (I, H),
            "init.up": (I, H), "init.down": (H, I)}
    if "embed" not in w or "norm" not in w:
        die("target.safetensors lacks 'embed' or 'norm'")
    for k, shape in want.items():
        if k in w and tuple(w[k].shape) != shape:
            die(f"target.safetensors '{k}' has shape {tuple(w[k].shape)}, target.json implies {shape}")
    have = [k in w for k in INIT]
    if any(have) and not all(have):
        die(f"partial init weights: missing {[k for k in INIT if k not in w]}")
    return {**cfg, **w}


def load_data(d, tgt):
    w = load_st(os.path.join(d, "data.safetensors"))
    if [k for k in ("tokens", "features", "argmax", "starts") if k not in w]:
        die(f"data.safetensors lacks {[k for k in ('tokens', 'features', 'argmax', 'starts') if k not in w]}")
    tok, feat, am, st = w["tokens"], w["features"], w["argmax"], w["starts"].astype(np.int64)
    N, H, V = tok.shape[0], tgt["hidden_size"], tgt["vocab_size"]
    if tok.ndim != 1 or feat.shape != (N, H) or am.shape != (N,) or st.ndim != 1 or len(st) < 2:
        die(f"data shapes inconsistent: tokens {tok.shape}, features {feat.shape}, argmax {am.shape}, "
            f"starts {st.shape} (hidden_size {H})")
    if st[0] != 0 or st[-1] != N or np.any(np.diff(st) < 0):
        die("starts must be non-decreasing, from 0 to len(tokens)")
    if N and (tok.min() < 0 or tok.max() >= V or am.min() < 0 or am.max() >= V):
        die(f"token / argmax ids outside the target vocabulary ({V})")
    return tok.astype(np.int64), feat, am.astype(np.int64), st


def split(starts, seed, frac):
    """Shuffle sequence indices with seed; hold back max(1, round(frac*S)); both sorted ascending."""
    S = len(starts) - 1
    if S < 2:
        die("need at least 2 sequences (one is held back)")
    perm = np.random.default_rng(seed).permutation(S)
    n_hold = min(S - 1, max(1, int(round(frac * S))))
    return np.sort(perm[n_hold:]), np.sort(perm[:n_hold])


def step1_rows(starts, seqs):
    """Row index of f_i for every step-1 row (i = 0..len-2) of the given sequences."""
    parts = [np.arange(starts[s], starts[s + 1] - 1) for s in seqs]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def windows(starts, seqs, T):
    """Cut each sequence's step-1 rows into chunks of <= T: (first row, chunk start = rope offset, n)."""
    out = [(starts[s], c, min(T, n - c)) for s in seqs
           for n in [starts[s + 1] - starts[s] - 1] for c in range(0, max(n, 0), T)]
    return np.array(out, np.int64).reshape(-1, 3)


# ----------------------------------------------------------------------------------------- model
class Attention(nn.Module):
    def __init__(s, c):
        super().__init__()
        H, s.nh, s.nkv, s.hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        s.trad, s.base, s.scale = bool(c["rope_traditional"]), float(c["rope_theta"]), 1.0 / math.sqrt(s.hd)
        s.q_proj, s.o_proj = nn.Linear(H, s.nh * s.hd, False), nn.Linear(s.nh * s.hd, H, False)
        s.k_proj, s.v_proj = nn.Linear(H, s.nkv * s.hd, False), nn.Linear(H, s.nkv * s.hd, False)

    def __call__(s, x, offs, kv1=None):
        B, T, _ = x.shape
        q = s.q_proj(x).reshape(B, T, s.nh, s.hd).transpose(0, 2, 1, 3)
        k = s.k_proj(x).reshape(B, T, s.nkv, s.hd).transpose(0, 2, 1, 3)
        v = s.v_proj(x).reshape(B, T, s.nkv, s.hd).transpose(0, 2, 1, 3)
        rope = lambda t: mx.fast.rope(t, s.hd, traditional=s.trad, base=s.base, scale=1.0, offset=offs)
        q, k = rope(q), rope(k)
        if kv1 is None:
            o = mx.fast.scaled_dot_product_attention(q, k, v, scale=s.scale, mask="causal")
        else:  # step 2: step-1 keys strictly before j, plus own (step-2) key at j
            k1, v1 = kv1
            qg = q.reshape(B, s.nkv, s.nh // s.nkv, T, s.hd)  # GQA: query head h uses kv head h // g
            sc = (qg @ k1[:, :, None].swapaxes(-1, -2)) * s.scale
            strict = mx.array(np.tril(np.ones((T, T), bool), -1))
            sc = mx.where(strict, sc, mx.array(-np.inf, mx.float32))
            own = (qg * k[:, :, None]).sum(-1, keepdims=True) * s.scale
            p = mx.softmax(mx.concatenate([sc, own], -1), axis=-1, precise=True)
            o = (p[..., :T] @ v1[:, :, None] + p[..., T:] * v[:, :, None]).reshape(B, s.nh, T, s.hd)
        return s.o_proj(o.transpose(0, 2, 1, 3).reshape(B, T, -1)), (k, v)


class MLP(nn.Module):
    def __init__(s, H, I):
        super().__init__()
        s.gate_proj, s.up_proj, s.down_proj = nn.Linear(H, I, False), nn.Linear(H, I, False), nn.Linear(I, H, False)

    def __call__(s, x):
        return s.down_proj(nn.silu(s.gate_proj(x)) * s.up_proj(x))


class Layer(nn.Module):
    def __init__(s, c):
        super().__init__()
        H, eps = c["hidden_size"], c["rms_norm_eps"]
        s.input_layernorm, s.post_attention_layernorm = nn.RMSNorm(H, eps), nn.RMSNorm(H, eps)
        s.self_attn, s.mlp = Attention(c), MLP(H, c["intermediate_size"])

    def __call__(s, u, offs, kv1=None):
        a, kv = s.self_attn(s.input_layernorm(u), offs, kv1)
        u2 = u + a
        return u2 + s.mlp(s.post_attention_layernorm(u2)), kv


class Head(nn.Module):
    def __init__(s, c):
        super().__init__()
        H, eps = c["hidden_size"], c["rms_norm_eps"]
        s.enorm, s.hnorm, s.norm = nn.RMSNorm(H, eps), nn.RMSNorm(H, eps), nn.RMSNorm(H, eps)
        s.eh_proj = nn.Linear(2 * H, H, bias=False)
        s.layer = Layer(c)

    def step(s, emb, feat, offs, kv1=None):
        u = s.eh_proj(mx.concatenate([s.enorm(emb), s.hnorm(feat)], -1))
        return s.layer(u, offs, kv1)

    def __call__(s, emb, feat, offs, Wd, unroll):
        """[logits step 1, logits step 2 (if unroll == 2)], each [B, T, Vd]."""
        out1, kv1 = s.step(emb, feat, offs)
        logits = [s.norm(out1) @ Wd.T]
        if unroll == 2:  # row j takes out1_{j-1} as its feature (row 0 gets zeros and is masked)
            prev = mx.concatenate([mx.zeros_like(out1[:, :1]), out1[:, :-1]], 1)
            out2, _ = s.step(emb, prev, offs, kv1)
            logits.append(s.norm(out2) @ Wd.T)
        return logits


def init_head(tgt, feat_rms):
    head = Head(tgt)
    H = tgt["hidden_size"]
    p = dict(tree_flatten(head.parameters()))
    for k, v in p.items():  # llama-style default for weights the target does not provide
        p[k] = mx.ones(v.shape) if v.ndim == 1 else 0.02 * mx.random.normal(v.shape)
    if "init.q" in tgt:
        p.update({dst: mx.array(tgt[src].astype(np.float32)) for src, dst in INIT.items()})
    p["norm.weight"] = mx.array(tgt["norm"].astype(np.float32))
    # eh_proj init: u = s/sqrt(2) * (rms(e) + rms(h)): identity pass-through of both normed halves,
    # so the layer starts from "token embedding + context state" in one residual vector (rms ~ s,
    # the halves being near-orthogonal). s = RMS of the training features, i.e. the residual-stream
    # scale that the target's last layer (the init) was trained on; s = 1 without init.*. On the
    # synthetic tests this beat both "embedding pass-through + small random feature half" and
    # plain N(0, 0.02) by a wide margin in early acceptance.
    s = (feat_rms if "init.q" in tgt else 1.0) / math.sqrt(2)
    p["eh_proj.weight"] = mx.concatenate([s * mx.eye(H), s * mx.eye(H)], 1)
    head.update(tree_unflatten(list(p.items())))
    return head


def draft_weight(tgt, draft_ids):
    return mx.array(tgt.get("lm_head", tgt["embed"])[draft_ids].astype(np.float32))


# ------------------------------------------------------------------------------------------ data
class Batcher:
    """Builds fixed-shape [B, T] batches from windows; pads at the end with label -1."""

    def __init__(s, tok, feat, am, embed, dindex, B, T):
        s.tok, s.feat, s.am, s.embed, s.dindex, s.B, s.T = tok, feat, am, embed, dindex, B, T

    def build(s, wins):
        rows, valid = np.zeros((s.B, s.T), np.int64), np.zeros((s.B, s.T), bool)
        offs = np.zeros(s.B, np.int32)
        for b, (r0, c, n) in enumerate(wins):
            rows[b] = r0 + c  # pad rows repeat the window's first row (valid, masked)
            rows[b, :n] += np.arange(n)
            valid[b, :n], offs[b] = True, c
        emb = s.embed[s.tok[rows + 1]].astype(np.float32)  # x_{i+1}
        lab = np.where(valid, s.dindex[s.am[rows + 1]], -1).astype(np.int32)  # a_{i+1}; -1 = ignore
        return (mx.array(emb), mx.array(s.feat[rows].astype(np.float32)), mx.array(offs),
                mx.array(lab), valid)


def batch_order(step, nwin, B, seed):
    """Window ids of a training step: an endless stream of per-epoch permutations, a pure function
    of (seed, step) so that --resume replays exactly the same data order."""
    idx = (step * B + np.arange(B)).tolist()
    perm = {e: np.random.default_rng([seed, e]).permutation(nwin) for e in {i // nwin for i in idx}}
    return np.array([perm[i // nwin][i % nwin] for i in idx])


def loss_fn(head, emb, feat, offs, lab, Wd, unroll):
    total = mx.array(0.0)
    lab2 = mx.concatenate([mx.full((lab.shape[0], 1), -1, mx.int32), lab[:, 1:]], 1)
    for k, lg in enumerate(head(emb, feat, offs, Wd, unroll)):
        l = lab if k == 0 else lab2
        m = l >= 0
        ce = nn.losses.cross_entropy(lg, mx.maximum(l, 0), reduction="none")
        total = total + (0.5 ** k) * (ce * m).sum() / mx.maximum(m.sum(), 1)
    return total


def evaluate(head, batcher, wins, Wd):
    """Held-back accuracy of step 1 and of the chained step 2 (always measured, even for --unroll 1).
    Denominator: all rows, so labels outside the draft vocabulary count as misses; step 2 skips
    each window's first row (its step-1 input lies in the previous window)."""
    c1 = c2 = n1 = n2 = 0
    for i in range(0, len(wins), batcher.B):
        emb, feat, offs, lab, valid = batcher.build(wins[i:i + batcher.B])
        l1, l2 = head(emb, feat, offs, Wd, 2)
        ok = lambda lg: np.array((mx.argmax(lg, -1) == lab) & (lab >= 0))
        k1, k2 = ok(l1), ok(l2)
        c1, n1 = c1 + int(k1.sum()), n1 + int(valid.sum())
        c2, n2 = c2 + int(k2[:, 1:].sum()), n2 + int(valid[:, 1:].sum())
    return c1 / max(n1, 1), c2 / max(n2, 1)


def bigram_acc(tok, am, tr_rows, hb_rows, V, top):
    """x_{i+1} -> its most frequent a_{i+1} in training (ties: lower id); unseen -> global top."""
    key = np.unique(tok[tr_rows + 1] * V + am[tr_rows + 1], return_counts=True)
    t, l, cnt = key[0] // V, key[0] % V, key[1]
    o = np.lexsort((l, -cnt, t))
    first = o[np.r_[True, t[o][1:] != t[o][:-1]]] if len(o) else o
    table = np.full(V, top, np.int64)
    table[t[first]] = l[first]
    return float(np.mean(table[tok[hb_rows + 1]] == am[hb_rows + 1])) if len(hb_rows) else 0.0


# ------------------------------------------------------------------------------ head_logits/check
def head_logits(params, target, tokens, features):
    """Step-1 logits for one whole sequence (rope offset 0), numpy in / out, for checking Rust.
    params: head.safetensors contents (name -> array, incl. draft_ids); target: load_target() dict
    (target.json fields + 'embed' / 'lm_head' / ...); tokens [L] = x_0..x_{L-1}; features [L, H] =
    f_0..f_{L-1}. Returns float32 [L-1, Vd]: row i predicts a_{i+1} from (f_i, x_{i+1})."""
    head = Head(target)
    head.update(tree_unflatten([(k, mx.array(np.asarray(v, np.float32))) for k, v in params.items()
                                if k != "draft_ids"]))
    tokens = np.asarray(tokens, np.int64)
    emb = mx.array(target["embed"][tokens[1:]].astype(np.float32))[None]
    feat = mx.array(np.asarray(features, np.float32)[:-1])[None]
    out, _ = head.step(emb, feat, mx.array([0], mx.int32))
    return np.array(head.norm(out)[0] @ draft_weight(target, np.asarray(params["draft_ids"])).T)


def check(args):
    cfg = json.load(open(os.path.join(args.check, "config.json")))
    params = load_st(os.path.join(args.check, "head.safetensors"))
    tgt = load_target(args.data)
    tok, feat, am, st = load_data(args.data, tgt)
    tr = cfg["training"]
    s = int(split(st, tr["seed"], tr.get("held_back_fraction", 0.1))[1][0])
    r0, r1 = int(st[s]), int(st[s + 1])
    lg = head_logits(params, tgt, tok[r0:r1], feat[r0:r1])
    pred = params["draft_ids"][np.argmax(lg, -1)] if len(lg) else np.zeros(0, np.int64)
    print(json.dumps({"sequence": s, "rows": [r0, r1], "draft_argmax": [int(x) for x in pred],
                      "labels": [int(x) for x in am[r0 + 1:r1]]}))


# ----------------------------------------------------------------------------------------- train
def train(args):
    t_start = time.time()
    mx.random.seed(args.seed)
    tgt = load_target(args.data)
    tok, feat, am, st = load_data(args.data, tgt)
    V, H = tgt["vocab_size"], tgt["hidden_size"]
    tr_seqs, hb_seqs = split(st, args.seed, args.held_back_fraction)
    tr_rows, hb_rows = step1_rows(st, tr_seqs), step1_rows(st, hb_seqs)
    if len(tr_rows) == 0:
        die("training sequences hold no step-1 rows (all sequences shorter than 2 tokens)")
    os.makedirs(args.out, exist_ok=True)
    ck_st, ck_js = os.path.join(args.out, "checkpoint.safetensors"), os.path.join(args.out, "checkpoint.json")
    meta, ck = None, None
    if args.resume and os.path.isfile(ck_js):
        meta, ck = json.load(open(ck_js)), mx.load(ck_st)
        for k in ("seed", "seq_len", "batch_tokens", "draft_vocab", "unroll", "held_back_fraction", "lr"):
            if meta["args"][k] != getattr(args, k):
                die(f"--resume: --{k.replace('_', '-')} {getattr(args, k)} differs from checkpoint's {meta['args'][k]}")
    elif args.resume:
        print("train_head: --resume but no checkpoint; starting fresh", file=sys.stderr)

    # Draft vocabulary: most frequent step-1 labels in training (ties: lower id), ascending ids.
    counts = np.bincount(am[tr_rows + 1], minlength=V)
    order = np.lexsort((np.arange(V), -counts))
    Vd = min(args.draft_vocab, V)
    draft_ids = np.sort(order[:Vd]).astype(np.int32) if ck is None else np.array(ck["draft_ids"])
    dindex = np.full(V, -1, np.int64)
    dindex[draft_ids] = np.arange(len(draft_ids))
    bigram = bigram_acc(tok, am, tr_rows, hb_rows, V, int(order[0]))

    T = int(min(args.seq_len, (np.diff(st) - 1).max()))
    B = max(1, args.batch_tokens // T)
    tr_wins, hb_wins = windows(st, tr_seqs, T), windows(st, hb_seqs, T)
    batcher = Batcher(tok, feat, am, tgt["embed"], dindex, B, T)
    Wd = draft_weight(tgt, draft_ids)
    sample = feat[tr_rows[np.random.default_rng(args.seed).permutation(len(tr_rows))[:4096]]]
    feat_rms = float(np.sqrt(np.mean(sample.astype(np.float32) ** 2)))
    head = init_head(tgt, feat_rms)

    warm = min(50, args.steps)
    sched = optim.join_schedules([optim.linear_schedule(args.lr / warm, args.lr, warm),
                                  optim.cosine_decay(args.lr, max(1, args.steps - warm), 0.1 * args.lr)], [warm])
    opt = optim.AdamW(learning_rate=sched, weight_decay=0.0)
    opt.init(head.trainable_parameters())
    step, losses, loss_first, wall0 = 0, [], None, 0.0
    if ck is not None:
        head.update(tree_unflatten([(k[6:], v) for k, v in ck.items() if k.startswith("param.")]))
        opt.state = tree_unflatten([(k[4:], v) for k, v in ck.items() if k.startswith("opt.")])
        step, losses, loss_first, wall0 = meta["step"], meta["recent_losses"], meta["loss_first"], meta["wall_seconds"]
    print(f"train_head: {len(tr_seqs)} train / {len(hb_seqs)} held-back sequences, {len(tr_rows)} / "
          f"{len(hb_rows)} rows, draft vocab {Vd}, batch {B}x{T}, feature rms {feat_rms:.3g}, "
          f"bigram acceptance {bigram:.4f}" + (f", resuming at step {step}" if ck is not None else ""),
          file=sys.stderr)

    state = [head.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def train_step(emb, f, offs, lab):
        loss, grads = nn.value_and_grad(head, loss_fn)(head, emb, f, offs, lab, Wd, args.unroll)
        opt.update(head, grads)
        return loss

    def save():
        arrs = {"param." + k: v for k, v in tree_flatten(head.parameters())}
        arrs.update({"opt." + k: v for k, v in tree_flatten(opt.state)})
        arrs["draft_ids"] = mx.array(draft_ids)
        mx.save_safetensors(os.path.join(args.out, "checkpoint.tmp.safetensors"), arrs)
        os.replace(os.path.join(args.out, "checkpoint.tmp.safetensors"), ck_st)
        m = {"step": step, "seed": args.seed, "args": vars(args), "rng": "none: batch order = f(seed, step)",
             "draft_ids_path": "checkpoint.safetensors:draft_ids", "recent_losses": losses[-10:],
             "loss_first": loss_first, "wall_seconds": wall0 + time.time() - t_start}
        json.dump(m, open(ck_js + ".tmp", "w"), indent=1)
        os.replace(ck_js + ".tmp", ck_js)

    def report(acc):
        print(f"\neval step {step}: held-back acceptance step1 {acc[0]:.4f} step2 {acc[1]:.4f} "
              f"(bigram {bigram:.4f})", file=sys.stderr)

    acc, t_loop, rows_done, n_valid = None, time.time(), 0, 0
    for step in range(step, args.steps):
        emb, f, offs, lab, valid = batcher.build(tr_wins[batch_order(step, len(tr_wins), B, args.seed)])
        loss = train_step(emb, f, offs, lab)
        mx.eval(loss, state)
        losses.append(loss.item())
        loss_first = losses[0] if loss_first is None else loss_first
        rows_done, n_valid = rows_done + int(valid.sum()), n_valid + 1
        el = time.time() - t_loop
        rate, eta = rows_done / el, el / n_valid * (args.steps - step - 1)
        bar = "#" * int(30 * (step + 1) / args.steps)
        print(f"\r[{bar:<30}] {step + 1}/{args.steps} loss {losses[-1]:.4f} {rate:,.0f} rows/s "
              f"ETA {eta // 60:.0f}m{eta % 60:02.0f}s ", end="", file=sys.stderr, flush=True)
        step += 1
        acc = None
        if step % args.eval_every == 0:
            acc = evaluate(head, batcher, hb_wins, Wd)
            report(acc)
        if step % args.save_every == 0 or step == args.steps:
            save()
    print(file=sys.stderr)
    if acc is None:
        acc = evaluate(head, batcher, hb_wins, Wd)
        report(acc)

    out = {k: v.astype(mx.float16) for k, v in tree_flatten(head.parameters())}
    out["draft_ids"] = mx.array(draft_ids)
    mx.save_safetensors(os.path.join(args.out, "head.safetensors"), out)
    rec = {"seed": args.seed, "steps": args.steps, "lr": args.lr, "batch_tokens": args.batch_tokens,
           "seq_len": args.seq_len, "data_tokens": int(sum(st[s + 1] - st[s] for s in tr_seqs)),
           "sequences": len(tr_seqs), "held_back_sequences": len(hb_seqs),
           "wall_seconds": round(wall0 + time.time() - t_start, 3),
           "final_loss": float(np.mean(losses[-10:])) if losses else None, "loss_first": loss_first,
           "held_back_acceptance": acc[0], "held_back_acceptance_step2": acc[1],
           "bigram_acceptance": bigram, "held_back_fraction": args.held_back_fraction, "argv": sys.argv[1:]}
    cfg = {"format": "specd-mtp", "version": 1, **{k: tgt[k] for k in ARCH if k != "vocab_size"},
           "target_vocab_size": V, "draft_vocab_size": int(len(draft_ids)), "unroll": args.unroll,
           "training": rec}
    json.dump(cfg, open(os.path.join(args.out, "config.json"), "w"), indent=1)
    print(json.dumps(rec))


def maybe_fast_blas(threads):
    """The Linux mlx[cpu] wheel bundles netlib *reference* BLAS (~2 GFLOP/s sgemm). If a system
    OpenBLAS exists, re-exec with it in LD_PRELOAD: its cblas_sgemm interposes (~70x faster on the
    dev box, same results). Opt out: SPECD_TRAIN_BLAS=none; other library: SPECD_TRAIN_BLAS=path.
    --threads N sets OPENBLAS_NUM_THREADS / OMP_NUM_THREADS (MLX itself has no thread knob)."""
    import ctypes.util, glob
    env = dict(os.environ, _TRAIN_HEAD_REEXEC="1")
    if threads:
        env.update(OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    lib = os.environ.get("SPECD_TRAIN_BLAS") or ctypes.util.find_library("openblas")
    libs = os.path.join(os.path.dirname(os.path.dirname(mx.__file__)), "mlx_cpu.libs")
    if os.environ.get("_TRAIN_HEAD_REEXEC") or sys.platform != "linux" or lib in (None, "none") \
            or not glob.glob(os.path.join(libs, "libblas-*")):
        return
    env["LD_PRELOAD"] = (lib + " " + os.environ.get("LD_PRELOAD", "")).strip()
    os.execve(sys.executable, [sys.executable, os.path.abspath(sys.argv[0])] + sys.argv[1:], env)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out")
    ap.add_argument("--check", metavar="OUT", help="print step-1 argmax for the first held-back sequence")
    for name, typ, dflt in [("steps", int, 1000), ("batch-tokens", int, 4096), ("seq-len", int, 256),
                            ("lr", float, 1e-3), ("seed", int, 0), ("draft-vocab", int, 8192),
                            ("eval-every", int, 100), ("save-every", int, 200),
                            ("held-back-fraction", float, 0.1), ("threads", int, None)]:
        ap.add_argument("--" + name, type=typ, default=dflt)
    ap.add_argument("--unroll", type=int, default=2, choices=[1, 2])
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    maybe_fast_blas(args.threads)
    if args.check:
        return check(args)
    if not args.out:
        die("--out is required (unless --check)")
    if min(args.steps, args.batch_tokens, args.seq_len, args.draft_vocab, args.eval_every, args.save_every) < 1:
        die("--steps, --batch-tokens, --seq-len, --draft-vocab, --eval-every, --save-every must be >= 1")
    if not 0 < args.held_back_fraction < 1:
        die("--held-back-fraction must be in (0, 1)")
    train(args)


if __name__ == "__main__":
    main()
