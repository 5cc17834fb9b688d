"""The `rejection` acceptance policy in Python: the twin of
plugins/rust/rejection (semantics: specd_policy_logic::Rejection in
plugins/logic/src/lib.rs).

Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): draft i is
accepted iff uniform * q < p, i.e. with probability min(1, p/q); the first
rejected position is corrected from the residual norm(max(0, p - q)), which
the host samples.  Config: {} (no keys).

The WIT's p, q and uniform are f32.  Python computes in f64, where the
product of two f32 is exact; the Rust twin rounds it to f32 before the
comparison, so this rounds it too (or a product just below p that rounds up
to p would be accepted here and rejected there).

componentize-py implements the WIT interface `acceptance` by this module
(named after the interface) and its resource `acceptor` by the class
`Acceptor`; build: scripts/build-python-plugins.sh.
"""

import json
import math
import struct

from componentize_py_types import Err
from wit_world.exports import acceptance as wit


def f32(x: float) -> float:
    """x rounded to the nearest f32 (as Rust's `f32 * f32` would give)."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def parse_empty_config(config: str) -> None:
    text = config if config.strip() else "{}"
    if not text.lstrip().startswith("{"):
        raise ValueError(f"bad config {config!r}: expected a JSON object")
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise ValueError(f"bad config {config!r}: {e}") from None
    if obj:
        raise ValueError(f"bad config {config!r}: unknown field `{next(iter(obj))}`, there are no fields")


class Acceptor(wit.Acceptor):
    @classmethod
    def create(cls, config: str, vocab_size: int):
        try:
            parse_empty_config(config)
        except ValueError as e:
            raise Err(str(e))
        return cls()

    def decide(self, positions) -> wit.Decision:
        for i, pos in enumerate(positions):
            if f32(pos.uniform * pos.q) >= pos.p:
                return wit.Decision(i, wit.Correction_Residual())
        return wit.Decision(len(positions), wit.Correction_Residual())
