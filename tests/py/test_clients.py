"""The clients after routers and benchmarks (issue 66), against `specd serve`
on the real default model:

- lm-evaluation-harness' `local-completions`: the exact bodies it sends
  (loglikelihood: a batch of token-id prompts with `max_tokens: 1,
  logprobs: 1, echo: true, temperature: 0, seed: 1234`; generation: a batch
  of token-id prompts with `stop` and `seed`), read back as lm-eval reads
  them (`token_logprobs[ctxlen:-1]`, greedy when each logprob is its
  position's top). A batch gives bitwise what each prompt gives alone, its
  prompts run in the same batched steps, and the greedy flag agrees with
  greedy decoding.
- Token ids both ways: `return_token_ids`, `return_tokens_as_token_ids`, an
  id outside the vocabulary refused by name.
- `/tokenize` and `/detokenize` in vLLM's and llama-server's shapes, giving
  the ids the completions and chat routes run on.
"""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from conftest import MODEL

CONTEXTS = [
    "The capital of France is",
    "Question: What is two plus two?\nAnswer:",
    "red green blue red green blue red green",
    "Once upon a time, there was a",
]
LM_EVAL_SEED = 1234


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=300)


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def tokenize(server, text: str) -> list[int]:
    return ok(post(server, "/tokenize", {"model": MODEL, "prompt": text}))["tokens"]


def loglikelihood_body(prompts: list[list[int]]) -> dict:
    """lm-eval's `LocalCompletionsAPI._create_payload(generate=False)`."""
    return {"model": MODEL, "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1,
            "seed": LM_EVAL_SEED, "echo": True}


def generation_body(prompts: list[list[int]], max_tokens: int = 12) -> dict:
    """lm-eval's `_create_payload(generate=True)` for `until: ["\\n\\n"]`."""
    return {"prompt": prompts, "model": MODEL, "max_tokens": max_tokens, "temperature": 0,
            "stop": ["\n\n", "<|im_end|>"], "seed": LM_EVAL_SEED}


def parse_logprobs(out: dict, ctxlens: list[int]) -> list[tuple[float, bool]]:
    """lm-eval's `LocalCompletionsAPI.parse_logprobs`, as it is written."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=lambda c: c["index"]), ctxlens):
        assert ctxlen > 0
        logprobs = sum(choice["logprobs"]["token_logprobs"][ctxlen:-1])
        tokens_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        is_greedy = True
        for tok, top in zip(tokens_logprobs, top_logprobs):
            if tok != max(top.values()):
                is_greedy = False
                break
        res.append((logprobs, is_greedy))
    return res


@pytest.fixture(scope="module")
def pairs(server):
    """(context ids, continuation ids) per context: the greedy continuation
    of four tokens for the first two, another four tokens for the rest."""
    out = []
    for i, text in enumerate(CONTEXTS):
        ctx = tokenize(server, text)
        if i < 2:
            g = ok(post(server, "/v1/completions", {"model": MODEL, "prompt": ctx, "max_tokens": 4,
                                                    "temperature": 0, "return_token_ids": True,
                                                    "ignore_eos": True}))
            cont = g["choices"][0]["token_ids"]
        else:
            cont = tokenize(server, " purple elephants dance quietly")[:4]
        assert len(cont) == 4
        out.append((ctx, cont))
    return out


def test_lm_eval_loglikelihood_batch_is_each_prompt_alone(server, pairs):
    prompts = [c + k for c, k in pairs]
    batch = ok(post(server, "/v1/completions", loglikelihood_body(prompts)))
    assert [c["index"] for c in batch["choices"]] == list(range(len(prompts)))
    ctxlens = [len(c) for c, _ in pairs]
    scores = parse_logprobs(batch, ctxlens)
    for i, (p, choice) in enumerate(zip(prompts, batch["choices"])):
        lp = choice["logprobs"]
        # the prompt's tokens and the one generated token, in vLLM's shape
        assert len(lp["tokens"]) == len(p) + 1 and len(lp["text_offset"]) == len(p) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(len(t) == 1 for t in lp["top_logprobs"][1:])
        alone = ok(post(server, "/v1/completions", loglikelihood_body([p])))
        assert alone["choices"][0]["logprobs"] == lp, f"prompt {i} differs in the batch"
        assert alone["choices"][0]["text"] == choice["text"]
        # the continuation's log-likelihood is the sum of its echoed logprobs
        assert scores[i][0] == pytest.approx(sum(lp["token_logprobs"][ctxlens[i]:len(p)]), abs=0)
        assert scores[i][0] < 0
    # the greedy flag agrees with greedy decoding: the first two
    # continuations are the greedy ones, the others are not
    assert [g for _, g in scores] == [True, True, False, False], scores
    # the four prompts ran in the same batched steps
    spec = batch["speculation"]
    assert isinstance(spec, list) and len(spec) == 4
    assert max(s["batch_max_sequences"] for s in spec) == 4, spec
    assert batch["usage"]["prompt_tokens"] == sum(len(p) for p in prompts)


def test_max_tokens_0_with_echo_scores_the_prompt_only(server, pairs):
    p = pairs[0][0] + pairs[0][1]
    r = ok(post(server, "/v1/completions", {"model": MODEL, "prompt": [p], "max_tokens": 0, "echo": True,
                                            "logprobs": 1, "temperature": 0}))
    one = ok(post(server, "/v1/completions", loglikelihood_body([p])))
    lp, lp1 = r["choices"][0]["logprobs"], one["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(p) and r["usage"]["completion_tokens"] == 0
    assert lp["token_logprobs"] == lp1["token_logprobs"][:-1]


def test_an_ending_eos_keeps_its_entry_so_lm_eval_scores_the_whole_continuation(server):
    """A continuation after which the model ends its turn (the next token is
    `<|im_end|>`): the EOS that ends the request still has its logprob entry,
    so lm-eval's `[ctxlen:-1]` drops it and not the continuation's last
    token (found running lm-eval by hand: such continuations scored 0 and
    "greedy")."""
    ctx = tokenize(server, "Question: Which season comes after winter?\nAnswer:")
    cont = tokenize(server, " summer")
    p = ctx + cont
    r = ok(post(server, "/v1/completions", loglikelihood_body([p])))
    choice = r["choices"][0]
    top = choice["logprobs"]["top_logprobs"][-1]
    assert choice["finish_reason"] == "stop" and list(top) == ["<|im_end|>"], \
        "the model must end its turn here for this test to mean anything"
    assert len(choice["logprobs"]["tokens"]) == len(p) + 1
    score = parse_logprobs(r, [len(ctx)])[0][0]
    scored = ok(post(server, "/v1/completions", {"model": MODEL, "prompt": [p], "max_tokens": 0, "echo": True,
                                                 "logprobs": 1, "temperature": 0}))
    want = sum(scored["choices"][0]["logprobs"]["token_logprobs"][len(ctx):])
    assert score == pytest.approx(want, abs=0) and score < 0


def test_lm_eval_generation_batch_is_each_prompt_alone(server, pairs):
    prompts = [c for c, _ in pairs]
    batch = ok(post(server, "/v1/completions", generation_body(prompts)))
    texts = [c["text"] for c in sorted(batch["choices"], key=lambda c: c["index"])]
    for p, text in zip(prompts, texts):
        alone = ok(post(server, "/v1/completions", generation_body([p])))
        assert alone["choices"][0]["text"] == text
    assert max(s["batch_max_sequences"] for s in batch["speculation"]) == 4
    # sampled with a seed: each prompt as with that seed alone (vLLM's seed)
    body = dict(generation_body(prompts), temperature=0.9, seed=7, drafter="none")
    sampled = ok(post(server, "/v1/completions", body))
    for i, p in enumerate(prompts):
        alone = ok(post(server, "/v1/completions", dict(body, prompt=p)))
        assert alone["choices"][0]["text"] == sampled["choices"][i]["text"]
    # strings and a list of strings take the same path
    strs = ok(post(server, "/v1/completions", dict(generation_body(prompts), prompt=CONTEXTS)))
    assert [c["text"] for c in strs["choices"]] == texts


def test_a_batch_streams_each_choice_by_index(server, pairs):
    prompts = [c for c, _ in pairs[:3]]
    whole = ok(post(server, "/v1/completions", generation_body(prompts, 8)))
    texts = {i: "" for i in range(3)}
    last = None
    with httpx.stream("POST", server.url + "/v1/completions", timeout=300,
                      json=dict(generation_body(prompts, 8), stream=True)) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for c in chunk["choices"]:
                texts[c["index"]] += c["text"]
            last = chunk
    assert [texts[i] for i in range(3)] == [c["text"] for c in whole["choices"]]
    assert last["choices"] == [] and len(last["speculation"]) == 3
    assert last["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_token_ids_in_and_out(server, pairs):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    ctx = pairs[0][0]
    r = client.completions.create(model=MODEL, prompt=ctx, max_tokens=5, temperature=0, logprobs=2,
                                  extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True})
    c = r.choices[0].model_dump()
    assert c["prompt_token_ids"] == ctx
    ids = c["token_ids"]
    assert len(ids) == 5
    assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in ids]
    assert all(k.startswith("token_id:") for t in c["logprobs"]["top_logprobs"] for k in t)
    assert ok(post(server, "/detokenize", {"model": MODEL, "tokens": ids}))["prompt"] == c["text"]
    # chat: the prompt's ids at the top, the output's on the choice
    chat = ok(post(server, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
        "return_token_ids": True}))
    assert len(chat["prompt_token_ids"]) == chat["usage"]["prompt_tokens"]
    assert len(chat["choices"][0]["token_ids"]) == chat["usage"]["completion_tokens"]
    # an id outside the vocabulary is named
    vocab = ok(post(server, "/tokenize", {"model": MODEL, "prompt": "x"}))
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=[ctx, [1, 2, 10**7]], max_tokens=1)
    assert e.value.body["param"] == "prompt" and "prompt[1][2]: token id 10000000" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=[[1, 2], "x"], max_tokens=1)
    assert "prompt[1]" in e.value.body["message"]
    assert vocab["max_model_len"] > 0


def test_tokenize_in_both_shapes(server):
    text = "Hello, world! Ünïcödé"
    v = ok(post(server, "/tokenize", {"model": MODEL, "prompt": text}))
    assert v["count"] == len(v["tokens"]) and v["max_model_len"] >= 2048 and v["token_strs"] is None
    # the ids a completions request with this prompt runs on
    g = ok(post(server, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1, "temperature": 0,
                                            "return_token_ids": True}))
    assert g["choices"][0]["prompt_token_ids"] == v["tokens"]
    assert ok(post(server, "/detokenize", {"model": MODEL, "tokens": v["tokens"]})) == {"prompt": text}
    # chat messages through the template: what chat completions counts
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    m = ok(post(server, "/tokenize", {"model": MODEL, "messages": msgs}))
    chat = ok(post(server, "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 1}))
    assert m["count"] == chat["usage"]["prompt_tokens"]
    no_gen = ok(post(server, "/tokenize", {"model": MODEL, "messages": msgs, "add_generation_prompt": False}))
    assert no_gen["count"] < m["count"] and m["tokens"][:no_gen["count"]] == no_gen["tokens"]
    # llama-server's: `content`, `with_pieces`, `{"content"}` back
    ll = ok(post(server, "/tokenize", {"content": text}))
    assert set(ll) == {"tokens"} and ll["tokens"] == tokenize(server, text)[-len(ll["tokens"]):]
    pieces = ok(post(server, "/tokenize", {"content": text, "with_pieces": True}))["tokens"]
    assert [p["id"] for p in pieces] == ll["tokens"]
    as_bytes = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                        for p in pieces)
    assert as_bytes.decode() == text
    back = ok(post(server, "/detokenize", {"tokens": ll["tokens"]}))
    assert back["content"] == text
    # bad input is named
    r = post(server, "/tokenize", {"content": "x", "prompt": "y"})
    assert r.status_code == 400 and "not prompt and content" in r.text, r.text
    r = post(server, "/detokenize", {"model": MODEL, "tokens": [1, -3]})
    assert r.status_code == 400 and "tokens[1]" in r.text, r.text
    r = post(server, "/tokenize", {"content": "x", "bogus": 1})
    assert r.status_code == 400 and "bogus" in r.text
