"""The `heuristic` schedule in Python: the twin of plugins/rust/heuristic
(semantics: specd_policy_logic::Heuristic in plugins/logic/src/lib.rs).

Hugging Face transformers' `num_assistant_tokens_schedule = "heuristic"`:
k starts at `initial` (config {"initial": 4}); before every round but the
first, the previous round updates it: +2 when every drafted token was
accepted, -1 otherwise (never below 1); a round that drafted nothing changes
nothing.  k is kept within [1, max-draft]; the answer is k (0 only when
max-draft is 0).  k is carried across requests as 4 little-endian bytes.

componentize-py implements the WIT interface `schedule` by this module (it
is named after the interface) and its resource `scheduler` by the class
`Scheduler`; build: scripts/build-python-plugins.sh.
"""

import json

from componentize_py_types import Err
from wit_world.exports import schedule as wit

U32_MAX = 0xFFFFFFFF


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate field `{key}`")
        out[key] = value
    return out


def parse_config(config: str) -> int:
    """`initial` from the JSON config, like the Rust twin's serde config:
    an object whose only (optional) key is `initial`, a u32 >= 1.  Raises
    ValueError with the message for the client."""
    text = config if config.strip() else "{}"
    if not text.lstrip().startswith("{"):
        raise ValueError(f"bad config {config!r}: expected a JSON object")
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates)
    except ValueError as e:
        raise ValueError(f"bad config {config!r}: {e}") from None
    unknown = [k for k in obj if k != "initial"]
    if unknown:
        raise ValueError(f"bad config {config!r}: unknown field `{unknown[0]}`, expected `initial`")
    initial = obj.get("initial", 4)
    # bool is an int in Python; JSON true is not a number.
    if type(initial) is not int or not 0 <= initial <= U32_MAX:
        raise ValueError(f"bad config {config!r}: initial must be an integer in 0..=4294967295")
    if initial == 0:
        raise ValueError("bad config: initial must be >= 1")
    return initial


class Scheduler(wit.Scheduler):
    def __init__(self, k: int):
        self.k = k

    @classmethod
    def create(cls, config: str, carried):
        try:
            k = parse_config(config)
        except ValueError as e:
            raise Err(str(e))
        if carried is not None and len(carried) == 4:
            k = max(int.from_bytes(carried, "little"), 1)
        return cls(k)

    def next_draft_length(self, input: wit.ScheduleInput) -> int:
        if input.round > 0 and input.recent:
            last = input.recent[-1]
            if last.drafted > 0:
                if last.accepted >= last.drafted:
                    self.k = min(self.k + 2, U32_MAX)
                else:
                    self.k = max(self.k - 1, 1)
        if input.max_draft == 0:
            return 0
        self.k = min(max(self.k, 1), input.max_draft)
        return self.k

    def carry(self):
        return self.k.to_bytes(4, "little")
