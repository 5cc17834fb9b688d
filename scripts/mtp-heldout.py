#!/usr/bin/env python3
"""First-token acceptance of MTP heads on the held-out chat prompts' greedy
answers (host/tools/data/heldout_chat.txt, never trained on): for each
answer position, does the head's row (the target's feature at i, token
i + 1) predict token i + 2? Run from the repository root:

    scripts/mtp-heldout.py HEAD_DIR [HEAD_DIR ...]

The greedy answers are cached in $TMPDIR/specd-heldout-seqs.json."""
import json, subprocess, sys, tempfile
from pathlib import Path
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
for head in sys.argv[1:]:
    hit = n = 0
    for plen, ids in seqs:
        subprocess.run([B, "debug", "mtp", "--head", head, "--ids", ",".join(map(str, ids)), "--json", str(Path(tempfile.gettempdir()) / "specd-heldout-m.json")], check=True, capture_output=True)
        am = json.load(open(str(Path(tempfile.gettempdir()) / "specd-heldout-m.json")))["argmax"]
        for i in range(len(ids) - 2):
            if i + 2 >= plen:
                n += 1
                hit += am[i] == ids[i + 2]
    print(f"{head}: {hit}/{n} = {hit / n:.3f}")
