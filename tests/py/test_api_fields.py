"""The request fields clients send (issue 18), with the real `openai` and
`ollama` clients against `specd serve` on the real default model.

- Nothing is silently ignored: a field that would change the output and that
  specd does not implement is a 400 naming it, as is a field in neither API;
  the fields that cannot change the output are accepted.
- Defaults: each API's documented sampling defaults and a fresh seed per
  request; `--greedy-default` keeps greedy decoding as the default.
- Penalties: `presence_penalty` / `frequency_penalty` change the text, and
  greedy speculation with them on stays token-identical to plain decoding.
- Logprobs on both APIs, streaming and not: equal with and without
  speculation; the top alternatives are at most 1 in probability.
"""
from __future__ import annotations

import httpx
import ollama
import openai
import pytest

from conftest import MODEL

QUESTION = "Write one sentence about the sea."
REPETITIVE = "red green blue yellow red green blue yellow red green blue yellow red green"
MSGS = [{"role": "user", "content": QUESTION}]


def oa_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


# --- no silent ignoring ----------------------------------------------------------

@pytest.mark.parametrize("extra,param", [
    ({"logit_bias": {"42": 10}}, "logit_bias"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"reasoning_effort": "high"}, "reasoning_effort"),
])
def test_openai_chat_refuses_what_it_does_not_implement(server, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        oa_client(server).chat.completions.create(model=MODEL, max_tokens=4, messages=MSGS, **extra)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param and f"`{param}`" in e.value.body["message"], e.value.body


def test_unknown_fields_are_refused_in_each_api_shape(server):
    with pytest.raises(openai.BadRequestError) as e:
        oa_client(server).chat.completions.create(model=MODEL, max_tokens=4, messages=MSGS,
                                                  extra_body={"temprature": 0})
    assert "unknown field `temprature`" in e.value.body["message"] and e.value.body["param"] == "temprature"
    with pytest.raises(openai.BadRequestError) as e:
        oa_client(server).completions.create(model=MODEL, prompt="Hi", max_tokens=2, suffix="end")
    assert e.value.body["param"] == "suffix"
    with pytest.raises(openai.BadRequestError) as e:
        oa_client(server).chat.completions.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x", "speaker": "me"}])
    assert e.value.body["param"] == "messages[0].speaker"
    # Ollama: {"error": "..."} naming the field, at the top level, in options and in a message
    for path, body, field in [
        ("/api/generate", {"model": MODEL, "prompt": "x", "bogus": 1}, "bogus"),
        ("/api/chat", {"model": MODEL, "messages": MSGS, "options": {"temprature": 0}}, "options.temprature"),
        ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x", "who": 1}]},
         "messages[0].who"),
    ]:
        r = post(server, path, body)
        assert r.status_code == 400 and f"unknown field `{field}`" in r.json()["error"], r.text


def test_ollama_refuses_what_it_does_not_implement(server):
    client = ollama.Client(host=server.url, timeout=120)
    for kwargs, needle in [
        ({"tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                      "parameters": {"type": "object", "properties": {}}}}]},
         "tools"),
        ({"think": True}, "think"),
        ({"options": {"mirostat": 2}}, "options.mirostat"),
        ({"options": {"num_ctx": 1 << 20}}, "options.num_ctx"),
    ]:
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(model=MODEL, messages=MSGS, **kwargs)
        assert e.value.status_code == 400 and needle in e.value.error, (kwargs, e.value.error)
    r = post(server, "/api/chat", {"model": MODEL, "messages": MSGS, "format": "yaml"})
    assert r.status_code == 400 and "format" in r.json()["error"], r.text
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model=MODEL, prompt="x", images=[b"\x89PNG\r\n\x1a\n"])
    assert e.value.status_code == 400 and "images" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model=MODEL, prompt="x", context=[1, 2, 3])
    assert e.value.status_code == 400 and "context" in e.value.error


def test_fields_that_cannot_change_the_output_are_accepted(server):
    greedy = oa_client(server).chat.completions.create(model=MODEL, max_tokens=8, temperature=0, messages=MSGS)
    r = oa_client(server).chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0, messages=MSGS, user="u1", metadata={"k": "v"},
        stream_options=None, parallel_tool_calls=True, logprobs=False, n=1, store=False,
        response_format={"type": "text"}, tool_choice="none", logit_bias={})
    assert r.choices[0].message.content == greedy.choices[0].message.content
    client = ollama.Client(host=server.url, timeout=120)
    base = client.chat(model=MODEL, messages=MSGS, options={"num_predict": 8, "temperature": 0})
    same = client.chat(model=MODEL, messages=MSGS, keep_alive="5m", think=False, format="",
                       options={"num_predict": 8, "temperature": 0, "num_ctx": 2048, "num_thread": 2,
                                "num_gpu": 0, "use_mmap": True, "typical_p": 1.0, "mirostat": 0})
    assert same.message.content == base.message.content


# --- defaults ------------------------------------------------------------------------

def test_defaults_sample_with_a_fresh_seed(server):
    """No temperature: each API samples (OpenAI at 1, Ollama at 0.8) with a new
    seed per request; a given seed repeats; temperature 0 stays greedy."""
    client = oa_client(server)
    texts = {client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12).choices[0].text
             for _ in range(4)}
    assert len(texts) > 1, texts
    # A seed repeats the text. (Plain decoding: under speculation the draws a
    # round makes depend on its draft lengths, which the schedule's carried
    # state changes from one request to the next.)
    seeded = {client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, seed=11,
                                        extra_body={"drafter": "none"}).choices[0].text for _ in range(2)}
    assert len(seeded) == 1
    oc = ollama.Client(host=server.url, timeout=120)
    outs = {oc.generate(model=MODEL, prompt="Once upon a time", raw=True, options={"num_predict": 12}).response
            for _ in range(4)}
    assert len(outs) > 1, outs
    r = post(server, "/api/generate", {"model": MODEL, "prompt": "Once upon a time", "raw": True,
                                       "stream": False, "options": {"num_predict": 12}})
    assert r.json()["speculation"]["acceptance"] == "rejection"  # sampled, not greedy


def test_greedy_default_flag(start_server):
    srv = start_server("--greedy-default")
    client = oa_client(srv)
    a = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12)
    b = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    assert a.model_extra["speculation"]["acceptance"] == "greedy"
    oc = ollama.Client(host=srv.url, timeout=120)
    g = oc.generate(model=MODEL, prompt="Once upon a time", raw=True, options={"num_predict": 12})
    assert g.response == b.choices[0].text  # greedy with no repeat penalty on both APIs


# --- penalties -----------------------------------------------------------------------

def test_penalties_change_the_text_and_speculation_stays_lossless(server):
    client = oa_client(server)

    def run(**kw):
        r = client.completions.create(model=MODEL, prompt=REPETITIVE, max_tokens=24, temperature=0, **kw)
        return r.choices[0].text, r.model_extra["speculation"]

    base, _ = run()
    for pen in ({"presence_penalty": 1.0}, {"frequency_penalty": 0.8}):
        spec_text, spec = run(**pen)
        plain_text, plain = run(**pen, extra_body={"drafter": "none"})
        assert spec_text == plain_text, pen
        assert spec["drafted"] > 0 and plain["drafted"] == 0
        assert spec_text != base, pen  # the penalty did something
    # Ollama's options take them too
    oc = ollama.Client(host=server.url, timeout=120)
    opts = {"num_predict": 24, "temperature": 0, "repeat_penalty": 1, "presence_penalty": 1.0}
    g = oc.generate(model=MODEL, prompt=REPETITIVE, raw=True, options=opts)
    assert g.response == run(presence_penalty=1.0)[0]


# --- logprobs ------------------------------------------------------------------------

def check_top(entries) -> None:
    """Each position's alternatives: best first, at most 1 in probability, and
    (greedy) the chosen token is the best one."""
    import math
    for e in entries:
        lps = [t["logprob"] for t in e["top_logprobs"]]
        assert lps == sorted(lps, reverse=True)
        assert sum(math.exp(x) for x in lps) <= 1 + 1e-5
        assert e["logprob"] <= 0
        assert e["top_logprobs"][0]["token"] == e["token"] and e["top_logprobs"][0]["logprob"] == e["logprob"]


def test_logprobs_are_equal_with_and_without_speculation(server):
    client = oa_client(server)

    def chat(drafter: str, stream: bool):
        kw = dict(model=MODEL, max_tokens=24, temperature=0, logprobs=True, top_logprobs=3,
                  messages=[{"role": "user", "content": "Repeat exactly: " + REPETITIVE}],
                  extra_body={"drafter": drafter})
        if not stream:
            r = client.chat.completions.create(**kw)
            return [c.model_dump() for c in r.choices[0].logprobs.content], r.model_extra["speculation"], \
                r.choices[0].message.content
        chunks = list(client.chat.completions.create(stream=True, **kw))
        entries = [c.model_dump() for ch in chunks if ch.choices and ch.choices[0].logprobs
                   for c in ch.choices[0].logprobs.content]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        return entries, chunks[-1].model_extra["speculation"], text

    plain, pstats, ptext = chat("none", False)
    spec, sstats, stext = chat("ngram", False)
    assert pstats["drafted"] == 0 and sstats["drafted"] > 0 and sstats["accepted"] > 0, sstats
    assert stext == ptext
    assert len(plain) == pstats["generated_tokens"] and "".join(e["token"] for e in plain) == ptext
    assert spec == plain  # bitwise: the verify rows are plain decoding's rows
    check_top(plain)
    streamed, st, stream_text = chat("ngram", True)
    assert st["drafted"] > 0 and stream_text == ptext and streamed == plain

    # completions: the legacy shape, same numbers
    r = client.completions.create(model=MODEL, prompt=REPETITIVE, max_tokens=16, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 16
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    assert all(len(t) == 2 and max(t.values()) == x for t, x in zip(lp.top_logprobs, lp.token_logprobs))
    p = client.completions.create(model=MODEL, prompt=REPETITIVE, max_tokens=16, temperature=0, logprobs=2,
                                  extra_body={"drafter": "none"})
    assert p.choices[0].logprobs.token_logprobs == lp.token_logprobs
    assert r.model_extra["speculation"]["drafted"] > 0

    # Ollama: the same entries, streaming and not
    oc = ollama.Client(host=server.url, timeout=120)
    msgs = [{"role": "user", "content": "Repeat exactly: " + REPETITIVE}]
    opts = {"num_predict": 24, "temperature": 0, "repeat_penalty": 1}
    o = oc.chat(model=MODEL, messages=msgs, options=opts, logprobs=True, top_logprobs=3)
    oentries = [x.model_dump() for x in o.logprobs]
    assert [(e["token"], e["logprob"]) for e in oentries] == [(e["token"], e["logprob"]) for e in plain]
    parts = list(oc.chat(model=MODEL, messages=msgs, options={**opts, "drafter": "none"}, logprobs=True,
                         top_logprobs=3, stream=True))
    sentries = [x.model_dump() for p in parts if p.logprobs for x in p.logprobs]
    assert [(e["token"], e["logprob"]) for e in sentries] == [(e["token"], e["logprob"]) for e in plain]


def test_logprob_requests_are_checked(server):
    client = oa_client(server)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=MODEL, max_tokens=2, messages=MSGS, top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=MODEL, max_tokens=2, messages=MSGS, logprobs=True, top_logprobs=50)


def test_echo_gives_the_prompts_logprobs(server):
    """lm-eval's loglikelihood request: echo, logprobs, max_tokens 0."""
    import math
    client = oa_client(server)
    r = client.completions.create(model=MODEL, prompt=REPETITIVE, max_tokens=0, echo=True, logprobs=2)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == REPETITIVE and "".join(lp.tokens) == REPETITIVE
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    assert all(sum(math.exp(v) for v in t.values()) <= 1 + 1e-5 for t in lp.top_logprobs[1:])
    # the repetition is learned: the second half is far likelier than the first
    n = len(lp.token_logprobs)
    assert sum(lp.token_logprobs[n // 2:]) > sum(lp.token_logprobs[1:n // 2 + 1])
    # with generation: prompt entries, then the generated tokens'
    g = client.completions.create(model=MODEL, prompt=REPETITIVE, max_tokens=4, temperature=0, echo=True,
                                  logprobs=0)
    assert len(g.choices[0].logprobs.tokens) == n + 4
    assert g.choices[0].logprobs.token_logprobs[:n] == lp.token_logprobs


def test_processed_logprobs_mode(start_server):
    """--logprobs-mode processed: the final distribution, one-hot when greedy."""
    srv = start_server("--logprobs-mode", "processed")
    r = oa_client(srv).chat.completions.create(model=MODEL, max_tokens=6, temperature=0, logprobs=True,
                                               top_logprobs=2, messages=MSGS)
    for e in r.choices[0].logprobs.content:
        assert e.logprob == 0.0 and e.top_logprobs[1].logprob == -9999.0
