"""The shortest kvoracle test a vLLM developer would copy: your cache write, with vLLM's own
signature, judged against kvoracle's bit-exact reference over 200 random cases (layouts, page sizes,
-1 padding, CUDA-graph padding rows, layer mixes). A failure prints the case seed, the first
differing byte with its block, offset, head and dim, the line that replays it and the case shrunk.

Run: pytest examples/python (after `pip install ".[test]"`: kvoracle with pytest and hypothesis;
`--kvo-cases N --kvo-seed S` size and seed every campaign of the run). Replace `reshape_and_cache_flash` below with
`torch.ops._C_cache_ops.reshape_and_cache_flash` (or your Triton launcher) and pass device="cuda".
"""

import numpy as np
import pytest

import kvoracle
from kvoracle import adapters


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                            k_scale, v_scale):
    """A stand-in for your kernel, in NumPy: vLLM's "auto" path."""
    tokens = slot_mapping.shape[0]  # key may have more rows: CUDA-graph padding
    slots = slot_mapping[:tokens]
    rows = np.nonzero(slots >= 0)[0]  # -1: a padding token, nothing written
    block, offset = slots[rows] // key_cache.shape[1], slots[rows] % key_cache.shape[1]
    key_cache[block, offset] = key[rows]
    value_cache[block, offset] = value[rows]


def test_my_cache_write():
    kvoracle.assert_passes(adapters.vllm_reshape_and_cache_flash(reshape_and_cache_flash),
                           op="write")


def test_my_cache_write_on_the_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or kvoracle._core.cuda_unavailable_reason():
        pytest.skip("no CUDA device here")

    def torch_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                    v_scale):
        slots = slot_mapping[: slot_mapping.shape[0]]
        rows = torch.nonzero(slots >= 0).flatten()
        bs = key_cache.shape[1]
        key_cache[slots[rows] // bs, slots[rows] % bs] = key[rows]
        value_cache[slots[rows] // bs, slots[rows] % bs] = value[rows]

    kvoracle.assert_passes(adapters.vllm_reshape_and_cache_flash(torch_write), op="write",
                           device="cuda")
