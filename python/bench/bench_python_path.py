"""What the Python path costs (issue: at most 2x the C++ campaign per write case at default sizes;
at least 100 write cases/s of a torch CUDA subject on the H200). Each figure is measured in this
run against a baseline measured in the same run: the same campaign (same seed, cases and
overrides) over a built-in C++ subject (cpu-fused on the CPU, cuda-fused on the GPU).

    PYTHONPATH=build/python python python/bench/bench_python_path.py [--cases N]
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import kvoracle  # noqa: E402
from kvoracle import _core, _api  # noqa: E402

MODES = dict(act_dtype="bf16", kv_dtype="bf16", scale_mode="none", slot_mode="strict",
             layers="2D", slot_type="i64")


def numpy_write(call):
    tokens = call.slot_mapping.shape[0]
    bs = call.config["block_size"]
    slots = call.slot_mapping[:tokens]
    rows = np.nonzero(slots >= 0)[0]
    s = slots[rows]
    call.k_view[s // bs, s % bs] = call.k[rows]
    call.v_view[s // bs, s % bs] = call.v[rows]


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def baseline(subject, cases):
    (ok, _, _), seconds = timed(lambda: _core.check_builtin(
        subject, ["write"], cases, kvoracle.DEFAULT_SEED, _api._flags(MODES, "bench")))
    assert ok, subject
    return seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=300)
    n = ap.parse_args().cases
    rows = []
    report, t_py = timed(lambda: kvoracle.check(numpy_write, op="write", cases=n, **MODES))
    assert report.passed, report.message
    t_cpp = baseline("cpu-fused", n)
    rows.append(("numpy write (host)", "cpu-fused", n, t_py, t_cpp, "ratio<=2"))
    try:
        import torch
        cuda = torch.cuda.is_available() and not _core.cuda_unavailable_reason()
    except ImportError:
        cuda = False
    if cuda:
        import gpu_subjects as gs

        a = kvoracle.adapters.vllm_reshape_and_cache_flash(gs.torch_index_put)
        torch_modes = dict(MODES, layout="nhd")
        kvoracle.check(a, op="write", device="cuda", cases=5, **torch_modes)  # warm-up
        report, t_gpu = timed(lambda: kvoracle.check(a, op="write", device="cuda", cases=n,
                                                     **torch_modes))
        assert report.passed, report.message
        (ok, _, _), t_cuda = timed(lambda: _core.check_builtin(
            "cuda-fused", ["write"], n, kvoracle.DEFAULT_SEED, _api._flags(torch_modes, "bench")))
        rows.append(("torch index_put_ (cuda)", "cuda-fused", n, t_gpu, t_cuda, "cases/s>=100"))
    print("%-26s %-11s %6s %9s %9s %7s %9s  %s" % ("python subject", "baseline", "cases", "py_s",
                                                   "base_s", "ratio", "cases/s", "target"))
    for name, base, cases, t, tb, target in rows:
        ratio, rate = t / tb, cases / t
        ok = ratio <= 2 if target.startswith("ratio") else rate >= 100
        print("%-26s %-11s %6d %9.3f %9.3f %7.2f %9.1f  %s %s" % (
            name, base, cases, t, tb, ratio, rate, target, "ok" if ok else "MISS"))


if __name__ == "__main__":
    main()
