"""Structured output (issue 18): OpenAI `response_format` and Ollama `format`
by constrained decoding (llguidance), with the real clients against
`specd serve` on the real default model.

- 20 JSON schemas (nested objects, enums, arrays, bounded numbers and
  strings): every answer parses and validates, with and without speculation;
- greedy constrained output is token-identical with and without speculation,
  and the speculative runs drafted and accepted tokens;
- `json_object` / `"json"` give a JSON object; sampled constrained output
  validates too.
"""
from __future__ import annotations

import json

import jsonschema
import ollama
import openai
import pytest

from conftest import MODEL


def obj(props: dict, **kw) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False, **kw}


STR = {"type": "string", "maxLength": 12}
INT = {"type": "integer", "minimum": 0, "maximum": 999}
BOOL = {"type": "boolean"}

SCHEMAS = [
    obj({"name": STR, "age": INT}),
    obj({"city": STR, "country": STR}),
    obj({"color": {"enum": ["red", "green", "blue"]}}),
    obj({"ok": BOOL, "count": INT}),
    obj({"tags": {"type": "array", "items": STR, "minItems": 1, "maxItems": 3}}),
    obj({"point": obj({"x": INT, "y": INT})}),
    obj({"user": obj({"name": STR, "admin": BOOL}), "id": INT}),
    obj({"size": {"enum": ["small", "medium", "large"]}, "price": {"type": "number", "minimum": 0, "maximum": 100}}),
    obj({"scores": {"type": "array", "items": INT, "minItems": 2, "maxItems": 4}}),
    obj({"title": STR, "done": BOOL}),
    obj({"a": obj({"b": obj({"c": INT})})}),
    obj({"items": {"type": "array", "items": obj({"sku": STR, "qty": INT}), "minItems": 1, "maxItems": 2}}),
    obj({"day": {"enum": ["mon", "tue", "wed", "thu", "fri"]}, "hour": {"type": "integer", "minimum": 0, "maximum": 23}}),
    obj({"first": STR, "last": STR, "email": {"type": "string", "maxLength": 20}}),
    obj({"lat": {"type": "number", "minimum": -90, "maximum": 90}, "lon": {"type": "number", "minimum": -180, "maximum": 180}}),
    obj({"status": {"enum": ["open", "closed"]}, "labels": {"type": "array", "items": {"enum": ["bug", "ui", "docs"]},
                                                             "maxItems": 3}}),
    obj({"matrix": {"type": "array", "items": {"type": "array", "items": INT, "minItems": 2, "maxItems": 2},
                    "minItems": 2, "maxItems": 2}}),
    obj({"answer": {"type": "string", "enum": ["yes", "no"]}, "confidence": INT}),
    obj({"book": obj({"title": STR, "year": {"type": "integer", "minimum": 1000, "maximum": 2100}}), "read": BOOL}),
    obj({"name": STR, "pets": {"type": "array", "items": obj({"kind": {"enum": ["cat", "dog"]}, "age": INT}),
                               "maxItems": 2}}),
]
assert len(SCHEMAS) == 20


def oa_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def ask(client, schema: dict, drafter: str, **kw):
    prompt = f"Answer with a JSON object that follows this schema: {json.dumps(schema)}"
    r = client.chat.completions.create(
        model=MODEL, max_tokens=160, messages=[{"role": "user", "content": prompt}],
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}},
        extra_body={"drafter": drafter}, **kw)
    return r.choices[0].message.content, r.model_extra["speculation"], r.choices[0].finish_reason


def test_twenty_schemas_validate_with_and_without_speculation(server):
    client = oa_client(server)
    drafted = accepted = 0
    for i, schema in enumerate(SCHEMAS):
        plain, pstats, pfin = ask(client, schema, "none", temperature=0)
        spec, sstats, sfin = ask(client, schema, "ngram", temperature=0)
        for text, fin in ((plain, pfin), (spec, sfin)):
            assert fin == "stop", (i, text)  # the grammar ended it, not the budget
            jsonschema.validate(json.loads(text), schema)
        assert spec == plain, (i, plain, spec)  # greedy: token-identical
        assert pstats["drafted"] == 0
        drafted += sstats["drafted"]
        accepted += sstats["accepted"]
    # the speculative runs did speculate: the test cannot pass with it off
    assert drafted > 0 and accepted > 0, (drafted, accepted)


def test_sampled_constrained_output_validates(server):
    client = oa_client(server)
    for schema in SCHEMAS[:6]:
        text, stats, _ = ask(client, schema, "ngram", temperature=1.0, seed=3)
        jsonschema.validate(json.loads(text), schema)


def test_json_object_and_ollama_format(server):
    client = oa_client(server)
    r = client.chat.completions.create(
        model=MODEL, max_tokens=120, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Describe Paris as JSON with keys name and country."}])
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    oc = ollama.Client(host=server.url, timeout=120)
    msgs = [{"role": "user", "content": "Describe Paris as JSON."}]
    g = oc.chat(model=MODEL, messages=msgs, format="json", options={"num_predict": 120, "temperature": 0})
    assert isinstance(json.loads(g.message.content), dict)
    schema = SCHEMAS[6]
    parts = list(oc.chat(model=MODEL, messages=msgs, format=schema, stream=True,
                         options={"num_predict": 160, "temperature": 0}))
    jsonschema.validate(json.loads("".join(p.message.content for p in parts)), schema)
    g = oc.generate(model=MODEL, prompt="A point as JSON:", format=SCHEMAS[5],
                    options={"num_predict": 160, "temperature": 0})
    jsonschema.validate(json.loads(g.response), SCHEMAS[5])


@pytest.mark.parametrize("fmt,needle", [
    ({"type": "json_schema"}, "response_format.json_schema.schema"),
    ({"type": "xml"}, "response_format.type"),
])
def test_bad_response_formats(server, fmt, needle):
    with pytest.raises(openai.BadRequestError, match=needle.replace(".", r"\.")):
        oa_client(server).chat.completions.create(model=MODEL, max_tokens=4, response_format=fmt,
                                                  messages=[{"role": "user", "content": "x"}])
