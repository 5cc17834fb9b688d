"""OpenAI's Responses API (`/v1/responses`, issue 66) with the real `openai`
client's `responses.create` and `responses.stream`, on a tiny random Qwen2
checkpoint whose chat template is Qwen2.5's (it renders tools; a forced
call and a json_schema format are grammar-constrained, so random weights
answer with valid ones).

- A function tool round trip: the forced call, then its output sent back
  with `previous_response_id`; the server's input token count equals
  transformers' rendering of the same conversation.
- `text.format` json_schema: the output validates against the schema.
- `responses.stream()`: the Responses events, numbered, and a
  `get_final_response()` equal to the non-streamed response.
- The history per API key: `previous_response_id` continues, an evicted id
  and another key's id are 404s (`--responses-history 2`).
- Built-in tools and other unimplemented fields are 400s naming them.
"""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

import hf_checkpoints

PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                   "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"],
}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": PARAMS}
# The same tool in chat's shape: what the template renders.
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                                 "parameters": PARAMS}}
QUESTION = "What is the weather in Paris?"
RESULT = '{"temperature": 21, "sky": "clear"}'
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                                           "score": {"type": "integer", "enum": [1, 2, 3]}},
          "required": ["answer", "score"], "additionalProperties": False}
KEYS = ("key-a", "key-b")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("responses") / "qwen2-tools"
    return hf_checkpoints.write_checkpoint(d, "qwen2", chat_template=hf_checkpoints.QWEN25_TOOLS)


@pytest.fixture(scope="module")
def srv(start_server, model_dir):
    return start_server("--model", str(model_dir), "--api-key", KEYS[0], "--api-key", KEYS[1],
                        "--responses-history", "2")


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def client(srv, key: str = KEYS[0]) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0)


def prompt_tokens(tok, messages, tools) -> int:
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return len(tok(text, add_special_tokens=False).input_ids)


def forced(**extra) -> dict:
    return dict(model="default", input=QUESTION, tools=[WEATHER], temperature=0, max_output_tokens=200,
                tool_choice={"type": "function", "name": "get_weather"}, **extra)


def test_function_tool_round_trip(srv, hf_tokenizer):
    c = client(srv)
    r = c.responses.create(**forced(extra_body={"drafter": "ngram"}))
    assert r.status == "completed" and r.object == "response"
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    args = json.loads(call.arguments)
    jsonschema.validate(args, PARAMS)
    assert r.usage.input_tokens == prompt_tokens(hf_tokenizer, [{"role": "user", "content": QUESTION}],
                                                 [CHAT_WEATHER])
    assert r.model_extra["speculation"]["drafter"] == "ngram"
    # The call's output goes back with previous_response_id; the model answers.
    r2 = c.responses.create(model="default", previous_response_id=r.id, tools=[WEATHER], temperature=0,
                            max_output_tokens=6, input=[{"type": "function_call_output", "call_id": call.call_id,
                                                         "output": RESULT}])
    assert r2.previous_response_id == r.id and r2.usage.output_tokens > 0
    assert not [o for o in r2.output if o.type == "function_call"]
    conversation = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": args}}]},
        {"role": "tool", "tool_call_id": call.call_id, "name": call.name, "content": RESULT},
    ]
    assert r2.usage.input_tokens == prompt_tokens(hf_tokenizer, conversation, [CHAT_WEATHER])
    # The same turn sent as items, without the history: the same prompt.
    r3 = c.responses.create(model="default", tools=[WEATHER], temperature=0, max_output_tokens=6, store=False,
                            input=[{"role": "user", "content": QUESTION},
                                   {"type": "function_call", "call_id": call.call_id, "name": call.name,
                                    "arguments": call.arguments},
                                   {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}])
    assert r3.usage.input_tokens == r2.usage.input_tokens and r3.output_text == r2.output_text


def test_json_schema_format(srv):
    r = client(srv).responses.create(
        model="default", input="Is the sky blue?", instructions="Answer in JSON.", temperature=0,
        max_output_tokens=200, text={"format": {"type": "json_schema", "name": "verdict", "schema": SCHEMA,
                                                "strict": True}})
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    # json_object: an object (random weights fill it with a long string:
    # its start is what the grammar fixes)
    r = client(srv).responses.create(model="default", input="JSON please", temperature=0, max_output_tokens=8,
                                     text={"format": {"type": "json_object"}})
    assert r.output_text.startswith("{") and r.status == "incomplete", r.output_text


def comparable(r) -> dict:
    """What a response says, without what differs between two runs (ids,
    times, prompt tokens found in the prefix cache) or what the client's
    stream helper adds (`parsed`)."""
    out = []
    for o in r.output:
        if o.type == "message":
            out.append(("message", o.role, o.status, [(c.type, c.text) for c in o.content]))
        else:
            out.append((o.type, o.name, o.arguments, o.status))
    u = r.usage
    return {"output": out, "usage": (u.input_tokens, u.output_tokens, u.total_tokens), "status": r.status,
            "text": r.output_text, "incomplete": r.incomplete_details}


@pytest.mark.parametrize("kind", ["text", "call"])
def test_stream_final_response_equals_the_plain_one(srv, kind):
    c = client(srv)
    kwargs = forced() if kind == "call" else dict(model="default", input="Tell me a story.", temperature=0,
                                                  max_output_tokens=12)
    plain = c.responses.create(**kwargs)
    with c.responses.stream(**kwargs) as s:
        events = list(s)
        final = s.get_final_response()
    assert comparable(final) == comparable(plain)
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    expected = {"response.output_item.added", "response.output_item.done"}
    if kind == "text":
        expected |= {"response.content_part.added", "response.output_text.delta", "response.output_text.done",
                     "response.content_part.done"}
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas == plain.output_text and final.status == "incomplete"
        assert final.incomplete_details.reason == "max_output_tokens"
    else:
        expected |= {"response.function_call_arguments.delta", "response.function_call_arguments.done"}
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert json.loads(done[0].arguments) == json.loads(plain.output[0].arguments)
    assert expected <= set(types), types
    # The streamed items are the final response's.
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert added == [o.id for o in final.output]


def test_history_is_per_key_and_bounded(srv):
    a, b = client(srv, KEYS[0]), client(srv, KEYS[1])
    r1 = a.responses.create(model="default", input="Hello there.", temperature=0, max_output_tokens=4)
    r2 = a.responses.create(model="default", previous_response_id=r1.id, input="And again.", temperature=0,
                            max_output_tokens=4)
    # the conversation went on: the first turn, its answer and the new one
    assert r2.usage.input_tokens > r1.usage.input_tokens + r1.usage.output_tokens
    assert a.responses.retrieve(r1.id).id == r1.id
    with pytest.raises(openai.NotFoundError) as e:
        b.responses.create(model="default", previous_response_id=r1.id, input="x", max_output_tokens=2)
    assert e.value.body["param"] == "previous_response_id"
    # not stored: not found later
    r3 = a.responses.create(model="default", input="x", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        a.responses.create(model="default", previous_response_id=r3.id, input="x", max_output_tokens=2)
    # two more stored responses evict r1 (at most 2 per key) but not r2's successor
    r4 = a.responses.create(model="default", input="x", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        a.responses.create(model="default", previous_response_id=r1.id, input="x", max_output_tokens=2)
    a.responses.create(model="default", previous_response_id=r4.id, input="y", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        a.responses.create(model="default", previous_response_id="resp_unknown", input="x", max_output_tokens=2)


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"background": True}, "background"),
    ({"bogus": 1}, "bogus"),
])
def test_what_is_not_implemented_is_named(srv, extra, param):
    body = dict(model="default", input="x", max_output_tokens=2)
    body.update(extra)
    with pytest.raises(openai.BadRequestError) as e:
        client(srv).responses.create(**{k: v for k, v in body.items() if k != "bogus"},
                                     extra_body={"bogus": 1} if "bogus" in body else None)
    assert e.value.body["param"] == param, e.value.body
