"""The adapters carry each engine's own signature to kvoracle: NumPy stand-ins of the engines'
kernels pass, and the bug classes real kernels had fail."""

import functools
import re

import numpy as np

import engines_numpy as eng
import pytest
import kvoracle
from kvoracle import adapters


def test_vllm_reshape_and_cache_flash_every_layout():
    a = adapters.vllm_reshape_and_cache_flash(eng.reshape_and_cache_flash)
    assert a.overrides["slot_type"] == "i64" and "csrc/cache_kernels.cu" in a.evidence
    report = kvoracle.check(a, op="write", cases=80)
    assert report.passed, report.message
    assert "vllm.reshape_and_cache_flash" in report.message


def test_vllm_reshape_and_cache_flash_without_the_negative_check_fails():
    def kernel(*args):
        eng.reshape_and_cache_flash(*args, skip_negative=False)

    report = kvoracle.check(adapters.vllm_reshape_and_cache_flash(kernel), op="write", cases=80)
    assert not report.passed and "KVO_CASE_SEED=" in report.message


def test_vllm_concat_and_cache_mla():
    report = kvoracle.check(adapters.vllm_concat_and_cache_mla(eng.concat_and_cache_mla),
                            op="write", cases=60)
    assert report.passed, report.message


def test_vllm_concat_and_cache_mla_with_its_parts_swapped_fails():
    def kernel(*args):
        eng.concat_and_cache_mla(*args, swap_parts=True)

    report = kvoracle.check(adapters.vllm_concat_and_cache_mla(kernel), op="write", cases=60)
    assert not report.passed


def test_flashinfer_append_paged_kv_cache():
    for layout in ("nhd", "hnd", "split_nhd", "split_hnd"):
        report = kvoracle.check(adapters.flashinfer_append_paged_kv_cache(
            eng.append_paged_kv_cache), op="write", cases=25, layout=layout)
        assert report.passed, report.message


def test_flashinfer_with_page_and_entry_swapped_fails():
    def kernel(k, v, b, positions, cache, indices, indptr, last, layout):
        eng.append_paged_kv_cache(k, v, b, positions, cache, indices, indptr, last,
                                  "HND" if layout == "NHD" else "NHD")

    report = kvoracle.check(adapters.flashinfer_append_paged_kv_cache(kernel), op="write",
                            cases=25, layout="nhd")
    assert not report.passed


def test_sglang_set_kv_buffer_as_its_pool_method():
    report = kvoracle.check(adapters.sglang_set_kv_buffer(eng.set_kv_buffer), op="write",
                            cases=60)
    assert report.passed, report.message


def test_sglang_fused_fp8_set_kv_buffer():
    """The real kernel (no slot mask) and a masked one both pass with mul_recip declared: SGLang
    never pads with -1, so the adapter passes the written tokens only; a kernel that rounds x / s
    instead of x * fl(1 / s), or writes each row one slot on, fails."""
    masked = functools.partial(eng.fused_fp8_set_kv_buffer, skip_negative=True)
    for kernel in (eng.fused_fp8_set_kv_buffer, masked):
        report = kvoracle.check(adapters.sglang_fused_fp8_set_kv_buffer(kernel), op="write",
                                cases=60)
        assert report.passed, report.message
        # Shapes its Triton blocks cannot compile are left out, by name, never judged.
        assert "compiles only where" in report.message, report.message

    def one_slot_on(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size):
        last = k_cache.shape[0] - 1
        eng.fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, np.minimum(cache_loc + 1, last),
                                    k_scale, v_scale, page_size)

    report = kvoracle.check(adapters.sglang_fused_fp8_set_kv_buffer(one_slot_on), op="write",
                            cases=60, shrink=False)
    assert report.outcome == "mismatch", report.message


def test_trtllm_fused_write_layer_caches_sparse_layers():
    a = adapters.trtllm_fused_write_layer_caches(eng.fused_write_layer_caches)
    report = kvoracle.check(a, op="write", cases=60, act_dtype="bf16", kv_dtype="bf16",
                            index_dtype="bf16", layers="1D2S")
    assert report.passed, report.message
    # The head dims it declines (not powers of two) count as unsupported, never as passes.
    row = re.search(r"^trtllm\.fused_write_layer_caches +write +(\d+) +(\d+) +0 +0 +0 +(\d+)$",
                    report.message, re.M)
    assert row and int(row[3]) > 0 and int(row[2]) + int(row[3]) == int(row[1]), report.message


def test_trtllm_fused_write_layer_caches_without_its_slot_mask_fails():
    kernel = functools.partial(eng.fused_write_layer_caches, skip_negative=False)
    report = kvoracle.check(adapters.trtllm_fused_write_layer_caches(kernel), op="write",
                            cases=40, act_dtype="bf16", kv_dtype="bf16", index_dtype="bf16",
                            layers="1D2S", shrink=False)
    assert report.outcome == "mismatch", report.message


def test_trtllm_write_kv_slots_fallback_wraps_minus_one():
    """TensorRT-LLM's torch fallback does not mask -1: the padding row lands on the last slot (the
    vllm#43810 class), caught under strict slots."""
    report = kvoracle.check(adapters.trtllm_write_kv_slots(eng.write_kv_slots), op="write",
                            cases=60, act_dtype="bf16", kv_dtype="bf16", index_dtype="bf16",
                            layers="1D2S", shrink=False)
    assert report.outcome == "mismatch", report.message


def test_vllm_triton_backend_declares_what_its_kernel_supports():
    a = adapters.vllm_reshape_and_cache_flash(eng.reshape_and_cache_flash, backend="triton")
    assert a.overrides["per_head_scale"] is False
    fp8 = adapters.vllm_reshape_and_cache_flash(eng.reshape_and_cache_flash, fp8=True,
                                                backend="triton")
    assert fp8.overrides["scale_mode"] == "div_approx"
    report = kvoracle.check(a, op="write", cases=40)
    assert report.passed, report.message
    with pytest.raises(ValueError):
        adapters.vllm_reshape_and_cache_flash(eng.reshape_and_cache_flash, backend="rocm")


def test_user_overrides_win_over_an_adapters():
    a = adapters.vllm_reshape_and_cache_flash(eng.reshape_and_cache_flash)
    report = kvoracle.check(a, op="write", cases=20, layers="3D", block_size=16)
    assert report.passed, report.message
    assert "--block-size 16" in kvoracle._core.parse_flags(["--block-size", "16"])


def test_foreign_attention_adapter_declares_its_profile():
    a = adapters.foreign_attention(eng.attention)
    assert a.ordering == "foreign" and a.profile == "fp32"
    report = kvoracle.check(a, op="attention", cases=20, act_dtype="bf16", kv_dtype="bf16")
    assert report.passed, report.message


def test_mode_detection_confirms_what_each_adapter_implies():
    """Each adapter's implied modes that are detection axes are among what detection names."""
    stand_ins = [
        (adapters.vllm_reshape_and_cache_flash(eng.reshape_and_cache_flash), {}),
        (adapters.vllm_concat_and_cache_mla(eng.concat_and_cache_mla), {}),
        (adapters.flashinfer_append_paged_kv_cache(eng.append_paged_kv_cache), {"layout": "hnd"}),
        (adapters.sglang_set_kv_buffer(eng.set_kv_buffer), {}),
    ]
    axes = {"slot_mode": "slot_mode", "scale_mode": "scale_mode", "sat": "saturation",
            "via_model_dtype": "via_model_dtype", "scale_in_model_dtype": "scale_in_model_dtype"}
    for a, fixed in stand_ins:
        (r,) = kvoracle.detect_modes(a, op="write", cases=16, **fixed)
        assert r.outcome == "pass", r.report
        matched = " ".join(r.matched)
        for key, axis in axes.items():
            if key in a.overrides and a.overrides[key] != "none":
                value = a.overrides[key]
                value = str(value).lower() if isinstance(value, bool) else value
                assert f"{axis}={value}" in matched, (a, key, r.report)


def _planted(adapter):
    """`adapter` with one stray byte after every call (the cache's first element changed): a bug
    in every case, behind the adapter's declared modes."""
    import numpy as np

    def buggy(call):
        adapter(call)
        cache = call.k_cache
        first = (0,) * cache.ndim
        value = cache[first]
        cache[first] = value + 1 if np.issubdtype(cache.dtype, np.integer) else -value - 1

    for name in ("overrides", "ordering", "topk_order", "profile"):
        setattr(buggy, name, getattr(adapter, name, None))
    buggy.__name__ = "planted_" + adapter.__name__
    return buggy


def test_a_shrunk_case_stays_inside_what_each_adapter_declares(monkeypatch):
    """Shrinking never changes a mode or dimension the adapter fixed: the shrunk case of a planted
    bug, replayed through its printed variables with the correct kernel, passes."""
    import re

    for a, fixed in [
        (adapters.vllm_reshape_and_cache_flash(eng.reshape_and_cache_flash), {}),
        (adapters.vllm_concat_and_cache_mla(eng.concat_and_cache_mla), {}),
        (adapters.flashinfer_append_paged_kv_cache(eng.append_paged_kv_cache), {"layout": "hnd"}),
        (adapters.sglang_set_kv_buffer(eng.set_kv_buffer), {}),
        (adapters.trtllm_fused_write_layer_caches(eng.fused_write_layer_caches),
         dict(act_dtype="bf16", kv_dtype="bf16", index_dtype="bf16", layers="1D2S")),
    ]:
        report = kvoracle.check(_planted(a), op="write", cases=20, **fixed)
        assert not report.passed and "shrunk failure of" in report.message, report.message
        shrunk = report.message[report.message.index("shrunk failure of"):]
        line = re.search(r"reproduce: KVO_CASE_SEED=(0x[0-9A-F]{16})"
                         r"(?: KVO_CASE_REDUCTIONS=(\S+))?", shrunk)
        assert line, shrunk
        with monkeypatch.context() as m:
            m.setenv("KVO_CASE_SEED", line.group(1))
            if line.group(2):
                m.setenv("KVO_CASE_REDUCTIONS", line.group(2))
            again = kvoracle.check(_planted(a), op="write", **fixed)
            assert not again.passed and "1 cases in" in again.message, again.message
            correct = kvoracle.check(a, op="write", **fixed)
            assert correct.passed and "1 cases in" in correct.message, (line.group(0),
                                                                         correct.message)


def test_detection_names_the_engines_mode_first_where_several_match():
    """A Triton twin's `/` may compile to x * fl(1 / s), which divide and mul_recip also match on
    most cases: the adapter declares div_approx, and detection names it first."""
    import re

    a = adapters.vllm_reshape_and_cache_flash(eng.reshape_and_cache_flash_fp8_mul_recip, fp8=True,
                                              backend="triton")
    assert kvoracle.check(a, op="write", cases=40).passed
    (r,) = kvoracle.detect_modes(a, op="write", cases=64)
    assert r.outcome == "pass", r.report
    modes = [re.search(r"scale_mode=(\w+)", m)[1] for m in r.matched]
    assert modes[0] == "div_approx" and {"divide", "mul_recip"} <= set(modes), modes


def test_the_triton_twins_e4m3_codes_in_an_e5m2_cache_are_caught():
    """vLLM's Triton wrapper maps every "fp8..." cache dtype to e4m3: asked for fp8_e5m2, the
    twin writes e4m3 codes, valid fp8 bytes that only a bit-exact comparison tells apart."""
    a = adapters.vllm_reshape_and_cache_flash(eng.reshape_and_cache_flash_fp8_mul_recip, fp8=True,
                                              backend="triton")
    report = kvoracle.check(a, op="write", cases=40, kv_dtype="fp8_e5m2", shrink=False)
    assert report.outcome == "mismatch", report.message
    assert "a wrong element" in report.message, report.message
