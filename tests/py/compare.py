"""How the model tests compare specd with a reference: first-position logits
against an independent numpy forward, and greedy tokens against mlx-lm's,
both with the near-tie rule (where the reference's top-2 margin is under
`near_tie`, float rounding may pick either token)."""
from __future__ import annotations

import numpy as np


def mlx_lm_greedy(model, prompt_ids, n, eos=frozenset()):
    """mlx-lm greedy decoding with its KV cache: (ids, top-2 margin per step).
    Stops after a token in `eos`."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    ids, margins = [], []
    x = mx.array(prompt_ids)[None]
    for _ in range(n):
        logits = np.array(model(x, cache=cache)[0, -1].astype(mx.float32))
        top = np.sort(logits)[-2:]
        t = int(logits.argmax())
        ids.append(t)
        margins.append(float(top[1] - top[0]))
        if t in eos:
            break
        x = mx.array([[t]])
    return ids, margins


def assert_same_greedy(mlx_ids, margins, specd_ids, near_tie):
    """The two greedy runs agree token for token, or first differ where
    mlx-lm's top-2 margin is a near-tie (under `near_tie`), where float
    rounding may pick either token."""
    n = min(len(mlx_ids), len(specd_ids))
    first = next((i for i in range(n) if mlx_ids[i] != specd_ids[i]), None)
    if first is None:
        assert len(mlx_ids) == len(specd_ids), (mlx_ids, specd_ids)
        print(f"identical: {len(specd_ids)} tokens, min margin {min(margins):.4f}")
        return
    print(f"first difference at {first}: mlx-lm {mlx_ids[first]} specd {specd_ids[first]}, margin {margins[first]:.5f}")
    assert margins[first] < near_tie, (
        f"greedy tokens differ at step {first} (mlx-lm {mlx_ids[first]}, specd {specd_ids[first]}) "
        f"where the top-2 margin is {margins[first]:.4f}, not a near-tie\n"
        f"mlx-lm: {mlx_ids}\nspecd:  {specd_ids}"
    )


def assert_logits_close(name, ids, got, want, atol, near_tie):
    """`got` (specd) within `atol` of `want` (the reference) everywhere, and
    the same argmax unless the reference's top two are a near-tie."""
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.all(np.isfinite(got))
    diff = np.abs(got - want)
    top2 = np.sort(want)[-2:]
    print(
        f"{name}: {len(ids)} prompt tokens, max |diff| {diff.max():.3g} (mean {diff.mean():.3g}) "
        f"at logit scale {np.abs(want).max():.3g}; argmax specd {got.argmax()} ref {want.argmax()}, "
        f"ref top-2 margin {top2[1] - top2[0]:.4f}"
    )
    assert diff.max() < atol, f"max |logit diff| {diff.max():.3g} >= {atol}"
    if top2[1] - top2[0] >= near_tie:
        assert got.argmax() == want.argmax()


def assert_batched_equals_solo(url, model, mix, *, need, tries=5, timeout=300):
    """Each (prompt, options) of `mix` alone, then all released together
    through `url`'s /api/generate: every request of a release gets exactly
    its solo tokens, and at least `need` of them shared a batched step.

    A tiny model's few tokens can be done before the next request reaches
    the server (seen on a loaded machine and an idle one alike), so the
    release is tried up to `tries` times for `need` requests to share a
    step; every try checks the tokens. Returns each request's shared steps
    of the last try."""
    import threading

    import httpx

    def generate(i):
        prompt, options = mix[i]
        r = httpx.post(url + "/api/generate", timeout=timeout,
                       json={"model": model, "prompt": prompt, "raw": True, "stream": False,
                             "options": {"temperature": 0, **options}})
        assert r.status_code == 200, r.text
        return r.json()

    solo = [generate(i) for i in range(len(mix))]
    for _ in range(tries):
        together = [None] * len(mix)
        barrier = threading.Barrier(len(mix))

        def run(i):
            barrier.wait()
            together[i] = generate(i)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(mix))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=2 * timeout)
        for i, (alone, batched) in enumerate(zip(solo, together)):
            assert batched is not None, f"request {i} did not finish"
            assert batched["context"] == alone["context"], f"request {i} ({mix[i][1]}) changed in a batch"
            assert batched["speculation"]["policy_failure"] is None, batched["speculation"]
        shared = [r["speculation"]["batch_steps"] for r in together]
        print(f"batch steps {shared}")
        if sum(s > 0 for s in shared) >= need:
            break
    assert sum(s > 0 for s in shared) >= need, shared
    return shared
