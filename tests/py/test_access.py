"""Who may do what (issue 19): API keys, the guarded policy registry, quotas.

Two servers, one model load each:
- `keyed`: API keys from SPECD_API_KEYS, the admin key from SPECD_ADMIN_KEY,
  small quotas and limits from a config file (`--config`), /metrics keyed;
- `open_lan`: no keys, bound to 0.0.0.0 (not loopback): inference is open,
  the policy registry is read-only.

The real `openai` and `ollama` clients and raw httpx talk to them.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import threading
import time

import httpx
import ollama
import openai
import pytest

from conftest import MODEL, ROOT

USER_KEYS = ["user-key-a", "user-key-b"]
ADMIN_KEY = "admin-key-0123"
PLUGINS = ROOT / "plugins" / "target" / "wasm32-wasip2" / "release"
QUESTION = "What is the capital of France?"
# Raw text the model keeps repeating: a long generation that does not stop early.
REPETITIVE = "red green blue yellow red green blue yellow red green blue yellow red green"
MAX_TOKENS = 512
MAX_PROMPT_TOKENS = 200
MAX_BODY = 64 << 10

os.environ.pop("OLLAMA_API_KEY", None)


def component(name: str) -> bytes:
    p = PLUGINS / f"{name}.wasm"
    assert p.exists(), f"{p} is missing: cargo build builds the plugins"
    return p.read_bytes()


# Quotas sized from the real components: "constant" and "heuristic" fit
# together exactly; "throughput" is bigger than "constant".
SIZES = {n: len(component(n)) for n in ("constant", "heuristic", "throughput")}
assert SIZES["throughput"] > SIZES["constant"]
MAX_POLICIES = 2
MAX_POLICY_BYTES = SIZES["constant"] + SIZES["heuristic"]
MAX_COMPONENT = max(SIZES.values()) + 1000


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


USER = bearer(USER_KEYS[0])
ADMIN = bearer(ADMIN_KEY)


@pytest.fixture(scope="module")
def keyed(start_server, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("access") / "serve.json"
    cfg.write_text(json.dumps({
        "metrics_key_required": True,
        "registry_max_policies": MAX_POLICIES,
        "registry_max_bytes": MAX_POLICY_BYTES,
        "max_body_bytes": MAX_BODY,
        "max_concurrent_uploads": 1,
        "max_tokens": MAX_TOKENS,
        "max_prompt_tokens": MAX_PROMPT_TOKENS,
        "policy_limits": {"max_component_bytes": MAX_COMPONENT},
        # One request at a time (the config key is tested too): the delete
        # test needs a request to wait in the queue behind a running one.
        "max_sequences": 1,
    }))
    saved = {k: os.environ.get(k) for k in ("SPECD_API_KEYS", "SPECD_ADMIN_KEY")}
    os.environ["SPECD_API_KEYS"] = ",".join(USER_KEYS)
    os.environ["SPECD_ADMIN_KEY"] = ADMIN_KEY
    try:
        return start_server("--config", str(cfg))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def policy_names(srv, headers=USER) -> set[str]:
    r = httpx.get(srv.url + "/api/policies", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return {p["name"] for p in r.json()["policies"] if not p["builtin"]}


def upload(srv, name: str, body, headers=ADMIN, **kw) -> httpx.Response:
    return httpx.post(srv.url + "/api/policies", params={"name": name}, content=body,
                      headers={"content-type": "application/wasm", **headers}, timeout=120, **kw)


def delete(srv, name: str, headers=ADMIN) -> httpx.Response:
    return httpx.delete(srv.url + f"/api/policies/{name}", headers=headers, timeout=30)


def health(srv) -> dict:
    return httpx.get(srv.url + "/health", timeout=10).json()


# --- inference keys ------------------------------------------------------------------------


def test_openai_client_needs_a_right_key(keyed):
    msgs = [{"role": "user", "content": QUESTION}]
    for key in USER_KEYS + [ADMIN_KEY]:
        client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=key, max_retries=0)
        r = client.chat.completions.create(model=MODEL, max_tokens=24, temperature=0, messages=msgs)
        assert "Paris" in r.choices[0].message.content
    chunks = list(client.chat.completions.create(model=MODEL, max_tokens=24, temperature=0, messages=msgs,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert [m.id for m in client.models.list()] == [MODEL]

    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.chat.completions.create(model=MODEL, max_tokens=8, messages=msgs)
    assert e.value.status_code == 401
    assert e.value.body["code"] == "invalid_api_key" and "invalid API key" in e.value.body["message"]
    with pytest.raises(openai.AuthenticationError):
        list(wrong.chat.completions.create(model=MODEL, max_tokens=8, messages=msgs, stream=True))
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    # A prefix of a right key is a wrong key.
    short = openai.OpenAI(base_url=keyed.url + "/v1", api_key=USER_KEYS[0][:-1], max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        short.completions.create(model=MODEL, prompt="Hi", max_tokens=2)

    # No key at all: 401 in the OpenAI error shape, with WWW-Authenticate.
    for path, body in (("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 4}),
                       ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "stream": True})):
        r = httpx.post(keyed.url + path, json=body, timeout=30)
        assert r.status_code == 401, r.text
        err = r.json()["error"]
        assert err["type"] == "authentication_error" and "missing API key" in err["message"]
        assert r.headers["www-authenticate"] == "Bearer"
    r = httpx.get(keyed.url + "/v1/models", headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert r.status_code == 401 and "Bearer" in r.json()["error"]["message"]


def test_ollama_client_needs_a_right_key(keyed):
    msgs = [{"role": "user", "content": QUESTION}]
    good = ollama.Client(host=keyed.url, headers=bearer(USER_KEYS[1]), timeout=120)
    r = good.chat(model=MODEL, messages=msgs, options={"num_predict": 24, "temperature": 0})
    assert "Paris" in r.message.content
    parts = list(good.chat(model=MODEL, messages=msgs, options={"num_predict": 24, "temperature": 0}, stream=True))
    assert "".join(p.message.content for p in parts) == r.message.content
    g = list(good.generate(model=MODEL, prompt=QUESTION, options={"num_predict": 24, "temperature": 0},
                           stream=True))
    assert "".join(p.response for p in g) == r.message.content
    assert [m.model for m in good.list().models] == [MODEL]

    for client in (ollama.Client(host=keyed.url, timeout=30),
                   ollama.Client(host=keyed.url, headers=bearer("wrong"), timeout=30)):
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(model=MODEL, messages=msgs, options={"num_predict": 4})
        assert e.value.status_code == 401 and "API key" in e.value.error
        with pytest.raises(ollama.ResponseError) as e:
            list(client.generate(model=MODEL, prompt=QUESTION, options={"num_predict": 4}, stream=True))
        assert e.value.status_code == 401
        with pytest.raises(ollama.ResponseError) as e:
            client.list()
        assert e.value.status_code == 401
    # the Ollama error shape: {"error": "..."}
    r = httpx.post(keyed.url + "/api/chat", json={"model": MODEL, "messages": msgs}, timeout=30)
    assert r.status_code == 401 and isinstance(r.json()["error"], str)
    # an unknown route under the APIs does not answer without a key either
    assert httpx.get(keyed.url + "/api/nope").status_code == 401
    assert httpx.get(keyed.url + "/api/nope", headers=USER).status_code == 404


def test_open_routes_and_keyed_metrics(keyed):
    assert health(keyed)["status"] == "ok"
    page = httpx.get(keyed.url + "/ui")
    assert page.status_code == 200 and 'id="apikey"' in page.text and "Bearer" in page.text
    r = httpx.get(keyed.url + "/metrics")
    assert r.status_code == 401
    r = httpx.get(keyed.url + "/metrics", headers=USER)
    assert r.status_code == 200 and 'status="401"' in r.text
    assert httpx.get(keyed.url + "/metrics", headers=ADMIN).status_code == 200


# --- the registry: admin key, records, quotas --------------------------------------------


def test_upload_and_delete_need_the_admin_key(keyed):
    wasm = component("constant")
    before = policy_names(keyed)
    r = upload(keyed, "adm-test", wasm, headers={})
    assert r.status_code == 401 and "admin key" in r.json()["error"]
    r = upload(keyed, "adm-test", wasm, headers=bearer("wrong"))
    assert r.status_code == 401
    r = upload(keyed, "adm-test", wasm, headers=USER)
    assert r.status_code == 403 and "admin key" in r.json()["error"]
    assert policy_names(keyed) == before
    assert not (keyed.policy_dir / "adm-test.wasm").exists()

    r = upload(keyed, "adm-test", wasm)
    assert r.status_code == 201, r.text
    info = r.json()["policy"]
    listed = {p["name"]: p for p in httpx.get(keyed.url + "/api/policies", headers=USER).json()["policies"]}
    entry = listed["adm-test"]
    assert entry["sha256"] == hashlib.sha256(wasm).hexdigest() == info["sha256"]
    assert entry["uploaded_by"] == hashlib.sha256(ADMIN_KEY.encode()).hexdigest()[:8]
    assert ADMIN_KEY not in json.dumps(listed)
    uploaded = entry["uploaded_at"]
    at = datetime.datetime.strptime(uploaded[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    assert uploaded.endswith("Z")
    assert abs((datetime.datetime.now(datetime.timezone.utc) - at).total_seconds()) < 600
    assert listed["constant"]["builtin"] and "uploaded_at" not in listed["constant"]
    record = json.loads((keyed.policy_dir / "adm-test.upload.json").read_text())
    assert record["sha256"] == entry["sha256"] and record["key_id"] == entry["uploaded_by"]
    # usable with a user key
    r = httpx.post(keyed.url + "/api/generate", headers=USER, timeout=120, json={
        "model": MODEL, "prompt": REPETITIVE, "raw": True, "stream": False,
        "options": {"num_predict": 8, "schedule": "adm-test"}})
    assert r.status_code == 200 and r.json()["speculation"]["schedule"] == "adm-test"

    for headers, status in (({}, 401), (bearer("wrong"), 401), (USER, 403)):
        r = delete(keyed, "adm-test", headers=headers)
        assert r.status_code == status, r.text
    assert "adm-test" in policy_names(keyed)
    r = delete(keyed, "adm-test")
    assert r.status_code == 200 and r.json()["removed"] == ["adm-test"]
    assert "adm-test" not in policy_names(keyed)
    assert not (keyed.policy_dir / "adm-test.wasm").exists()
    assert not (keyed.policy_dir / "adm-test.upload.json").exists()


def test_quotas_refuse_and_leave_the_registry_unchanged(keyed):
    assert policy_names(keyed) == set()
    files = lambda: sorted(p.name for p in keyed.policy_dir.glob("*.wasm"))  # noqa: E731
    # The upload route has its own limit: a component over the other routes' body limit is fine.
    assert SIZES["constant"] > MAX_BODY
    assert upload(keyed, "q1", component("constant")).status_code == 201
    assert upload(keyed, "q2", component("heuristic")).status_code == 201
    # count: a third policy
    r = upload(keyed, "q3", component("constant"))
    assert r.status_code == 507, r.text
    assert f"the most allowed ({MAX_POLICIES})" in r.json()["error"] and "registry-max-policies" in r.json()["error"]
    assert policy_names(keyed) == {"q1", "q2"} and files() == ["q1.wasm", "q2.wasm"]
    # replacing a name is not one more policy (same size: still fits)
    assert upload(keyed, "q1", component("constant")).status_code == 201
    # bytes: heuristic + throughput pass the byte limit
    assert delete(keyed, "q1").status_code == 200
    r = upload(keyed, "q3", component("throughput"))
    assert r.status_code == 507, r.text
    assert f"limit of {MAX_POLICY_BYTES} bytes" in r.json()["error"]
    assert policy_names(keyed) == {"q2"} and files() == ["q2.wasm"]
    listing = httpx.get(keyed.url + "/api/policies", headers=USER).json()
    assert listing["usage"] == {"policies": 1, "bytes": SIZES["heuristic"]}
    assert listing["limits"]["registry_max_policies"] == MAX_POLICIES
    assert listing["registry"]["mode"] == "admin_key"
    # one body over the component limit: 413 (Content-Length and chunked alike)
    r = upload(keyed, "big", b"\0asm" + b"\0" * MAX_COMPONENT)
    assert r.status_code == 413 and "limit" in r.json()["error"]

    def chunks():
        for _ in range(MAX_COMPONENT // 4096 + 2):
            yield b"\0" * 4096

    r = upload(keyed, "big", chunks())
    assert r.status_code == 413 and "limit" in r.json()["error"]
    assert policy_names(keyed) == {"q2"} and files() == ["q2.wasm"]
    assert delete(keyed, "q2").status_code == 200
    assert policy_names(keyed) == set()


def test_body_limit_on_every_route(keyed):
    big = "x" * (MAX_BODY + 10)
    r = httpx.post(keyed.url + "/api/chat", headers=USER, timeout=30,
                   json={"model": MODEL, "messages": [{"role": "user", "content": big}]})
    assert r.status_code == 413 and f"limit of {MAX_BODY} bytes" in r.json()["error"]
    r = httpx.post(keyed.url + "/v1/chat/completions", headers=USER, timeout=30,
                   json={"model": MODEL, "messages": [{"role": "user", "content": big}]})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    # chunked, no Content-Length: the extractor's limit
    body = json.dumps({"model": MODEL, "prompt": big}).encode()
    r = httpx.post(keyed.url + "/api/generate", headers=USER, timeout=30,
                   content=(body[i:i + 8192] for i in range(0, len(body), 8192)))
    assert r.status_code == 413 and "limit" in r.json()["error"]
    # without a key the body does not matter: 401 first
    r = httpx.post(keyed.url + "/api/chat", json={"model": MODEL, "messages": [], "pad": big}, timeout=30)
    assert r.status_code == 401


def test_token_limits_name_the_limit(keyed):
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=USER_KEYS[0], max_retries=0)
    msgs = [{"role": "user", "content": QUESTION}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, max_tokens=MAX_TOKENS + 1, messages=msgs)
    assert f"limit of {MAX_TOKENS} tokens" in e.value.body["message"]
    oc = ollama.Client(host=keyed.url, headers=USER, timeout=120)
    with pytest.raises(ollama.ResponseError) as e:
        oc.generate(model=MODEL, prompt=QUESTION, options={"num_predict": MAX_TOKENS + 1})
    assert e.value.status_code == 400 and "num_predict" in e.value.error and str(MAX_TOKENS) in e.value.error
    long_prompt = "one two three four five six seven eight nine ten " * 40
    with pytest.raises(ollama.ResponseError) as e:
        oc.generate(model=MODEL, prompt=long_prompt, options={"num_predict": 4})
    assert e.value.status_code == 400 and f"limit of {MAX_PROMPT_TOKENS} prompt tokens" in e.value.error
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=4)
    assert "max_prompt_tokens" in e.value.body["message"]
    # within the limits: fine
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=MAX_TOKENS)
    assert r.usage.completion_tokens <= MAX_TOKENS and r.choices[0].text


def metric(srv, name: str) -> float:
    text = httpx.get(srv.url + "/metrics", headers=USER, timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_concurrent_uploads_are_limited(keyed):
    """With --max-concurrent-uploads 1, an upload whose body is still
    arriving holds the one slot: a second gets 429 + Retry-After."""
    wasm = component("constant")
    release = threading.Event()
    result: dict = {}

    def slow_body():
        yield wasm[:1000]
        release.wait(120)
        yield wasm[1000:]

    def first():
        result["r"] = upload(keyed, "slow", slow_body())

    t = threading.Thread(target=first)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while metric(keyed, "specd_policy_uploads_in_flight") < 1:
            assert time.monotonic() < deadline, "the first upload never started"
            time.sleep(0.05)
        r = upload(keyed, "second", wasm)
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] and "at once" in r.json()["error"]
        assert metric(keyed, "specd_policy_uploads_busy_total") >= 1
    finally:
        release.set()
        t.join(120)
    assert result["r"].status_code == 201, result["r"].text
    assert policy_names(keyed) == {"slow"}
    # the slot is free again
    assert upload(keyed, "second", wasm).status_code == 201
    assert delete(keyed, "slow").status_code == 200 and delete(keyed, "second").status_code == 200


def test_delete_during_a_stream_lets_it_finish(keyed):
    """DELETE of the policy a streaming request runs: the stream goes on with
    the instance it has and ends with the same text as an undisturbed run; a
    request queued behind it that names the policy gets a clear 400."""
    assert upload(keyed, "mine", component("constant")).status_code == 201
    body = {"model": MODEL, "prompt": REPETITIVE, "raw": True, "stream": True,
            "options": {"num_predict": 400, "temperature": 0, "repeat_penalty": 1, "schedule": "mine",
                        "schedule_config": {"k": 2}}}

    def run(out: dict, started: threading.Event):
        text = []
        with httpx.stream("POST", keyed.url + "/api/generate", json=body, headers=USER, timeout=300) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if not line:
                    continue
                m = json.loads(line)
                if m.get("response"):
                    text.append(m["response"])
                    started.set()
                if m.get("done"):
                    out["final"] = m
        out["text"] = "".join(text)
        started.set()

    ref: dict = {}
    run(ref, threading.Event())
    assert ref["status"] == 200 and ref["final"]["speculation"]["generated_tokens"] == 400
    assert ref["final"]["speculation"]["schedule"] == "mine"

    out: dict = {}
    started = threading.Event()
    t = threading.Thread(target=run, args=(out, started))
    t.start()
    queued: dict = {}

    def behind():
        queued["r"] = httpx.post(keyed.url + "/api/generate", headers=USER, timeout=300, json={
            "model": MODEL, "prompt": "x", "stream": False, "options": {"num_predict": 4, "schedule": "mine"}})

    q = threading.Thread(target=behind)
    try:
        assert started.wait(120), "the stream never started"
        q.start()
        deadline = time.monotonic() + 60
        while health(keyed)["queued"] < 1:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.01)
        r = delete(keyed, "mine")
        assert r.status_code == 200 and r.json()["removed"] == ["mine"]
        # The DELETE has returned, and the stream is still generating.
        h = health(keyed)
        assert h["running"] == 1 and "final" not in out, (h, out.keys())
    finally:
        t.join(300)
        q.join(300)
    assert out["status"] == 200
    assert out["text"] == ref["text"]
    assert out["final"]["done_reason"] == ref["final"]["done_reason"]
    assert out["final"]["speculation"]["policy_failure"] is None
    assert out["final"]["speculation"]["schedule"] == "mine"
    r = queued["r"]
    assert r.status_code == 400 and "mine" in r.json()["error"], r.text
    assert "mine" not in policy_names(keyed)


# --- tenants ---------------------------------------------------------------------------


def test_prefix_cache_is_partitioned_per_key(keyed):
    """A prompt one key ran is a prefix-cache hit for that key only."""
    prompt = "Tenant check: " + " ".join(f"word{i}" for i in range(40))

    def cached(key: str) -> int:
        r = httpx.post(keyed.url + "/api/generate", headers=bearer(key), timeout=120, json={
            "model": MODEL, "prompt": prompt, "raw": True, "stream": False, "options": {"num_predict": 4}})
        assert r.status_code == 200, r.text
        return r.json()["speculation"]["cached_tokens"]

    assert cached(USER_KEYS[0]) == 0
    assert cached(USER_KEYS[0]) > 10  # the same key: a hit
    assert cached(USER_KEYS[1]) == 0  # another key: nothing of the first's
    assert cached(ADMIN_KEY) == 0
    assert cached(USER_KEYS[1]) > 10


def test_carried_policy_state_is_partitioned_per_key(keyed):
    """`heuristic` carries its k from one request to the next: per key."""
    config = {"initial": 3}  # a config of its own: no other test's carried state

    def ks(key: str) -> list[int]:
        body = {"model": MODEL, "prompt": REPETITIVE, "raw": True, "stream": True,
                "options": {"num_predict": 32, "temperature": 0, "schedule": "heuristic", "schedule_config": config,
                            "trace_rounds": True}}
        with httpx.stream("POST", keyed.url + "/api/generate", json=body, headers=bearer(key),
                          timeout=120) as r:
            assert r.status_code == 200
            return [json.loads(x)["round"]["k"] for x in r.iter_lines() if x and "round" in json.loads(x)]

    first = ks(USER_KEYS[0])
    again = ks(USER_KEYS[0])
    assert again[0] != first[0], (first, again)  # the same key starts from its carried k
    assert ks(USER_KEYS[1])[0] == first[0]  # another key starts afresh


# --- a non-loopback bind without an admin key ---------------------------------------------


def test_non_loopback_without_admin_key_is_read_only(start_server):
    srv = start_server("--host", "0.0.0.0")
    assert "READ-ONLY" in srv.log() and "not on loopback" in srv.log()
    before = policy_names(srv, headers={})
    r = httpx.get(srv.url + "/api/policies")
    assert r.json()["registry"]["mode"] == "read_only"
    for headers in ({}, bearer("anything")):
        r = upload(srv, "lan", component("constant"), headers=headers)
        assert r.status_code == 403, r.text
        assert "read-only" in r.json()["error"] and "--admin-key" in r.json()["error"]
        r = delete(srv, "constant", headers=headers)
        assert r.status_code == 403 and "read-only" in r.json()["error"]
    assert policy_names(srv, headers={}) == before
    assert not (srv.policy_dir / "lan.wasm").exists()
    # inference stays open (no API keys configured)
    client = ollama.Client(host=srv.url, timeout=120)
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                    options={"num_predict": 24, "temperature": 0})
    assert "Paris" in r.message.content
    assert httpx.get(srv.url + "/metrics").status_code == 200
    srv.stop()


# --- /ui with a key -------------------------------------------------------------------


def test_ui_sends_the_key_from_its_field(keyed):
    """The page is served without a key; run without one it reports the 401,
    and with a key typed into its field it runs both policies."""
    import shutil

    from test_ui import Cdp

    exe = shutil.which("chromium")
    assert exe, "chromium is missing (apt-get install -y chromium)"
    cdp = Cdp(exe)
    try:
        session = cdp.open(keyed.url + "/ui?num_predict=8")

        def run_until_settled() -> tuple[str, dict]:
            deadline = time.monotonic() + 120
            # The button is parsed before the page's script attaches its click
            # handler; the script's first publish() sets the body's phase, so a
            # phase means the handler is there (a click before it is lost).
            while cdp.js(session, "document.body && document.body.dataset.phase || ''") in ("", None, "running"):
                assert time.monotonic() < deadline, "the page's script did not run"
                time.sleep(0.2)
            cdp.js(session, "document.getElementById('run').click()")
            return cdp.settle(session, deadline - time.monotonic())

        phase, state = run_until_settled()
        assert phase == "error" and "401" in state["error"], state
        cdp.js(session, f"document.getElementById('apikey').value = {json.dumps(USER_KEYS[0])}")
        phase, state = run_until_settled()
        assert phase == "done", state
        assert all(state["runs"][s]["done"] and state["runs"][s]["text"] for s in ("A", "B")), state
    finally:
        cdp.close()
