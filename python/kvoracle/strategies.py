"""Hypothesis strategies for kvoracle cases: a case is a pure function of a 64-bit seed and the
overrides, so drawing the seed draws the case (and hypothesis shrinks toward small seeds, while
kvoracle's own shrinking shrinks dimensions)."""

from hypothesis import reject
from hypothesis import strategies as st

from ._api import Case, Unsupported, emit_case


def case_seeds():
    """Any 64-bit case seed."""
    return st.integers(min_value=0, max_value=2**64 - 1)


def cases(op: str, **overrides) -> "st.SearchStrategy[Case]":
    """Cases of `op` ("write", "dense", "indexer", "attention") under the overrides. A seed whose
    case no file can hold (a huge cache) is rejected and another drawn."""

    def emit(seed: int) -> Case:
        try:
            return emit_case(op, seed, **overrides)
        except Unsupported:
            reject()

    return case_seeds().map(emit)
