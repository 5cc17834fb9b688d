#!/usr/bin/env python3
"""`specd serve` against llama.cpp's `llama-server -np 8` on the same GGUF,
one random checkpoint per architecture (issue 65's must-architectures):

    make bench-llama-server                      # builds llama-server first
    .venv/bin/python scripts/bench_llama_server.py --llama-server PATH \\
        [--archs llama3,qwen2,qwen3,phi3,gemma2] [--clients 1,8] [--rounds 2] \\
        [--max-tokens 128] [--threads 2] [--keep] [--shape small]

For each architecture: `specd debug random-model --gguf` writes a random
Q4_1 checkpoint (Q8_0 embedding, the 32k byte-level vocabulary of every
random shape) of a named model's trunk into $SPECD_HOME/bench-llama-server
(removed after its rows unless `--keep`: the files are 0.6-1.4 GB). Then
each engine in turn (one server up at a time, both on `--threads` threads)
is started on a free port, warmed with one request, and driven by a closed
loop of C clients (each sends its next request when the last one answers)
for `--rounds` requests each: one fixed prompt, greedy (`temperature` 0),
`max_tokens` tokens with `ignore_eos`, so every request decodes the whole
budget. specd serves plainly (`drafter: "none"`). The figure is generated
tokens (from the responses' `usage`) over the wall seconds from the first
request sent to the last answer. Prints a markdown table with the
specd / llama-server ratio per client count.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "py"))
from conftest import free_port, server_bin, stop_process, wait_until_up  # noqa: E402

# (architecture, random shape, the model whose trunk it is)
ARCHS = {
    "llama3": ("1b", "Llama-3.2-1B"),
    "qwen2": ("qwen2.5-1.5b", "Qwen2.5-1.5B"),
    "qwen3": ("qwen3-1.7b", "Qwen3-1.7B"),
    "phi3": ("phi3-mini-8l", "Phi-3-mini, 8 of 32 layers"),
    "gemma2": ("gemma2-2b", "Gemma-2-2B"),
}

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def specd_home() -> Path:
    return Path(os.environ.get("SPECD_HOME") or Path.home() / ".cache" / "specd")


def write_gguf(specd: Path, arch: str, shape: str, out: Path) -> None:
    if out.exists():
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    subprocess.run([str(specd), "debug", "random-model", "--arch", arch, "--shape", shape,
                    "--gguf", "--out", str(tmp)], check=True)
    tmp.rename(out)


def parameters(path: Path) -> int:
    from gguf import GGUFReader

    return sum(int(t.n_elements) for t in GGUFReader(str(path)).tensors)


class Engine:
    """One server process on a free port; `url` once /health answers 200."""

    def __init__(self, name: str, argv: list[str], env: dict, log: Path, port: int):
        self.name, self.log = name, log
        self.url = f"http://127.0.0.1:{port}"
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 600) -> None:
        wait_until_up(self.proc, self.url, timeout, self.tail, what=self.name)

    def tail(self) -> str:
        return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-6:])

    def stop(self) -> None:
        stop_process(self.proc, 15)
        self._log.close()


def start(engine: str, a, gguf: Path, work: Path) -> tuple[Engine, dict]:
    """The server and the request body it gets (same prompt, budget, greedy)."""
    port = free_port()
    env = dict(os.environ)
    body = {"prompt": PROMPT, "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True}
    if engine == "specd":
        env["SPECD_THREADS"] = str(a.threads)
        argv = [str(a.specd), "serve", "--port", str(port), "--model", str(gguf),
                "--policy-dir", str(work / "policies"), *a.specd_args.split()]
        body = dict(body, model="default", drafter="none")
    else:
        # -np slots of n_ctx / np tokens each: room for the prompt and budget.
        argv = [str(a.llama_server), "-m", str(gguf), "--port", str(port), "-np", str(a.slots),
                "-c", str(a.slots * a.slot_ctx), "-t", str(a.threads), "-tb", str(a.threads),
                *a.llama_args.split()]
        body = dict(body, n_predict=a.max_tokens)
    e = Engine(engine, argv, env, work / f"{engine}.log", port)
    try:
        e.wait_ready()
    except Exception:
        e.stop()
        raise
    return e, body


def post(url: str, body: dict) -> int:
    r = httpx.post(url + "/v1/completions", json=body, timeout=1200)
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
    return int(r.json()["usage"]["completion_tokens"])


def closed_loop(url: str, body: dict, clients: int, rounds: int) -> tuple[float, int]:
    """Generated tokens per wall second of `clients` clients, `rounds` requests each."""
    counts: list[int] = []
    errors: list[BaseException] = []

    def client() -> None:
        try:
            for _ in range(rounds):
                counts.append(post(url, body))
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(str(errors[0]))
    short = [n for n in counts if n != body["max_tokens"]]
    if short:
        raise RuntimeError(f"{len(short)} responses did not decode the whole budget: {short[:4]}")
    return sum(counts) / wall, sum(counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--specd", type=Path, default=server_bin())
    ap.add_argument("--llama-server", type=Path, required=True)
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--rounds", type=int, default=2, help="requests per client per point")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=8, help="llama-server -np")
    ap.add_argument("--slot-ctx", type=int, default=512, help="llama-server context per slot")
    ap.add_argument("--specd-args", default="", help="extra `specd serve` flags")
    ap.add_argument("--llama-args", default="", help="extra llama-server flags")
    ap.add_argument("--keep", action="store_true", help="keep the GGUFs for the next run")
    ap.add_argument("--shape", help="one random shape for every arch (e.g. small: a quick check of the script)")
    a = ap.parse_args()
    for p in (a.specd, a.llama_server):
        if not p.exists():
            sys.exit(f"{p} is missing (cargo build --release -p specd; make llama-server)")
    clients = [int(c) for c in a.clients.split(",")]
    cache = specd_home() / "bench-llama-server"
    work = Path(tempfile.mkdtemp(prefix="bench-llama-server-"))
    print(f"# logs in {work}", file=sys.stderr)
    head = ["arch", "shape", "params", "file"]
    for c in clients:
        head += [f"specd @{c}", f"llama-server @{c}", f"ratio @{c}"]
    rows = []
    for i, arch in enumerate(a.archs.split(",")):
        shape, model = ARCHS[arch]
        if a.shape:
            shape, model = a.shape, f"{a.shape} shape"
        gguf = cache / f"random-{arch}-{shape}.gguf"
        write_gguf(a.specd, arch, shape, gguf)
        row = {"arch": arch, "shape": f"{shape} ({model})",
               "params": f"{parameters(gguf) / 1e9:.2f}B", "file": f"{gguf.stat().st_size / 1e9:.2f} GB"}
        # Alternate which engine goes first, so neither always runs on the
        # warmer (or the more loaded) half of an architecture's minutes.
        order = ("specd", "llama-server") if i % 2 == 0 else ("llama-server", "specd")
        for engine in order:
            try:
                e, body = start(engine, a, gguf, work)
            except Exception as ex:  # noqa: BLE001
                row[engine] = f"error: {ex}"
                print(f"{arch} {engine}: {ex}", file=sys.stderr)
                continue
            try:
                warm = dict(body, max_tokens=8)
                if "n_predict" in warm:
                    warm["n_predict"] = 8
                post(e.url, warm)
                for c in clients:
                    tps, n = closed_loop(e.url, body, c, a.rounds)
                    row[(engine, c)] = tps
                    print(f"{arch} {engine} @{c}: {tps:.2f} tok/s ({n} tokens)", file=sys.stderr, flush=True)
            except Exception as ex:  # noqa: BLE001
                row[engine] = f"error: {ex}"
                print(f"{arch} {engine}: {ex} | {e.tail()}", file=sys.stderr)
            finally:
                e.stop()
        if not a.keep:
            gguf.unlink()
        rows.append(row)

    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [r["arch"], r["shape"], r["params"], r["file"]]
        for c in clients:
            s, l = r.get(("specd", c)), r.get(("llama-server", c))
            cells += [f"{s:.2f}" if s else r.get("specd", "-"), f"{l:.2f}" if l else r.get("llama-server", "-"),
                      f"{s / l:.2f}x" if s and l else "-"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
