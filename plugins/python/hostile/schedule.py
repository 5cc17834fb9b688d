"""A hostile Python policy for the host's containment tests
(host/policy/tests/python_policies.rs): the Python rewrite of the Rust
suite's hostile cases.  The config picks the misbehaviour:

    {"do": "loop"}            next-draft-length never returns      -> timeout
    {"do": "loop-create"}     create never returns                 -> timeout
    {"do": "grow"}            next-draft-length allocates forever  -> memory_limit
    {"do": "raise"}           next-draft-length raises             -> trap
    {"do": "too-long"}        answers max-draft + 1                -> invalid_answer
    {"do": "accept-too-many"} decide accepts one more than drafted -> invalid_answer
    {"do": "bad-token"}       decide corrects with vocab-size      -> invalid_answer
    {} (or anything else)     behaves: k = 2, accept everything

It exports both interfaces (this module and acceptance.py).
"""

import json

from wit_world.exports import schedule as wit


class Scheduler(wit.Scheduler):
    def __init__(self, do: str):
        self.do = do

    @classmethod
    def create(cls, config: str, carried):
        do = json.loads(config or "{}").get("do", "")
        if do == "loop-create":
            while True:
                pass
        return cls(do)

    def next_draft_length(self, input: wit.ScheduleInput) -> int:
        if self.do == "loop":
            n = 0
            while True:
                n += 1
        if self.do == "grow":
            # Growing fast: filling memory a MiB at a time would run out of
            # fuel (zeroing is instructions too) before it reached the cap.
            hoard, n = [], 1 << 20
            while True:
                hoard.append(bytearray(n))
                n *= 4
        if self.do == "raise":
            raise RuntimeError("a Python exception in next-draft-length")
        if self.do == "too-long":
            return input.max_draft + 1
        return min(2, input.max_draft)

    def carry(self):
        return None
