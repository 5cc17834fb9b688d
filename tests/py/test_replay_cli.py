"""The CLI end to end: `specd generate --record`, `specd replay --json --svg`
(reproduces the recording, draws one series per policy) and
`specd bench spec --svg` (one bar per cell)."""
from __future__ import annotations

import json
import subprocess

from conftest import server_bin


def specd(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    exe = server_bin()
    assert exe.exists(), f"{exe} is missing: build it first (cargo build --release -p specd)"
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"specd {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r


def test_record_replay_json_and_svg(tmp_path):
    trace = tmp_path / "t.jsonl"
    specd("generate", "--chat", "--max-tokens", "48", "--drafter", "ngram", "--schedule", "constant",
          "--schedule-config", '{"k":8}', "--draft-max", "8", "--record", str(trace),
          "Repeat exactly: one two three four five six seven eight nine ten")
    out, svg = tmp_path / "r.json", tmp_path / "r.svg"
    r = specd("replay", str(trace), "--recorded-schedule-config", '{"k":8}',
              "--schedule", 'constant:{"k":2}', "--schedule", "heuristic-transient",
              "--schedule", 'constant:{"k":0}', "--json", str(out), "--svg", str(svg))
    assert "reproduces every recorded decision" in r.stdout, r.stdout
    # The header keeps the recorded config, so replay needs no flag for it;
    # told another, the baseline no longer reproduces the recording.
    header = json.loads(trace.read_text().splitlines()[0])
    assert header["schedule_config"] == {"k": 8} and "acceptance_config" not in header
    assert "reproduces every recorded decision" in specd("replay", str(trace)).stdout
    told = specd("replay", str(trace), "--recorded-schedule-config", '{"k":3}').stdout
    assert "reproduces every recorded decision" not in told, told
    rep = json.loads(out.read_text())["reports"]
    assert [x["schedule"] for x in rep] == ["constant", "constant", "heuristic-transient", "constant"]
    assert rep[0]["matches_recording"] and rep[0]["recorded_policies"]
    assert rep[3]["modelled_speedup"] == 1.0 and rep[3]["drafted"] == 0
    assert all(x["rounds"] == rep[0]["rounds"] == len(x["per_round"]) for x in rep)
    assert all(r["k"] <= 2 for r in rep[1]["per_round"])
    text = svg.read_text()
    assert text.startswith("<svg")
    assert "draft length per round" in text and "accepted drafts per round" in text
    assert "heuristic-transient / greedy" in text
    assert text.count("<polyline") >= 8  # 4 policy pairs x 2 charts


def test_bench_spec_svg(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Repeat exactly: red green blue", "suite": "g"}) + "\n")
    out, svg, trace = tmp_path / "b.json", tmp_path / "b.svg", tmp_path / "b.jsonl"
    specd("bench", "spec", "--drafters", "ngram", "--schedules", "constant,throughput", "--prompts",
          str(prompts), "--max-tokens", "16", "--json", str(out), "--svg", str(svg))
    cells = json.loads(out.read_text())
    # Every cell of the matrix, with its figures.
    assert [(c["drafter"], c["schedule"]) for c in cells] == [
        ("none", "-"), ("ngram", "constant"), ("ngram", "throughput")]
    for c in cells:
        assert c["runs"] == 1 and c["tokens"] > 0 and c["tokens_per_second"] > 0
        assert c["identical_to_plain"] == 1, "greedy speculation changed the tokens"
    # The plain cell agrees with `specd generate` on the same prompt.
    stats = tmp_path / "s.json"
    specd("generate", "--chat", "--drafter", "none", "--max-tokens", "16", "--stats-json", str(stats),
          "Repeat exactly: red green blue")
    assert json.loads(stats.read_text())["generated_tokens"] == cells[0]["tokens"]
    # --record traces the speculative runs; replay reproduces them.
    specd("bench", "spec", "--drafters", "ngram", "--schedules", "heuristic-transient", "--prompts",
          str(prompts), "--max-tokens", "16", "--repeats", "2", "--record", str(trace))
    r = specd("replay", str(trace))
    assert "2 request(s)" in r.stdout + r.stderr, r.stdout + r.stderr
    assert "reproduces every recorded decision" in r.stdout, r.stdout
    text = svg.read_text()
    assert text.startswith("<svg") and "speedup over plain decoding" in text
    for c in cells:
        assert f"{c['suite']} {c['drafter']}/{c['schedule']}/{c['acceptance']}" in text
        assert f"{c['speedup']:.2f}x" in text


def test_bench_spec_takes_policy_configs(tmp_path):
    """`--schedules NAME:{json}` hands each cell's schedule its own config:
    two `constant`s with different k are two cells, each asking its k, and a
    config with commas stays one entry of the list."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(
        {"prompt": "Repeat exactly: one two three four five six seven eight", "suite": "g"}) + "\n")
    out, trace = tmp_path / "b.json", tmp_path / "b.jsonl"
    specd("bench", "spec", "--drafters", "ngram", "--schedules", 'constant:{"k":1},constant:{"k": 3},throughput:{"initial": 2, "prior": 0.5}',
          "--prompts", str(prompts), "--max-tokens", "24", "--json", str(out), "--record", str(trace))
    cells = json.loads(out.read_text())
    assert [c["schedule"] for c in cells] == [
        "-", 'constant:{"k":1}', 'constant:{"k": 3}', 'throughput:{"initial": 2, "prior": 0.5}']
    assert all(c["identical_to_plain"] == 1 for c in cells)
    runs, asked = [], []
    for line in trace.read_text().splitlines():
        d = json.loads(line)
        if "specd_trace" in d:
            runs.append(d["schedule"])
            asked.append([])
        elif d.get("schedule_input") is not None:
            asked[-1].append(d["k"])
    assert runs == ["constant", "constant", "throughput"]
    assert asked[0] and set(asked[0]) == {1}, asked[0]
    assert asked[1] and set(asked[1]) == {3}, asked[1]
    # A config that is not a JSON object is refused before any run, by name.
    exe = server_bin()
    r = subprocess.run([str(exe), "bench", "spec", "--drafters", "ngram", "--schedules", 'constant:{"k":',
                        "--prompts", str(prompts), "--max-tokens", "8"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and 'constant:{\\"k\\":' in r.stderr and "config" in r.stderr, r.stderr
    assert "plain" not in r.stderr, "it ran before refusing"
