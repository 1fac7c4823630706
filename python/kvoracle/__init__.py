"""kvoracle: judge a paged KV-cache write, a block top-k indexer or a sparse attention kernel against
a bit-exact reference (SPEC 7 reports: the case seed, the first mismatch with coordinates and both
values, a line that replays it, the case shrunk).

    import kvoracle
    from kvoracle import adapters

    def test_my_write():
        kvoracle.assert_passes(adapters.vllm_reshape_and_cache_flash(my_kernel), op="write")
"""

from ._api import (
    DEFAULT_SEED,
    Call,
    Case,
    Judgement,
    ModeResult,
    Report,
    Unsupported,
    as_torch,
    assert_passes,
    check,
    detect_modes,
    emit_case,
    judge,
    raw_dtype,
    to_raw_numpy,
    torch_dtype,
)
from . import _core, adapters  # noqa: E402

__version__: str = _core.__version__  # CMakeLists.txt's project() version, built in

__all__ = [
    "DEFAULT_SEED",
    "Call",
    "Case",
    "Judgement",
    "ModeResult",
    "Report",
    "Unsupported",
    "adapters",
    "as_torch",
    "assert_passes",
    "check",
    "detect_modes",
    "emit_case",
    "judge",
    "raw_dtype",
    "to_raw_numpy",
    "torch_dtype",
]
