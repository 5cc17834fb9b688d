"""The acceptance half of the hostile Python policy (see schedule.py)."""

import json

from wit_world.exports import acceptance as wit


class Acceptor(wit.Acceptor):
    def __init__(self, do: str, vocab_size: int):
        self.do = do
        self.vocab_size = vocab_size

    @classmethod
    def create(cls, config: str, vocab_size: int):
        return cls(json.loads(config or "{}").get("do", ""), vocab_size)

    def decide(self, positions) -> wit.Decision:
        if self.do == "accept-too-many":
            return wit.Decision(len(positions) + 1, wit.Correction_Residual())
        if self.do == "bad-token":
            return wit.Decision(0, wit.Correction_Token(self.vocab_size))
        return wit.Decision(len(positions), wit.Correction_Residual())
