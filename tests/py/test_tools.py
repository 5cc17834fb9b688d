"""Tools over HTTP with the real `openai` and `ollama` clients, on a tiny
random Qwen2 checkpoint whose chat template is Qwen2.5's (it renders `tools`
and writes calls as <tool_call>{json}</tool_call>).

A forced choice (`tool_choice` named or `required`) constrains the output to
one call in that format with the function's parameter schema, so even random
weights answer with a call that parses and validates. The round trip sends
the call and its result back; the server's prompt token count must equal
transformers' rendering of the same conversation with the same template, so
the tools and the result were rendered as transformers renders them.
"""
from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import openai
import pytest

import hf_checkpoints

PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "where", "enum": ["Paris", "Tokyo", "Lima"]},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.", "parameters": PARAMS}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]}},
                   "required": ["city"]}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
RESULT = '{"temperature": 21, "sky": "clear"}'


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tools") / "qwen2-tools"
    return hf_checkpoints.write_checkpoint(d, "qwen2", chat_template=hf_checkpoints.QWEN25_TOOLS)


@pytest.fixture(scope="module")
def srv(start_server, model_dir):
    return start_server("--model", str(model_dir))


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def expected_prompt_tokens(tok, messages, tools) -> tuple[int, str]:
    """transformers' rendering of the conversation and its token count."""
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return len(tok(text, add_special_tokens=False).input_ids), text


def oa(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def forced_call(srv, choice, drafter: str, stream: bool):
    """One forced call over the OpenAI API: (name, arguments dict, id,
    finish_reason, usage, speculation stats)."""
    kwargs = dict(model="default", messages=QUESTION, tools=TOOLS, tool_choice=choice, temperature=0,
                  max_tokens=200, extra_body={"drafter": drafter})
    if not stream:
        r = oa(srv).chat.completions.create(**kwargs)
        c = r.choices[0]
        assert c.message.content is None, c.message
        (call,) = c.message.tool_calls
        return (call.function.name, json.loads(call.function.arguments), call.id, c.finish_reason,
                r.usage.prompt_tokens, r.model_extra["speculation"])
    calls: dict[int, dict] = {}
    finish, usage, spec, content = None, None, None, ""
    for chunk in oa(srv).chat.completions.create(stream=True, **kwargs):
        if chunk.choices:
            d = chunk.choices[0].delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
        spec = (chunk.model_extra or {}).get("speculation") or spec
    assert content == "", content
    (call,) = calls.values()
    return call["name"], json.loads(call["arguments"]), call["id"], finish, usage.prompt_tokens, spec


@pytest.mark.parametrize("drafter,stream", [("none", False), ("none", True), ("ngram", False), ("ngram", True)])
def test_openai_forced_call_round_trip(srv, hf_tokenizer, drafter, stream):
    named = {"type": "function", "function": {"name": "get_weather"}}
    name, args, call_id, finish, prompt_tokens, spec = forced_call(srv, named, drafter, stream)
    assert name == "get_weather" and finish == "tool_calls", (name, finish)
    assert call_id.startswith("call_") and len(call_id) > 10, call_id
    jsonschema.validate(args, PARAMS)
    # The tools were rendered exactly as transformers renders them.
    n, text = expected_prompt_tokens(hf_tokenizer, QUESTION, TOOLS)
    assert '"name": "get_weather"' in text and prompt_tokens == n, (prompt_tokens, n)
    if drafter == "ngram":
        # Speculation ran (so this is not a plain run), and the call is plain's.
        assert spec["drafted"] > 0, spec
        assert (name, args) == forced_call(srv, named, "none", stream)[:2]
    # Round trip: the call and its result go back, and the model answers.
    messages = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": call_id, "content": RESULT},
    ]
    r = oa(srv).chat.completions.create(model="default", messages=messages, tools=TOOLS, tool_choice="none",
                                        temperature=0, max_tokens=6, extra_body={"drafter": drafter})
    assert r.choices[0].finish_reason in ("stop", "length") and not r.choices[0].message.tool_calls
    assert r.usage.completion_tokens > 0
    hf_messages = messages[:1] + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]},
        messages[2],
    ]
    n, text = expected_prompt_tokens(hf_tokenizer, hf_messages, TOOLS)
    assert f"<tool_response>\n{RESULT}\n</tool_response>" in text and "<tool_call>" in text, text
    assert r.usage.prompt_tokens == n, (r.usage.prompt_tokens, n)


def test_required_calls_one_of_the_tools(srv):
    name, args, _, finish, _, _ = forced_call(srv, "required", "none", False)
    assert name in SCHEMAS and finish == "tool_calls", name
    jsonschema.validate(args, SCHEMAS[name])
    # auto: the model decides; random weights write text, which stays text.
    r = oa(srv).chat.completions.create(model="default", messages=QUESTION, tools=TOOLS, temperature=0,
                                        max_tokens=8)
    c = r.choices[0]
    assert c.finish_reason == "length" and not c.message.tool_calls and c.message.content, c


def ollama_tools():
    """The tools as the ollama client sends them (it reorders the schema's keys)."""
    return [ollama.Tool.model_validate(t).model_dump(exclude_none=True) for t in TOOLS]


def ollama_call(client, drafter: str, stream: bool):
    """One forced call over the Ollama API: (name, arguments, prompt_eval_count)."""
    opts = {"temperature": 0, "num_predict": 200, "tool_choice": "required", "drafter": drafter}
    if stream:
        calls, content = [], ""
        for part in client.chat(model="default", messages=QUESTION, tools=TOOLS, options=opts, stream=True):
            calls += part.message.tool_calls or []
            content += part.message.content or ""
            if part.done:
                prompt_eval = part.prompt_eval_count
    else:
        r = client.chat(model="default", messages=QUESTION, tools=TOOLS, options=opts)
        calls, content, prompt_eval = r.message.tool_calls, r.message.content, r.prompt_eval_count
    assert content == "", content
    (call,) = calls
    return call.function.name, dict(call.function.arguments), prompt_eval


@pytest.mark.parametrize("stream", [False, True])
def test_ollama_forced_call_round_trip(srv, hf_tokenizer, stream):
    client = ollama.Client(host=srv.url, timeout=120)
    name, args, prompt_eval = ollama_call(client, "ngram", stream)
    # (The ollama client drops the `speculation` stats; the OpenAI test
    # checks drafted > 0 for the same requests.)
    assert (name, args) == ollama_call(client, "none", False)[:2]
    assert name in SCHEMAS, name
    jsonschema.validate(args, SCHEMAS[name])
    n, _ = expected_prompt_tokens(hf_tokenizer, QUESTION, ollama_tools())
    assert prompt_eval == n, (prompt_eval, n)
    messages = QUESTION + [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": name, "arguments": args}}]},
        {"role": "tool", "content": RESULT, "tool_name": name},
    ]
    r = client.chat(model="default", messages=messages, tools=TOOLS,
                    options={"temperature": 0, "num_predict": 6, "tool_choice": "none"})
    assert r.eval_count > 0 and not r.message.tool_calls
    hf_messages = messages[:1] + [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                                                             "function": {"name": name, "arguments": args}}]},
        {"role": "tool", "content": RESULT, "name": name},
    ]
    n, text = expected_prompt_tokens(hf_tokenizer, hf_messages, ollama_tools())
    assert RESULT in text and r.prompt_eval_count == n, (r.prompt_eval_count, n)


def test_bad_tool_requests_are_400s(srv, server):
    named = lambda n: {"type": "function", "function": {"name": n}}  # noqa: E731
    for extra, param in [
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": named("nope")}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            oa(srv).chat.completions.create(model="default", messages=QUESTION, max_tokens=4, **extra)
        assert e.value.body["param"] == param and f"`{param}`" in e.value.body["message"], (extra, e.value.body)
    bad_args = QUESTION + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{oops"}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        oa(srv).chat.completions.create(model="default", messages=bad_args, max_tokens=4)
    assert e.value.body["param"] == "messages[1].tool_calls[0].function.arguments", e.value.body
    r = httpx.post(srv.url + "/api/chat", timeout=60, json={
        "model": "default", "messages": QUESTION, "tools": TOOLS, "options": {"tool_choice": "maybe"}})
    assert r.status_code == 400 and "`options.tool_choice`" in r.json()["error"], r.text
    # The default model's template renders no tools: a 400 that says so, on both APIs.
    with pytest.raises(openai.BadRequestError) as e:
        oa(server).chat.completions.create(model="default", messages=QUESTION, max_tokens=4, tools=TOOLS,
                                           tool_choice="required")
    assert e.value.body["param"] == "tools" and "does not render tools" in e.value.body["message"], e.value.body
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=server.url, timeout=60).chat(model="default", messages=QUESTION, tools=TOOLS)
    assert e.value.status_code == 400 and "does not render tools" in e.value.error, e.value.error
    shown = httpx.post(server.url + "/api/show", json={"model": "default"}, timeout=60).json()
    assert "tools" not in shown["capabilities"]
    shown = httpx.post(srv.url + "/api/show", json={"model": "default"}, timeout=60).json()
    assert "tools" in shown["capabilities"]
