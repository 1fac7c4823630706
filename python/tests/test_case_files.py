"""Cases as arrays, results judged from Python, and the hypothesis strategies."""

import numpy as np
import pytest
from hypothesis import given

import kvoracle
from kvoracle.strategies import cases


def test_emit_case_holds_inputs_caches_and_the_answer():
    case = kvoracle.emit_case("write", 7, layers="2D", layout="hnd", kv_dtype="bf16",
                              act_dtype="bf16")
    assert case.op == "write" and case.seed == 7
    assert case.metadata["layout"] == "hnd"
    assert "layer.0.slot_mapping" in case.inputs
    assert case.dtype("input.layer.0.k") == "bf16"
    assert case.inputs["layer.0.k"].dtype == np.uint16  # raw bits
    assert set(case.expected) == {f"cache.layer.{l}.{b}" for l in (0, 1) for b in ("k", "v")}


def test_the_expected_answer_passes_and_a_changed_byte_fails():
    case = kvoracle.emit_case("write", 11, layers="2D")
    assert kvoracle.judge(case, case.expected).passed
    changed = {n: a.copy() for n, a in case.expected.items()}
    name = sorted(changed)[0]
    changed[name][300] ^= 1
    j = kvoracle.judge(case, changed)
    assert j.outcome == "mismatch" and j.exit_status == 1
    assert "first: layer" in j.report


def test_a_missing_or_misshapen_result_is_named():
    case = kvoracle.emit_case("indexer", 3)
    (name,) = case.expected
    with pytest.raises(ValueError, match="missing"):
        kvoracle.judge(case, {})
    with pytest.raises(ValueError, match="shape"):
        kvoracle.judge(case, {name: case.expected[name][:1]})
    with pytest.raises(ValueError, match="dtype"):
        kvoracle.judge(case, {name: case.expected[name].astype(np.int64)})
    with pytest.raises(ValueError, match="not one of"):
        kvoracle.judge(case, {name: case.expected[name], "extra": case.expected[name]})


def test_a_case_saved_and_loaded_is_the_same(tmp_path):
    case = kvoracle.emit_case("attention", 5)
    case.save(tmp_path / "c.st")
    again = kvoracle.Case.load(tmp_path / "c.st")
    assert again.file == case.file and kvoracle.judge(again, again.expected).passed


def test_a_corrupt_case_file_is_a_value_error():
    case = kvoracle.emit_case("write", 1)
    with pytest.raises(ValueError):
        kvoracle.Case(case.file[:40])


@given(cases("write", layers="1D1S"))
def test_every_drawn_write_case_judges_its_own_answer(case):
    assert kvoracle.judge(case, case.expected).passed


@given(cases("indexer"))
def test_every_drawn_indexer_case_judges_its_own_answer(case):
    j = kvoracle.judge(case, case.expected, ordering="foreign")
    assert j.passed, j.report


def test_a_huge_case_is_unsupported_as_a_file():
    # Seed 6 draws the huge-cache theme: its K/V buffers pass 2^32 bytes, which no case file of
    # whole caches holds; `kvoracle check --case-seed 6` judges it.
    with pytest.raises(kvoracle.Unsupported, match="huge"):
        kvoracle.emit_case("write", 6)
