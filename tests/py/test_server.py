"""End-to-end tests of `specd serve` (issue 5) with real HTTP clients.

The `openai` and `ollama` PyPI packages (tests/py/requirements.txt) and raw
httpx talk to `specd serve` subprocesses (tests/py/conftest.py) on the real
default model. Every generation is short (<= 48 tokens) and greedy: since
specd applies each API's sampling defaults (OpenAI temperature 1, Ollama 0.8
with repeat_penalty 1.1), the tests ask for temperature 0 explicitly, and
repeat_penalty 1 on the Ollama side where its text is compared with OpenAI's.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from conftest import MODEL, ROOT, Server

QUESTION = "What is the capital of France?"
STATS_KEYS = {
    "prompt_tokens", "generated_tokens", "prompt_seconds", "decode_seconds", "done_reason",
    "drafter", "schedule", "acceptance", "rounds", "drafted", "accepted", "acceptance_rate",
    "mean_draft", "mean_accepted", "draft_seconds", "verify_seconds", "policy_seconds",
    "policy_failure",
}
# Raw text the n-gram drafter can predict: speculation has work to do.
REPETITIVE = "red green blue yellow red green blue yellow red green blue yellow red green"
PLUGINS = ROOT / "plugins" / "target" / "wasm32-wasip2" / "release"


# Greedy with no penalty: the same tokens on both APIs.
GREEDY = {"temperature": 0, "repeat_penalty": 1}


def chat_body(content: str = QUESTION, stream: bool = False, **options) -> dict:
    options.setdefault("num_predict", 32)
    options = {**GREEDY, **options}
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "stream": stream, "options": options}


def post(server: Server, path: str, body, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=timeout)


def raw_generate(server: Server, prompt: str = REPETITIVE, **options) -> dict:
    options.setdefault("num_predict", 40)
    options = {**GREEDY, **options}
    r = post(server, "/api/generate", {"model": MODEL, "prompt": prompt, "raw": True,
                                       "stream": False, "options": options})
    assert r.status_code == 200, r.text
    return r.json()


# --- real clients -----------------------------------------------------------

def test_openai_chat(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    r = client.chat.completions.create(model=MODEL, max_tokens=32, temperature=0,
                                       messages=[{"role": "user", "content": QUESTION}])
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
    spec = r.model_extra["speculation"]
    assert STATS_KEYS <= spec.keys()
    assert spec["drafter"] == "ngram" and spec["schedule"] == "throughput" and spec["acceptance"] == "greedy"

    chunks = list(client.chat.completions.create(
        model="default", max_tokens=32, temperature=0, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": QUESTION}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    # include_usage: OpenAI's last chunk, with the usage and no choices.
    assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-1].model_extra["speculation"]["generated_tokens"] == r.usage.completion_tokens


def test_openai_completions_and_models(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                  temperature=0)
    assert "Paris" in r.choices[0].text
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    parts = list(client.completions.create(model=MODEL, prompt="The capital of France is",
                                           max_tokens=8, temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in parts) == r.choices[0].text
    assert [m.id for m in client.models.list()] == [MODEL]
    # The SSE stream ends with [DONE].
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"model": MODEL, "prompt": "Hi", "max_tokens": 2, "stream": True}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "usage" in json.loads(events[-2]) and "speculation" in json.loads(events[-2])


def test_ollama_client(server):
    client = ollama.Client(host=server.url)
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                    options={"num_predict": 32, "temperature": 0})
    assert "Paris" in r.message.content
    assert r.done and r.done_reason == "stop"
    assert r.eval_count > 0 and r.prompt_eval_count > 0 and r.total_duration > r.eval_duration > 0
    parts = list(client.chat(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                             options={"num_predict": 32, "temperature": 0}, stream=True))
    assert "".join(p.message.content for p in parts) == r.message.content
    assert parts[-1].done and not any(p.done for p in parts[:-1])

    g = client.generate(model="default", prompt=QUESTION, options={"num_predict": 32, "temperature": 0})
    assert g.response == r.message.content  # /api/generate applies the chat template
    gs = list(client.generate(model=MODEL, prompt=QUESTION, options={"num_predict": 32, "temperature": 0},
                              stream=True))
    assert "".join(p.response for p in gs) == g.response

    assert [m.model for m in client.list().models] == [MODEL]
    show = client.show(MODEL)
    assert show.modelinfo["llama.context_length"] == 8192
    assert client.ps().models[0].model == MODEL
    assert httpx.get(server.url + "/api/version").json()["version"]


def test_ollama_final_fields(server):
    lines = []
    with httpx.stream("POST", server.url + "/api/chat", json=chat_body(stream=True), timeout=60) as resp:
        assert resp.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(x) for x in resp.iter_lines() if x]
    last = lines[-1]
    for k in ("done", "done_reason", "total_duration", "load_duration", "prompt_eval_count",
              "prompt_eval_duration", "eval_count", "eval_duration", "speculation"):
        assert k in last, k
    assert STATS_KEYS <= last["speculation"].keys()
    assert last["eval_count"] == last["speculation"]["generated_tokens"]


# --- per-request policies ----------------------------------------------------

def test_schedule_per_request(server):
    runs = {s: raw_generate(server, schedule=s) for s in ("throughput", "constant", "heuristic")}
    runs["constant-k1"] = raw_generate(server, schedule="constant", schedule_config={"k": 1})
    texts = {r["response"] for r in runs.values()}
    assert len(texts) == 1, texts  # greedy: the policy never changes the text
    stats = {name: r["speculation"] for name, r in runs.items()}
    for name, s in stats.items():
        assert s["schedule"] == name.split("-")[0]
        assert s["drafted"] > 0 and s["policy_failure"] is None
    shapes = {(s["rounds"], s["drafted"], s["accepted"]) for s in stats.values()}
    assert len(shapes) > 1, stats
    # k = 1 drafts at most one token a round
    assert stats["constant-k1"]["mean_draft"] <= 1.0 < stats["constant"]["mean_draft"]
    # No speculation at all: same text, no drafts.
    plain = raw_generate(server, drafter="none")
    assert plain["response"] in texts and plain["speculation"]["drafted"] == 0
    # OpenAI: the same fields at the top level of the body.
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    r = client.completions.create(model=MODEL, prompt=REPETITIVE, max_tokens=40, temperature=0,
                                  extra_body={"schedule": "constant", "schedule_config": {"k": 1}})
    assert r.choices[0].text in texts
    assert r.model_extra["speculation"]["mean_draft"] <= 1.0
    assert r.model_extra["speculation"]["schedule"] == "constant"


def test_speculative_context_ends_where_plain_decoding_does(server):
    # The answer repeats an earlier one that the prompt follows with
    # <|im_end|>\n: n-gram drafts run on past the EOS and the target agrees
    # with them, so the round commits tokens after it. What comes back
    # (Ollama's `context`) ends at the EOS all the same, as plain decoding's.
    prompt = ("<|im_start|>user\nRepeat after me: the quick brown fox jumps over the lazy dog."
              "<|im_end|>\n<|im_start|>assistant\nthe quick brown fox jumps over the lazy dog."
              "<|im_end|>\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n")
    plain = raw_generate(server, prompt, drafter="none", num_predict=24)
    spec = raw_generate(server, prompt, drafter="ngram", schedule="constant",
                        schedule_config={"k": 8}, num_predict=24)
    assert plain["done_reason"] == "stop" and plain["response"] == spec["response"]
    s = spec["speculation"]
    # Committed (a round's accepted drafts and its own token) past the EOS.
    assert s["rounds"] + s["accepted"] > plain["eval_count"] + 1, s
    assert spec["context"] == plain["context"]
    assert len(plain["context"]) == plain["prompt_eval_count"] + plain["eval_count"] + 1  # the EOS


# --- errors ------------------------------------------------------------------

@pytest.mark.parametrize("body,status,needle", [
    ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model 'nope' not found"),
    ({"messages": [{"role": "user", "content": "x"}]}, 400, "model is required"),
    (chat_body(temperature=-1), 400, "temperature"),
    (chat_body(top_p=1.5), 400, "top_p"),
    (chat_body(top_k=-3), 400, "top_k"),
    (chat_body(temperature="hot"), 400, "temperature"),
    (chat_body(schedule="no-such-policy"), 400, "no-such-policy"),
    (chat_body(acceptance="no-such-policy"), 400, "no-such-policy"),
    (chat_body(drafter="warp"), 400, "drafter"),
    (chat_body(drafter="model:nope"), 400, "nope"),
    (chat_body(schedule="constant", schedule_config={"bogus": 1}), 400, "bogus"),
    (chat_body(draft_max=1000), 400, "draft_max"),
    (chat_body(content="hello " * 9000), 400, "context length"),
])
def test_bad_requests(server, body, status, needle):
    r = post(server, "/api/chat", body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"], r.text


def test_bad_requests_other(server):
    r = httpx.post(server.url + "/api/generate", content=b"{not json", timeout=10)
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    r = httpx.post(server.url + "/api/chat", content=b"", timeout=10)
    assert r.status_code == 400
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.chat.completions.create(model=MODEL, top_p=0, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.completions.create(model=MODEL, prompt="hello " * 9000, stream=True)
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=server.url).chat(model="llama3", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404 and "not found" in e.value.error
    assert httpx.get(server.url + "/api/nothing").status_code == 404
    # still serving
    assert "Paris" in post(server, "/api/chat", chat_body()).json()["message"]["content"]


# --- cancellation --------------------------------------------------------------

def metric(server: Server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_disconnect_cancels(server, start_server):
    before = metric(server, 'specd_generations_total{outcome="cancelled"}')
    long = chat_body("Write a long story about a dragon.", stream=True, num_predict=2000)
    t0 = time.monotonic()
    with httpx.stream("POST", server.url + "/api/chat", json=long, timeout=60) as resp:
        assert resp.status_code == 200
        got = 0
        for line in resp.iter_lines():
            if line:
                got += 1
            if got == 3:
                break  # leave mid-stream: the connection closes
    # generation stops at once: the next request is not stuck behind 2000 tokens
    probe = chat_body(REPETITIVE, num_predict=24)
    after = post(server, "/api/chat", probe).json()
    assert time.monotonic() - t0 < 60
    assert metric(server, 'specd_generations_total{outcome="cancelled"}') == before + 1
    gen = raw_generate(server, num_predict=24)
    # a fresh server answers the same
    fresh = start_server()
    try:
        assert post(fresh, "/api/chat", probe).json()["message"]["content"] == after["message"]["content"]
        assert raw_generate(fresh, num_predict=24)["response"] == gen["response"]
    finally:
        fresh.stop()


def test_non_streaming_disconnect(server):
    # A client that times out on a non-streaming request also cancels it.
    with pytest.raises(httpx.ReadTimeout):
        post(server, "/api/chat", chat_body("Write a long story about a dragon.", num_predict=2000), timeout=1.5)
    r = post(server, "/api/chat", chat_body())
    assert r.status_code == 200 and "Paris" in r.json()["message"]["content"]


# --- concurrency -----------------------------------------------------------------

def test_eight_concurrent_streams(server):
    expected = post(server, "/api/chat", chat_body(num_predict=16)).json()["message"]["content"]
    results: list = [None] * 8
    barrier = threading.Barrier(8)

    def client(i: int) -> None:
        try:
            barrier.wait()
            if i % 2:
                c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
                s = c.chat.completions.create(model=MODEL, max_tokens=16, stream=True, temperature=0,
                                              messages=[{"role": "user", "content": QUESTION}])
                results[i] = "".join(x.choices[0].delta.content or "" for x in s if x.choices)
            else:
                c = ollama.Client(host=server.url, timeout=300)
                s = c.chat(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                           options={"num_predict": 16, **GREEDY}, stream=True)
                results[i] = "".join(x.message.content for x in s)
        except Exception as e:  # noqa: BLE001
            results[i] = e

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert results == [expected] * 8
    assert "Paris" in expected


def test_full_queue_gets_503(start_server):
    small = start_server("--queue", "1", "--max-sequences", "1")
    statuses: list = [None] * 6
    texts: list = [None] * 6
    barrier = threading.Barrier(6)

    def client(i: int) -> None:
        barrier.wait()
        with httpx.stream("POST", small.url + "/api/chat", json=chat_body(stream=True, num_predict=16),
                          timeout=300) as r:
            statuses[i] = r.status_code
            if r.status_code == 503:
                assert r.headers["retry-after"]
                assert "busy" in json.loads(r.read())["error"]
            else:
                texts[i] = "".join(json.loads(x).get("message", {}).get("content", "")
                                   for x in r.iter_lines() if x)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert 503 in statuses and 200 in statuses, statuses
    assert set(statuses) <= {200, 503}
    assert all("Paris" in t for t, s in zip(texts, statuses) if s == 200)
    # the queue drains and the server serves again
    assert post(small, "/api/chat", chat_body()).status_code == 200
    assert metric(small, 'specd_generations_total{outcome="busy"}') >= 1


# --- the policy registry -----------------------------------------------------------

def builtin_component(name: str) -> bytes:
    p = PLUGINS / f"{name}.wasm"
    assert p.exists(), f"{p} is missing: cargo build builds the plugins"
    return p.read_bytes()


def test_policy_upload_use_list_delete(start_server, tmp_path):
    pdir = tmp_path / "policies"
    srv = start_server(policy_dir=pdir)
    names = {p["name"]: p for p in httpx.get(srv.url + "/api/policies").json()["policies"]}
    assert {"constant", "heuristic", "throughput", "greedy", "rejection"} <= names.keys()
    assert names["greedy"]["builtin"]

    wasm = builtin_component("constant")
    r = httpx.post(srv.url + "/api/policies", params={"name": "my-constant"}, content=wasm,
                   headers={"content-type": "application/wasm"})
    assert r.status_code == 201, r.text
    info = r.json()["policy"]
    assert info["name"] == "my-constant" and info["exports"]["schedule"] and not info["builtin"]
    assert (pdir / "my-constant.wasm").read_bytes() == wasm
    listed = {p["name"]: p for p in httpx.get(srv.url + "/api/policies").json()["policies"]}
    assert listed["my-constant"]["sha256"] == info["sha256"]

    # use it, by name and by hash: same text as the built-in schedule
    base = raw_generate(srv, schedule="constant", schedule_config={"k": 2})
    mine = raw_generate(srv, schedule="my-constant", schedule_config={"k": 2})
    by_hash = raw_generate(srv, schedule=info["sha256"], schedule_config={"k": 2})
    assert mine["response"] == base["response"] == by_hash["response"]
    assert mine["speculation"]["schedule"] == "my-constant"
    assert mine["speculation"]["drafted"] == base["speculation"]["drafted"]

    # refused uploads; the server keeps serving
    r = httpx.post(srv.url + "/api/policies", params={"name": "greedy"}, content=wasm)
    assert r.status_code == 409 and "built-in" in r.json()["error"]
    r = httpx.post(srv.url + "/api/policies", params={"name": "junk"}, content=bytes(range(256)) * 40)
    assert r.status_code == 400 and "WebAssembly" in r.json()["error"]
    r = httpx.post(srv.url + "/api/policies", params={"name": "core"}, content=b"\0asm\x01\0\0\0")
    assert r.status_code == 400 and "component" in r.json()["error"]
    r = httpx.post(srv.url + "/api/policies", content=wasm)
    assert r.status_code == 400 and "name" in r.json()["error"]
    r = httpx.post(srv.url + "/api/policies", params={"name": "Bad Name!"}, content=wasm)
    assert r.status_code == 400
    limit = httpx.get(srv.url + "/api/policies").json()["limits"]["max_component_bytes"]
    r = httpx.post(srv.url + "/api/policies", params={"name": "big"}, content=b"\0" * (limit + 10), timeout=60)
    assert r.status_code in (400, 413) and "limit" in r.json()["error"]
    assert not (pdir / "junk.wasm").exists() and not (pdir / "core.wasm").exists()
    assert "Paris" in post(srv, "/api/chat", chat_body()).json()["message"]["content"]

    # survives a restart
    srv.stop()
    srv = start_server(policy_dir=pdir)
    assert "my-constant" in {p["name"] for p in httpx.get(srv.url + "/api/policies").json()["policies"]}
    assert raw_generate(srv, schedule="my-constant", schedule_config={"k": 2})["response"] == base["response"]

    # delete
    assert httpx.delete(srv.url + "/api/policies/greedy").status_code == 409
    assert httpx.delete(srv.url + "/api/policies/nope").status_code == 404
    r = httpx.delete(srv.url + "/api/policies/my-constant")
    assert r.status_code == 200 and r.json()["removed"] == ["my-constant"]
    assert not (pdir / "my-constant.wasm").exists()
    assert "my-constant" not in {p["name"] for p in httpx.get(srv.url + "/api/policies").json()["policies"]}
    r = post(srv, "/api/generate", {"model": MODEL, "prompt": "x", "options": {"schedule": "my-constant"}})
    assert r.status_code == 400 and "my-constant" in r.json()["error"]


# --- health and metrics --------------------------------------------------------------

def test_health_and_metrics(server):
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    post(server, "/api/chat", chat_body(REPETITIVE, num_predict=16))
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for name in ("specd_http_requests_total", "specd_generated_tokens_total", "specd_prompt_tokens_total",
                 "specd_speculation_rounds_total", "specd_speculation_drafted_tokens_total",
                 "specd_speculation_accepted_tokens_total", "specd_request_policy_failures_total",
                 "specd_policy_calls_total", "specd_policy_call_seconds_total", "specd_policy_failures_total",
                 "specd_queue_depth"):
        assert name in r.text, name
    assert metric(server, "specd_generated_tokens_total") >= 16
    assert metric(server, "specd_policy_calls_total") > 0


FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize("name,kind", [("trap", "trap"), ("oversized-k", "invalid_answer"), ("spin", "timeout")])
def test_hostile_policy_is_contained(server, name, kind):
    """A user schedule that traps, answers out of range or spins forever
    (fixtures/*.wasm: the hostile WAT components of host/policy/tests) ends
    speculation for its request only: the text is the plain greedy text and
    the failure shows in `speculation.policy_failure` and /metrics."""
    wasm = (FIXTURES / f"{name}-schedule.wasm").read_bytes()
    r = httpx.post(server.url + "/api/policies", params={"name": f"hostile-{name}"}, content=wasm)
    assert r.status_code == 201, r.text
    plain = raw_generate(server, num_predict=24, drafter="none")
    before = metric(server, f'specd_request_policy_failures_total{{kind="{kind}"}}')
    out = raw_generate(server, num_predict=24, schedule=f"hostile-{name}")
    assert out["response"] == plain["response"]
    failure = out["speculation"]["policy_failure"]
    assert failure["policy"] == f"hostile-{name}" and failure["kind"] == kind, failure
    assert metric(server, f'specd_request_policy_failures_total{{kind="{kind}"}}') == before + 1
    # the OpenAI stream reports it in its final chunk; the next request is fine
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    chunks = list(client.completions.create(model=MODEL, prompt=REPETITIVE, max_tokens=24, stream=True,
                                            temperature=0, extra_body={"schedule": f"hostile-{name}"}))
    assert "".join(c.choices[0].text for c in chunks) == plain["response"]
    assert chunks[-1].model_extra["speculation"]["policy_failure"]["kind"] == kind
    ok = raw_generate(server, num_predict=24)
    assert ok["response"] == plain["response"] and ok["speculation"]["policy_failure"] is None
    assert httpx.delete(server.url + f"/api/policies/hostile-{name}").status_code == 200
    # the server logs the failure, in plain text: its log is a file, not a terminal
    log = server.log()
    assert "policy failed" in log and f"hostile-{name}" in log, log
    assert "\x1b[" not in log, "colour escapes in a log file"
