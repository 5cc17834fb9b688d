"""Models found by name where users keep them (issue 65): `ollama:NAME[:TAG]`
in Ollama's store and `hf:ORG/NAME[@REVISION][:FILE]` in the Hugging Face hub
cache, on the CLI (`specd generate`, `specd list`) and `specd serve` (the name
clients send, `/v1/models`, Ollama's `/api/tags` and `/api/show`).

Both stores are built here in temporary folders, the way Ollama and
huggingface_hub lay them out, around the default model: its GGUF as an Ollama
blob (a hard link, else a copy) under several manifests, and a hub-cache tree
around the directory `specd convert` makes of it and around GGUF files.
OLLAMA_MODELS and HF_HUB_CACHE point specd at them; nothing reaches a network.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from conftest import MODEL, model_path
from specd_paths import run, server_bin

PROMPT = "The capital of France is"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
GGUF_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
BAD_DIGEST = "0" * 64


def sha256_of(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def ollama_manifest(root: Path, path: str, digest: str, size: int) -> None:
    """A manifest as `ollama pull` writes it: config, model and template layers."""
    m = root / "manifests" / path
    m.parent.mkdir(parents=True, exist_ok=True)
    m.write_text(json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": "sha256:" + "1" * 64, "size": 2},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": size},
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "2" * 64, "size": 10},
        ],
    }))


def hub_repo(cache: Path, repo: str, commit: str, files: dict[str, Path]) -> Path:
    """A repository in the hub cache as huggingface_hub leaves it: blobs named
    by their sha256, the snapshot's files links into them, refs/main."""
    r = cache / ("models--" + repo.replace("/", "--"))
    snap = r / "snapshots" / commit
    snap.mkdir(parents=True)
    (r / "refs").mkdir()
    (r / "refs" / "main").write_text(commit)
    for name, src in files.items():
        digest = sha256_of(src)
        blob = r / "blobs" / digest
        if not blob.exists():
            link_or_copy(src, blob)
        (snap / name).symlink_to(Path("../../blobs") / digest)
    return snap


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` with its size and mtime (to see nothing was written)."""
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    gguf = model_path(MODEL)
    digest, size = sha256_of(gguf), gguf.stat().st_size
    base = tmp_path_factory.mktemp("stores")

    ollama = base / "ollama"
    link_or_copy(gguf, ollama / "blobs" / f"sha256-{digest}")
    ollama_manifest(ollama, "registry.ollama.ai/library/smollm2/135m", digest, size)
    ollama_manifest(ollama, "registry.ollama.ai/someone/smol/latest", digest, size)
    ollama_manifest(ollama, "hf.co/Org/SmolLM2-GGUF/Q4_1", digest, size)
    # A blob whose bytes are not its digest (what a corrupted file looks like).
    link_or_copy(gguf, ollama / "blobs" / f"sha256-{BAD_DIGEST}")
    ollama_manifest(ollama, "registry.ollama.ai/library/broken/latest", BAD_DIGEST, size)

    hf = base / "hub"
    converted = base / "converted"
    p = run("convert", gguf, converted)
    assert p.returncode == 0, p.stderr
    files = {f.name: f for f in converted.iterdir()}
    assert "config.json" in files and any(n.endswith(".safetensors") for n in files), files
    hub_repo(hf, "specd-test/SmolLM2-135M", COMMIT, files)
    hub_repo(hf, "specd-test/SmolLM2-135M-GGUF", GGUF_COMMIT,
             {"SmolLM2-135M-Q4_1.gguf": gguf, "SmolLM2-135M-Q8_0.gguf": gguf, "README.md": converted / "config.json"})
    # An architecture specd does not run, for the listing.
    bert = base / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (bert / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    hub_repo(hf, "specd-test/tiny-bert", "ab" * 20, {"config.json": bert / "config.json",
                                                     "model.safetensors": bert / "model.safetensors"})
    shutil.rmtree(converted)  # its files live on as the cache's blobs

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OLLAMA_MODELS", str(ollama))
        mp.setenv("HF_HUB_CACHE", str(hf))
        before = tree(ollama) | tree(hf)
        yield {"gguf": gguf, "digest": digest, "ollama": ollama, "hf": hf}
        assert tree(ollama) | tree(hf) == before, "specd wrote into a store it only reads"


def generate(model: str, *extra: str):
    return run("generate", "--model", model, "--max-tokens", "12", "--drafter", "none", *extra, PROMPT)


def test_list_shows_both_stores_with_what_specd_runs(stores):
    p = run("list", "--json")
    assert p.returncode == 0, p.stderr
    by = {e["name"]: e for e in json.loads(p.stdout)}
    size = stores["gguf"].stat().st_size
    for name in ["ollama:smollm2:135m", "ollama:someone/smol:latest", "ollama:hf.co/Org/SmolLM2-GGUF:Q4_1",
                 "hf:specd-test/SmolLM2-135M-GGUF:SmolLM2-135M-Q4_1.gguf", MODEL]:
        e = by[name]
        assert (e["architecture"], e["quantization"], e["size"], e["runs"]) == ("llama", "Q4_1", size, True), e
    assert by["ollama:smollm2:135m"]["source"] == "ollama"
    assert by[MODEL]["source"] == "specd"
    d = by["hf:specd-test/SmolLM2-135M"]
    assert (d["architecture"], d["quantization"], d["runs"]) == ("llama", "F32", True), d
    assert d["size"] > 4 * size  # float32 weights
    b = by["hf:specd-test/tiny-bert"]
    assert (b["architecture"], b["runs"]) == ("bert", False) and "bert" in b["why_not"], b
    # The table says the same, and where it looked.
    t = run("list")
    assert t.returncode == 0, t.stderr
    lines = t.stdout.splitlines()
    assert lines[0].split() == ["NAME", "ARCH", "QUANT", "SIZE", "RUNS"]
    row = next(line for line in lines if line.startswith("hf:specd-test/tiny-bert "))
    assert " no: " in row and "bert" in row, row
    assert str(stores["ollama"]) in t.stderr and str(stores["hf"]) in t.stderr, t.stderr


def test_generate_by_name_is_the_file(stores):
    want = generate(str(stores["gguf"]))
    assert want.returncode == 0, want.stderr
    assert want.stdout.strip()
    for name in ["ollama:smollm2:135m", "hf:specd-test/SmolLM2-135M-GGUF:q8_0"]:
        got = generate(name)
        assert got.returncode == 0, (name, got.stderr)
        assert got.stdout == want.stdout, name
    # The digest check's result is kept under SPECD_HOME, keyed by the blob's
    # path, size and mtime: a later load does not hash it again.
    home = Path(os.environ.get("SPECD_HOME") or Path.home() / ".cache" / "specd")
    record = (home / "checked" / f"sha256-{stores['digest']}").read_text().split("\n")
    blob = stores["ollama"] / "blobs" / f"sha256-{stores['digest']}"
    st = blob.stat()
    assert record[:3] == [str(blob.resolve()), str(st.st_size), str(st.st_mtime_ns)], record


def test_a_corrupted_blob_is_a_clear_error(stores):
    p = generate("ollama:broken")
    assert p.returncode == 1
    err = p.stderr
    assert "ollama:broken:latest" in err and f"its manifest says {BAD_DIGEST}" in err, err
    assert f"has sha256 {stores['digest']}" in err and "corrupt" in err, err


def test_missing_names_say_where_they_looked(stores):
    ollama, hf = stores["ollama"], stores["hf"]
    cases = [
        ("ollama:nope:7b", [str(ollama / "manifests/registry.ollama.ai/library/nope/7b"), "from OLLAMA_MODELS"]),
        ("ollama:smollm2:9b", ["its tags there: 135m"]),
        ("hf:specd-test/nope", [str(hf / "models--specd-test--nope"), "from HF_HUB_CACHE", "never downloads"]),
        ("hf:specd-test/SmolLM2-135M@v2", ["no revision \"v2\"", "refs there: main", COMMIT]),
        ("hf:specd-test/SmolLM2-135M-GGUF",
         ["several GGUF files: SmolLM2-135M-Q4_1.gguf, SmolLM2-135M-Q8_0.gguf", "choose one with :FILE"]),
        ("hf:specd-test/SmolLM2-135M-GGUF:Q5_K_M", ["no file or quantization \"Q5_K_M\""]),
        ("smollm2", ["unknown model", "ollama:NAME[:TAG]", "hf:ORG/NAME"]),
        ("someone/smol", ["Ollama's store has it: --model ollama:someone/smol:latest"]),
    ]
    for name, needles in cases:
        p = generate(name)
        assert p.returncode == 1, (name, p.stdout)
        for n in needles:
            assert n in p.stderr, (name, n, p.stderr)
    # Unset, the defaults under $HOME, said as such.
    env = {k: v for k, v in os.environ.items() if k not in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME")}
    env["HOME"] = str(stores["ollama"].parent / "empty-home")
    p = subprocess.run([str(server_bin()), "generate", "--model", "ollama:smollm2:135m", PROMPT],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1
    assert f"{env['HOME']}/.ollama/models" in p.stderr and "OLLAMA_MODELS sets another" in p.stderr, p.stderr


def test_serve_by_hub_cache_name(stores, start_server):
    name = "hf:specd-test/SmolLM2-135M"
    s = start_server("--model", name)
    try:
        serve_by_hub_cache_name(s, name)
    finally:
        s.stop()  # its float32 weights need not outlive the test


def serve_by_hub_cache_name(s, name):
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="none")
    assert [m.id for m in client.models.list()] == [name]
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    r = httpx.post(s.url + "/v1/completions", json={"model": name, **body}, timeout=120)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert text and r.json()["model"] == name
    r = httpx.post(s.url + "/v1/completions", json={"model": "default", **body}, timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == text, r.text
    r = httpx.post(s.url + "/v1/completions", json={"model": "hf:specd-test/other", **body}, timeout=120)
    assert r.status_code == 404, r.text
    tags = httpx.get(s.url + "/api/tags").json()["models"]
    assert [t["name"] for t in tags] == [name]
    d = tags[0]["details"]
    assert (d["format"], d["family"], d["quantization_level"]) == ("safetensors", "llama", "F32"), d


def test_serve_by_ollama_name(stores, start_server):
    s = start_server("--model", "ollama:someone/smol")
    try:
        serve_by_ollama_name(s, stores)
    finally:
        s.stop()


def serve_by_ollama_name(s, stores):
    assert [m["id"] for m in httpx.get(s.url + "/v1/models").json()["data"]] == ["ollama:someone/smol"]
    tag = httpx.get(s.url + "/api/tags").json()["models"][0]
    assert tag["name"] == "ollama:someone/smol" and tag["digest"] == stores["digest"], tag
    assert tag["size"] == stores["gguf"].stat().st_size
    assert (tag["details"]["family"], tag["details"]["quantization_level"]) == ("llama", "Q4_1"), tag
    # Ollama's implicit :latest, said or not.
    show = httpx.post(s.url + "/api/show", json={"model": "ollama:someone/smol:latest"}, timeout=30)
    assert show.status_code == 200, show.text
    info = show.json()["model_info"]
    assert info["general.architecture"] == "llama" and info["llama.block_count"] == 30, info
    c = ollama.Client(host=s.url, timeout=120)
    assert [m.model for m in c.list().models] == ["ollama:someone/smol"]
    assert c.show("ollama:someone/smol").details.quantization_level == "Q4_1"
    r = httpx.post(s.url + "/api/generate", timeout=120, json={
        "model": "ollama:someone/smol:latest", "prompt": PROMPT, "raw": True, "stream": False,
        "options": {"temperature": 0, "num_predict": 8}})
    assert r.status_code == 200 and r.json()["response"], r.text
