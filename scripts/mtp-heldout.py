#!/usr/bin/env python3
"""First-token acceptance of MTP heads on the held-out chat prompts' greedy
answers (host/tools/data/heldout_chat.txt, never trained on): for each
answer position, does the head's row (the target's feature at i, token
i + 1) predict token i + 2? Run from the repository root:

    scripts/mtp-heldout.py HEAD_DIR [HEAD_DIR ...]
    scripts/mtp-heldout.py --calibrate HEAD_DIR

With --calibrate, the acceptance by the head's top-1 probability (the
softmax of its draft-vocabulary row): how far that probability can stand
for the chance a draft token is accepted.

The greedy answers are cached in $TMPDIR/specd-heldout-seqs.json."""
import json, subprocess, sys, tempfile
from pathlib import Path
import numpy as np
B = "target/release/specd"
prompts = [l.strip() for l in open("host/tools/data/heldout_chat.txt") if l.strip()]
cache = Path(tempfile.gettempdir()) / "specd-heldout-seqs.json"
if cache.exists():
    seqs = json.loads(cache.read_text())
else:
    seqs = []
    for p in prompts:
        subprocess.run([B, "debug", "generate", "--chat", "--max-tokens", "96", "--json", str(Path(tempfile.gettempdir()) / "specd-heldout-g.json"), p], check=True, capture_output=True)
        g = json.load(open(str(Path(tempfile.gettempdir()) / "specd-heldout-g.json")))
        seqs.append((len(g["prompt_ids"]), g["prompt_ids"] + g["generated_ids"]))
    cache.write_text(json.dumps(seqs))
calibrate = sys.argv[1:2] == ["--calibrate"]
edges = [0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.01]
for head in sys.argv[1 + calibrate:]:
    hit = n = 0
    buckets = np.zeros((len(edges) - 1, 2))
    for plen, ids in seqs:
        subprocess.run([B, "debug", "mtp", "--head", head, "--ids", ",".join(map(str, ids)), *(["--logits"] if calibrate else []), "--json", str(Path(tempfile.gettempdir()) / "specd-heldout-m.json")], check=True, capture_output=True)
        rows = json.load(open(str(Path(tempfile.gettempdir()) / "specd-heldout-m.json")))
        am = rows["argmax"]
        if calibrate:
            lg = np.array(rows["logits"], dtype=np.float64)
            p = np.exp(lg - lg.max(-1, keepdims=True))
            top1 = (p / p.sum(-1, keepdims=True)).max(-1)
        for i in range(len(ids) - 2):
            if i + 2 >= plen:
                n += 1
                hit += am[i] == ids[i + 2]
                if calibrate:
                    b = np.searchsorted(edges, top1[i], side="right") - 1
                    buckets[b] += (1, am[i] == ids[i + 2])
    print(f"{head}: {hit}/{n} = {hit / n:.3f}")
    if calibrate:
        print("top-1 probability | rows | share | accepted")
        for (lo, hi), (c, a) in zip(zip(edges, edges[1:]), buckets):
            if c:
                print(f"{lo:.1f}-{min(hi, 1.0):.1f} | {int(c)} | {c / n:.3f} | {a / c:.3f}")
