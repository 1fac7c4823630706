"""kvoracle.check over NumPy subjects: correct ones pass, planted bugs fail with the SPEC 7 report,
bad functions and bad arguments are named."""

import re

import numpy as np
import pytest

import kvoracle
from engines_numpy import attention, block_topk_head_major

# What the NumPy write below implements: bf16 in, bf16 cache, no scale, -1 skipped, dense layers.
WRITE_MODES = dict(act_dtype="bf16", kv_dtype="bf16", scale_mode="none", slot_mode="strict",
                   layers="2D")


def numpy_write(call, *, skip_negative=True, sparse=False, index_rows=None):
    """Any layout, through the logical [nb, bs, nkv, hd] views; with `sparse`, a flat index-K row
    per token too, through `index_cache` or the view `index_rows(call)` gives (a kernel's idea of
    where the rows are)."""
    if call.layer_kind != "dense" and not sparse:
        raise kvoracle.Unsupported("dense layers only")
    tokens = call.slot_mapping.shape[0]
    bs = call.config["block_size"]
    slots = call.slot_mapping[:tokens]
    rows = np.nonzero(slots >= 0)[0] if skip_negative else np.arange(tokens)
    s = slots[rows]
    call.k_view[s // bs, s % bs] = call.k[rows]
    call.v_view[s // bs, s % bs] = call.v[rows]
    if call.layer_kind == "sparse":
        index = call.index_cache if index_rows is None else index_rows(call)
        index[s // bs, s % bs] = call.index_k[rows]


def test_numpy_write_passes_every_layout():
    report = kvoracle.check(numpy_write, op="write", cases=150, **WRITE_MODES)
    assert report.passed, report.message
    assert "150 cases" in report.message  # the summary, with the seed, on a pass too
    assert "0x000000006B766F72" in report.message


def test_strided_caches_through_the_views_pass_and_a_dense_assumption_fails():
    """SPEC 3 strided views: the call's views carry the strides (numpy arrays over the padded
    buffer), so a write through them passes; one that takes the buffer for the dense tensor (a
    reshape copies, or writes as if contiguous) fails, its first byte named."""
    strides = dict(WRITE_MODES, layout="nhd", num_kv_heads=2, head_dim=8, block_size=2,
                   kv_strides="56,24,8,0,16")
    report = kvoracle.check(numpy_write, op="write", cases=20, **strides)
    assert report.passed, report.message

    def dense_assumed(call):
        if call.layer_kind != "dense":
            raise kvoracle.Unsupported("dense layers only")
        tokens = call.slot_mapping.shape[0]
        nb, bs, h, d = call.k_view.shape
        slots = call.slot_mapping[:tokens]
        rows = np.nonzero(slots >= 0)[0]
        for view, src in ((call.k_view, call.k), (call.v_view, call.v)):
            # The buffer from the first element as if dense: [nb * bs, h, d] contiguous.
            flat = np.lib.stride_tricks.as_strided(
                view, shape=(nb * bs, h, d),
                strides=(h * d * view.itemsize, d * view.itemsize, view.itemsize))
            flat[slots[rows]] = src[rows]

    report = kvoracle.check(dense_assumed, op="write", cases=20, **strides)
    assert not report.passed
    assert "first: layer" in report.message


def test_strided_index_cache_through_its_view_passes_and_a_dense_assumption_fails():
    """SPEC 3 strided index-K views: bf16 rows of 16 elements at a stride of 24, blocks of 72,
    offset 8. Written through `index_cache` (its strides carried) the rows pass; taken for the
    dense [nb, bs, index_dim] tensor from the first element they land in the padding."""
    modes = dict(WRITE_MODES, layers="DS", index_layout="flat", index_dtype="bf16", index_dim=16,
                 block_size=2, index_strides="72,24,8", separate_index_slots=False)
    report = kvoracle.check(lambda call: numpy_write(call, sparse=True), op="write", cases=20,
                            **modes)
    assert report.passed, report.message

    def dense_view(call):
        view = call.index_cache
        nb, bs, dim = view.shape
        return np.lib.stride_tricks.as_strided(
            view, shape=(nb, bs, dim),
            strides=(bs * dim * view.itemsize, dim * view.itemsize, view.itemsize))

    report = kvoracle.check(lambda call: numpy_write(call, sparse=True, index_rows=dense_view),
                            op="write", cases=20, **modes)
    assert not report.passed
    assert "first: layer" in report.message and "index" in report.message, report.message


def test_wrapping_slot_fails_with_seed_mismatch_and_reproduce_line():
    def bug(call):
        numpy_write(call, skip_negative=False)

    report = kvoracle.check(bug, op="write", cases=100, **WRITE_MODES)
    assert not report.passed
    m = report.message
    assert "mismatch" in m
    assert "first: layer" in m  # the first differing byte with its coordinates
    assert "expected byte 0x" in m and "got 0x" in m
    assert "KVO_CASE_SEED=0x" in m and "-m pytest" in m  # replays this test's failing case
    assert "shrunk failure" in m


def test_case_seed_replays_one_case(monkeypatch):
    failing = kvoracle.check(lambda c: numpy_write(c, skip_negative=False), op="write", cases=100,
                             name="bug", **WRITE_MODES)
    seed = failing.message.split("KVO_CASE_SEED=")[1].split()[0]
    monkeypatch.setenv("KVO_CASE_SEED", seed)
    again = kvoracle.check(lambda c: numpy_write(c, skip_negative=False), op="write", name="bug",
                           **WRITE_MODES)
    assert not again.passed and "1 cases" in again.message


def test_raising_function_is_failed_to_run_never_pass():
    def broken(call):
        raise RuntimeError("kernel exploded")

    report = kvoracle.check(broken, op="write", cases=5, **WRITE_MODES)
    assert not report.passed
    assert "failed-to-run" in report.message and "kernel exploded" in report.message


def test_all_unsupported_is_not_a_pass():
    def nothing(call):
        raise kvoracle.Unsupported("not this one")

    report = kvoracle.check(nothing, op="write", cases=5, **WRITE_MODES)
    assert not report.passed and "unsupported" in report.message


def test_write_that_does_nothing_is_a_mismatch():
    report = kvoracle.check(lambda call: None, op="write", cases=5, **WRITE_MODES)
    assert not report.passed and "mismatch" in report.message


ATTENTION_MODES = dict(act_dtype="bf16", kv_dtype="bf16")


def test_numpy_attention_passes_as_foreign():
    report = kvoracle.check(attention, op="attention", cases=40, ordering="foreign",
                            **ATTENTION_MODES)
    assert report.passed, report.message


def test_attention_that_hides_its_own_token_fails():
    report = kvoracle.check(lambda call: attention(call, include_own_token=False), op="attention",
                            cases=40, ordering="foreign", **ATTENTION_MODES)
    assert not report.passed
    assert "KVO_CASE_SEED=0x" in report.message


def test_wrong_output_shape_is_failed_to_run():
    def wrong(call):
        return attention(call)[:, :1]

    report = kvoracle.check(wrong, op="attention", cases=3, ordering="foreign", **ATTENTION_MODES)
    assert not report.passed
    assert "failed-to-run" in report.message and "shape" in report.message


def test_wrong_output_dtype_is_failed_to_run():
    def wrong(call):
        return np.zeros(call.out.shape, dtype=np.float64)

    report = kvoracle.check(wrong, op="attention", cases=3, ordering="foreign", **ATTENTION_MODES)
    assert not report.passed and "dtype" in report.message


def test_unknown_override_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="block_sise"):
        kvoracle.check(numpy_write, op="write", block_sise=16)


def test_bad_override_value_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="layout"):
        kvoracle.check(numpy_write, op="write", layout="diagonal")


def test_an_inconsistent_configuration_is_a_value_error_naming_it(monkeypatch):
    """What the campaign rejects before a case runs (a value out of range, a malformed KVO_*
    variable) is the caller's error: ValueError with the field, never a failed report."""
    with pytest.raises(ValueError, match="block_size = 0: must be >= 1"):
        kvoracle.check(numpy_write, op="write", block_size=0)
    monkeypatch.setenv("KVO_CASES", "many")
    with pytest.raises(ValueError, match="KVO_CASES"):
        kvoracle.check(numpy_write, op="write")


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="not callable"):
        kvoracle.check(42, op="write")
    with pytest.raises(ValueError, match="unknown op"):
        kvoracle.check(numpy_write, op="scribble")
    with pytest.raises(ValueError, match="device"):
        kvoracle.check(numpy_write, op="write", device="tpu")
    with pytest.raises(TypeError, match="no function"):
        kvoracle.check(op="write")
    with pytest.raises(TypeError, match="cases must be an int"):
        kvoracle.check(numpy_write, op="write", cases="many")
    with pytest.raises(ValueError, match="seed"):
        kvoracle.check(numpy_write, op="write", seed=-1)
    with pytest.raises(ValueError, match="ordering"):
        kvoracle.check(numpy_write, op="write", cases=1, ordering="sideways")


def test_cuda_subject_without_a_gpu_is_not_a_pass():
    if kvoracle._core.cuda_unavailable_reason() == "":
        pytest.skip("a GPU answers here")
    report = kvoracle.check(numpy_write, op="write", cases=2, device="cuda", **WRITE_MODES)
    assert not report.passed and "did not run here" in report.message


def test_detect_modes_names_the_write_modes():
    results = kvoracle.detect_modes(numpy_write, op="write", cases=24, act_dtype="bf16",
                                    kv_dtype="bf16", scale_mode="none", layers="2D")
    assert [r.op for r in results] == ["write"]
    (r,) = results
    assert r.outcome == "pass", r.report
    assert any("slot_mode=strict" in m for m in r.matched), r.matched
    assert not any("slot_mode=legacy_wrap" in m for m in r.matched)


# A flat bf16 index-K cache, exact index-K (no NaN or -inf rows), one index head per KV head, two KV
# heads: where the layouts differ.
_INDEXER = dict(index_layout="flat", index_dtype="bf16", index_q="activation", index_nan="skip",
                nan_index_k=False, neg_inf_block=False, index_group="max", num_kv_heads=2,
                index_heads_per_kv=1)


def test_head_major_indexer_is_judged_in_its_declared_layout():
    a = kvoracle.adapters.topk_indexer(block_topk_head_major, order="descending_score",
                                       layout="head_major")
    report = kvoracle.check(a, op="indexer", cases=60, **_INDEXER)
    assert report.passed, report.message
    # The same bytes declared token-major: vllm#48604's misreading, caught with the seed.
    wrong = kvoracle.adapters.topk_indexer(lambda call: block_topk_head_major(call).reshape(
        call.ids.shape), order="descending_score")
    bad = kvoracle.check(wrong, op="indexer", cases=60, **_INDEXER)
    assert not bad.passed
    assert "seed" in bad.message and "top-k rows differ" in bad.message, bad.message


def test_detection_names_the_indexer_order_and_layout():
    a = kvoracle.adapters.topk_indexer(block_topk_head_major, layout="head_major")
    (r,) = kvoracle.detect_modes(a, op="indexer", cases=30, **_INDEXER)
    assert r.matched, r.report
    assert all("topk_order=descending_score" in m and "topk_layout=head_major" in m
               for m in r.matched), r.report


def test_a_bad_topk_form_is_named():
    with pytest.raises(Exception, match="topk_order"):
        kvoracle.check(block_topk_head_major, op="indexer", cases=1, ordering="foreign",
                       topk_order="descending_score,diagonal", **_INDEXER)


def test_campaign_options_as_the_command_line_takes_them():
    """jobs, shrink, fail_fast and time_budget reach the campaign (kvoracle check's --jobs,
    --no-shrink, --fail-fast, --time-budget); the report is the same for any number of jobs."""
    def bug(call):
        numpy_write(call, skip_negative=False)

    one = kvoracle.check(bug, op="write", cases=60, jobs=1, **WRITE_MODES)
    two = kvoracle.check(bug, op="write", cases=60, jobs=2, **WRITE_MODES)
    strip = lambda m: re.sub(r"[0-9.]+ s\b|waited [0-9.]+ s", "", m)
    assert not one.passed and strip(one.message) == strip(two.message)
    assert "shrunk failure" in one.message
    plain = kvoracle.check(bug, op="write", cases=60, shrink=False, **WRITE_MODES)
    assert not plain.passed and "shrunk failure" not in plain.message
    fast = kvoracle.check(bug, op="write", cases=60, fail_fast=True, shrink=False, **WRITE_MODES)
    ran = int(re.search(r"write +([0-9]+) ", fast.message).group(1))
    assert ran < 60, fast.message
    budget = kvoracle.check(numpy_write, op="write", cases=10**6, time_budget=0.5, **WRITE_MODES)
    assert budget.passed, budget.message
    assert int(re.search(r", ([0-9]+) cases in", budget.message).group(1)) < 10**6
    for bad, error in ((dict(jobs=-1), ValueError), (dict(jobs="2"), TypeError),
                       (dict(shrink=1), TypeError), (dict(time_budget=0), ValueError),
                       (dict(time_budget="1s"), TypeError)):
        with pytest.raises(error):
            kvoracle.check(numpy_write, op="write", cases=2, **bad, **WRITE_MODES)


def test_every_failure_class_is_listed_with_its_count_and_a_case():
    """A kernel wrong in two ways (a -1 slot wrapping, a raise on large steps) shows both causes,
    each with how many cases and one to replay; the outcome names the worst."""
    def two_bugs(call):
        if call.slot_mapping.shape[0] > 40:
            raise RuntimeError(f"out of memory asking {call.slot_mapping.shape[0]} rows")
        numpy_write(call, skip_negative=False)

    report = kvoracle.check(two_bugs, op="write", cases=80, **WRITE_MODES)
    assert report.outcome == "failed-to-run" and not report.passed
    listing = report.message.split("cases that did not pass, by class:")[1]
    assert re.search(r"\n +[0-9]+  failed-to-run: RuntimeError: out of memory asking N rows "
                     r"\(first: case [0-9]+, seed 0x[0-9A-F]{16}\)", listing), report.message
    assert re.search(r"\n +[0-9]+  mismatch: ", listing), report.message


def test_cuda_without_a_gpu_is_not_judged_never_a_pass():
    if not kvoracle._core.cuda_unavailable_reason():
        pytest.skip("a CUDA device answers here")
    report = kvoracle.check(numpy_write, op="write", cases=3, device="cuda", **WRITE_MODES)
    assert not report.passed
    assert report.outcome == "not judged", report.message
    assert "result: not judged" in report.message and "result: pass" not in report.message


def test_a_foreign_dense_insert_passes_and_a_planted_rope_bug_fails():
    from engines_numpy import dense_insert
    modes = dict(act_dtype="bf16", kv_dtype="bf16", scale_mode="none", edge_values=False)
    report = kvoracle.check(dense_insert, op="dense", ordering="foreign", cases=100, **modes)
    assert report.passed, report.message

    def swapped_sin(call):  # the rotation's sign flipped (GPT-J/NeoX confusions have this shape)
        call.cos_sin[:] = call.cos_sin * np.where(np.arange(call.cos_sin.shape[1]) <
                                                   call.rotary_dim // 2, 1, -1)
        return dense_insert(call)

    bad = kvoracle.check(swapped_sin, op="dense", ordering="foreign", cases=100, **modes)
    assert not bad.passed and "q_out" in bad.message, bad.message


def test_blind_spots_of_a_loose_profile_are_reported_with_the_pass():
    """SPEC principle 4: declared bf16_p (flash-style arithmetic), an attention passes, and the
    report says which planted bug classes that profile could not have caught, in how many cases."""
    report = kvoracle.check(attention, op="attention", cases=80, ordering="foreign",
                            profile="bf16_p", kv_dtype="bf16", act_dtype="bf16")
    assert report.passed, report.message
    spots = re.search(r"blind spots of attention \(attention\): .*\n +([0-9]+) of 80 cases  "
                      r"([a-z_]+)", report.message)
    assert spots and int(spots.group(1)) > 0, report.message
