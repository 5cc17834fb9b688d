"""The fields routers and benchmark clients send (issue 53), against
`specd serve` on the real default model with real HTTP clients.

- vllm-router's rewrite of every chat request and guidellm's body are
  accepted, and the greedy text is a direct request's.
- The extensions that change the output do, on both APIs, and compose with
  speculation: `ignore_eos`, `min_tokens`, `stop_token_ids`,
  `include_stop_str_in_output`, `skip_special_tokens`, `top_k: -1`,
  `repetition_penalty`.
- `stream_options.include_usage`, vLLM's per-request speculation metrics,
  and the body `vllm bench serve --ignore-eos` sends.
"""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from conftest import MODEL

QUESTION = "What is the capital of France?"
MSGS = [{"role": "user", "content": QUESTION}]
REPETITIVE = "red green blue yellow red green blue yellow red green blue yellow red green"
GREEDY = {"temperature": 0, "seed": 0}
PLAIN = {"drafter": "none"}
SPEC = {"drafter": "ngram", "schedule": "constant", "schedule_config": {"k": 4}}

# vllm-router rewrites each chat request and adds these (issue 53).
ROUTER_FIELDS = {
    "logprobs": False, "no_stop_trim": False, "ignore_eos": False,
    "continue_final_message": False, "skip_special_tokens": True,
    "separate_reasoning": True, "stream_reasoning": True,
    "return_hidden_states": False, "include_reasoning": True,
}


def chat(server, **body) -> dict:
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"model": MODEL, "messages": MSGS, **GREEDY, **body}, timeout=180)
    assert r.status_code == 200, r.text
    return r.json()


def text_of(resp: dict) -> str:
    return resp["choices"][0]["message"]["content"]


def sse(server, path: str, body: dict) -> list:
    """The data lines of a streamed response, parsed (`[DONE]` kept as a string)."""
    out = []
    with httpx.stream("POST", server.url + path, json=body, timeout=180) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                d = line[len("data: "):]
                out.append(d if d == "[DONE]" else json.loads(d))
    return out


def test_router_and_guidellm_bodies_keep_the_greedy_text(server):
    direct = text_of(chat(server, max_tokens=32))
    assert text_of(chat(server, max_tokens=32, **ROUTER_FIELDS)) == direct
    # guidellm: content as a list of parts, max_completion_tokens,
    # stream_options with continuous usage (its ignore_eos is tested below).
    events = sse(server, "/v1/chat/completions", {
        "model": MODEL, **GREEDY, "stream": True, "max_completion_tokens": 32,
        "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    })
    streamed = "".join(e["choices"][0]["delta"].get("content") or ""
                       for e in events[:-1] if e["choices"])
    assert streamed == direct
    # Non-neutral values of what specd does not implement are refused by name.
    for extra, param in [({"continue_final_message": True}, "continue_final_message"),
                         ({"guided_json": {"type": "object"}}, "guided_json"),
                         ({"add_generation_prompt": False}, "add_generation_prompt"),
                         ({"stream_options": {"include_usage": True, "chunky": 1}},
                          "stream_options.chunky")]:
        r = httpx.post(server.url + "/v1/chat/completions",
                       json={"model": MODEL, "messages": MSGS, "max_tokens": 2, **extra}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_ignore_eos_runs_to_the_budget_and_composes_with_speculation(server):
    ended = chat(server, max_tokens=48, **PLAIN)
    assert ended["choices"][0]["finish_reason"] == "stop"
    n_plain = ended["usage"]["completion_tokens"]
    assert n_plain < 40, ended  # the answer ends by itself well before the budget
    runs = {}
    for name, spec in [("plain", PLAIN), ("spec", SPEC)]:
        r = chat(server, max_tokens=48, ignore_eos=True, **spec)
        assert r["choices"][0]["finish_reason"] == "length"
        assert r["usage"]["completion_tokens"] == 48, r["usage"]
        runs[name] = text_of(r)
    # Without skipping special tokens the end-of-turn token that no longer
    # ends the answer is in the text, right after it.
    assert runs["plain"].startswith(text_of(ended) + "<|im_end|>"), runs["plain"]
    assert runs["spec"] == runs["plain"]
    skipped = text_of(chat(server, max_tokens=48, ignore_eos=True, skip_special_tokens=True))
    assert "<|im_end|>" not in skipped and skipped.startswith(text_of(ended))
    # Every emitted token has its logprob, the EOS that no longer ends it too.
    lp = chat(server, max_tokens=48, ignore_eos=True, logprobs=True)
    assert len(lp["choices"][0]["logprobs"]["content"]) == 48


def test_min_tokens_holds_the_end_back(server):
    ended = chat(server, max_tokens=64, **PLAIN)
    n = ended["usage"]["completion_tokens"]
    runs = {}
    for name, spec in [("plain", PLAIN), ("spec", SPEC)]:
        r = chat(server, max_tokens=64, min_tokens=n + 6, **spec)
        assert r["usage"]["completion_tokens"] >= n + 6, r["usage"]
        runs[name] = text_of(r)
    assert runs["spec"] == runs["plain"]
    # The same greedy text up to where EOS came, then more instead of it.
    assert runs["plain"].startswith(text_of(ended)) and len(runs["plain"]) > len(text_of(ended))
    # Ollama takes it in options.
    r = httpx.post(server.url + "/api/chat", json={
        "model": MODEL, "messages": MSGS, "stream": False,
        "options": {**GREEDY, "num_predict": 64, "min_tokens": n + 6}}, timeout=180)
    assert r.status_code == 200 and r.json()["eval_count"] >= n + 6, r.text


def test_stop_token_ids_and_include_stop(server):
    # The plain answer's tokens, from Ollama's context.
    r = httpx.post(server.url + "/api/generate", json={
        "model": MODEL, "prompt": QUESTION, "stream": False,
        "options": {**GREEDY, "num_predict": 24, "drafter": "none"}}, timeout=180).json()
    out = r["context"][r["prompt_eval_count"]:]
    assert len(out) >= 6, r
    stop_id = out[4]
    first = out.index(stop_id)
    for spec in (PLAIN, SPEC):
        cut = httpx.post(server.url + "/api/generate", json={
            "model": MODEL, "prompt": QUESTION, "stream": False,
            "options": {**GREEDY, **spec, "num_predict": 24, "stop_token_ids": [stop_id]}},
            timeout=180).json()
        assert cut["done_reason"] == "stop" and cut["eval_count"] in (first, first + 1), cut
        assert r["response"].startswith(cut["response"]) and len(cut["response"]) < len(r["response"])
    # OpenAI chat (the same prompt): the stop token's text is kept with
    # include_stop_str_in_output.
    ta = text_of(chat(server, max_tokens=24, stop_token_ids=[stop_id]))
    tb = text_of(chat(server, max_tokens=24, stop_token_ids=[stop_id], include_stop_str_in_output=True))
    assert ta == cut["response"] and tb.startswith(ta) and len(tb) > len(ta), (ta, tb)
    assert r["response"].startswith(tb), (tb, r["response"])
    body = {"model": MODEL, "prompt": QUESTION, "max_tokens": 24, **GREEDY}
    # A stop string, kept or trimmed (SGLang's no_stop_trim is the same).
    word = r["response"].split()[2]
    trimmed = text_of(chat(server, max_tokens=24, stop=[word]))
    kept = text_of(chat(server, max_tokens=24, stop=[word], include_stop_str_in_output=True))
    assert kept == trimmed + word and text_of(chat(server, max_tokens=24, stop=[word], no_stop_trim=True)) == kept
    r = httpx.post(server.url + "/v1/completions", json={**body, "stop_token_ids": [10 ** 7]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop_token_ids[0]", r.text


def test_vllm_sampling_spellings(server):
    # top_k -1 is off: the same as no top_k.
    a = chat(server, max_tokens=16, temperature=0.9, seed=3, top_k=-1)
    b = chat(server, max_tokens=16, temperature=0.9, seed=3)
    assert text_of(a) == text_of(b)
    # repetition_penalty is a penalty over the whole context: it changes the
    # greedy text of a repetitive prompt, and speculation keeps it exact.
    body = {"model": MODEL, "prompt": REPETITIVE, "max_tokens": 24, **GREEDY}
    base = httpx.post(server.url + "/v1/completions", json=body, timeout=180).json()["choices"][0]["text"]
    pen = {}
    for name, spec in [("plain", PLAIN), ("spec", SPEC)]:
        pen[name] = httpx.post(server.url + "/v1/completions",
                               json={**body, **spec, "repetition_penalty": 1.5},
                               timeout=180).json()["choices"][0]["text"]
    assert pen["plain"] != base and pen["spec"] == pen["plain"]
    r = httpx.post(server.url + "/v1/completions",
                   json={**body, "repetition_penalty": 1.5, "repeat_penalty": 1.1}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "repetition_penalty", r.text


def test_include_usage_and_vllm_metrics(server):
    events = sse(server, "/v1/completions", {
        "model": MODEL, "prompt": REPETITIVE, "max_tokens": 32, "stream": True, **GREEDY, **SPEC,
        "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 32, last
    assert all(e["choices"] for e in events[:-2])
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    m = last["metrics"]["speculative_decoding"]
    assert set(m) == {"mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram",
                      "num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens",
                      "num_spec_tokens"}
    h = m["acceptance_histogram"]
    spec = last["speculation"]
    assert m["num_spec_steps"] == sum(h) > 0
    assert m["num_accepted_draft_tokens"] == sum(i * n for i, n in enumerate(h)) == spec["accepted"]
    assert m["num_draft_tokens"] == spec["drafted"] and len(h) == m["num_spec_tokens"] + 1
    assert m["mean_acceptance_length"] == pytest.approx(1 + spec["accepted"] / m["num_spec_steps"])
    assert m["draft_acceptance_rate"] == pytest.approx(spec["accepted"] / spec["drafted"])
    # Rounds without drafts are not spec steps.
    assert m["num_spec_steps"] <= spec["rounds"]
    whole = chat(server, max_tokens=8, **PLAIN)
    assert whole["metrics"]["speculative_decoding"]["num_spec_steps"] == 0


def test_vllm_bench_serve_ignore_eos_body(server):
    # The chat body `vllm bench serve --backend openai-chat --ignore-eos`
    # sends (vllm/benchmarks/lib/endpoint_request_func.py,
    # async_request_openai_chat_completions): content as parts,
    # max_completion_tokens, stream with include_usage, ignore_eos at the top.
    chat_body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
        "max_completion_tokens": 40, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0.0,
    }
    # And the completions one (async_request_openai_completions).
    completions_body = {
        "model": MODEL, "prompt": QUESTION, "repetition_penalty": 1.0, "max_tokens": 40,
        "logprobs": None, "stream": True, "stream_options": {"include_usage": True},
        "ignore_eos": True, "temperature": 0.0,
    }
    for path, body in [("/v1/chat/completions", chat_body), ("/v1/completions", completions_body)]:
        events = sse(server, path, body)
        assert events[-2]["usage"]["completion_tokens"] == 40, (path, events[-2])
        assert events[-2]["choices"] == []


def test_openai_client_extra_body(server):
    # What users of the openai client write to reach vLLM's extensions.
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = c.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=20, temperature=0,
                                  extra_body={"ignore_eos": True, "top_k": -1, "min_p": 0.0})
    assert r.usage.completion_tokens == 20 and r.choices[0].finish_reason == "length"
