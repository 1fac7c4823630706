"""Judge the engines as installed: every engine kernel kvoracle has an adapter for, found in the
Python environment by its package and import path, judged on the device present, one row per
(kernel, configuration).

    python -m kvoracle.engines                 # the table; --json FILE, --junit FILE, --cases N
    kvoracle.engines.judge_installed()         # the rows, to assert on in a test

An engine that is not installed is listed as absent (not a failure); a kernel its installed version
does not have as unavailable, with the import that failed. Exit status: 0 every judged kernel
passed, 1 one did not, 3 nothing could be judged here (no engine installed, or no GPU for CUDA
kernels).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from xml.sax.saxutils import escape, quoteattr

from . import adapters
from ._api import DEFAULT_SEED, check, detect_modes


@dataclass(frozen=True)
class EngineKernel:
    """One engine kernel kvoracle judges: where it lives (`locations`, "module:attribute" tried in
    order: the path moved between versions), how its adapter is made for each configuration, and
    which op it implements."""

    engine: str
    distribution: str  # the PyPI name importlib.metadata knows it by
    kernel: str
    locations: Tuple[str, ...]
    configurations: Dict[str, Callable[[Callable], adapters.Adapter]]
    op: str = "write"
    # Other kernels of the same engine the adapter needs (vLLM's index-K write follows its K/V
    # write in a sparse layer): their locations, handed to the configuration after the kernel.
    needs: Tuple[Tuple[str, ...], ...] = ()


def _with(make: Callable[..., adapters.Adapter], **overrides) -> Callable[..., adapters.Adapter]:
    """A configuration: the adapter `make` gives, with these dimensions fixed as well."""

    def configured(*kernels):
        a = make(*kernels)
        a.overrides.update(overrides)
        return a

    return configured


_BF16 = dict(kv_dtype="bf16", index_dtype="bf16")
_FP8 = dict(kv_dtype="fp8_e4m3", index_dtype="bf16")


def _vllm_index(backend: str, ue8m0: bool):
    def make(kernel, kv_write):
        return adapters.vllm_indexer_k_quant_and_cache(
            kernel, adapters.vllm_reshape_and_cache_flash(kv_write), ue8m0=ue8m0, backend=backend)

    return make


_VLLM_TRITON_WRITE = ("vllm.v1.attention.ops.triton_reshape_and_cache_flash:"
                      "triton_reshape_and_cache_flash",
                      "vllm.attention.ops.triton_reshape_and_cache_flash:"
                      "triton_reshape_and_cache_flash")
_MSA = "tensorrt_llm._torch.attention_backend.sparse.minimax_m3"

# The one table of engine kernels (engine, package, kernel, where, configurations).
ENGINE_KERNELS: Tuple[EngineKernel, ...] = (
    EngineKernel("vllm", "vllm", "reshape_and_cache_flash (CUDA op)",
                 ("vllm._custom_ops:reshape_and_cache_flash",),
                 {"auto": lambda k: adapters.vllm_reshape_and_cache_flash(k),
                  "fp8": lambda k: adapters.vllm_reshape_and_cache_flash(k, fp8=True)}),
    EngineKernel("vllm", "vllm", "triton_reshape_and_cache_flash", _VLLM_TRITON_WRITE,
                 {"auto": lambda k: adapters.vllm_reshape_and_cache_flash(k, backend="triton"),
                  "fp8": lambda k: adapters.vllm_reshape_and_cache_flash(k, fp8=True,
                                                                         backend="triton")}),
    EngineKernel("vllm", "vllm", "concat_and_cache_mla",
                 ("vllm._custom_ops:concat_and_cache_mla",),
                 {"auto": lambda k: adapters.vllm_concat_and_cache_mla(k),
                  "fp8": lambda k: adapters.vllm_concat_and_cache_mla(k, fp8=True)}),
    EngineKernel("vllm", "vllm", "indexer_k_quant_and_cache",
                 ("vllm._custom_ops:indexer_k_quant_and_cache",),
                 {"plain": _vllm_index("cuda", False), "ue8m0": _vllm_index("cuda", True)},
                 needs=(("vllm._custom_ops:reshape_and_cache_flash",),)),
    EngineKernel("tensorrt_llm", "tensorrt_llm", "fused_write_layer_caches",
                 (f"{_MSA}.msa_scatter:fused_write_layer_caches",),
                 {"bf16": _with(adapters.trtllm_fused_write_layer_caches, **_BF16),
                  "fp8": _with(adapters.trtllm_fused_write_layer_caches, **_FP8)}),
    EngineKernel("tensorrt_llm", "tensorrt_llm", "write_kv_slots (torch fallback)",
                 (f"{_MSA}.common:write_kv_slots",
                  "tensorrt_llm._torch.attention_backend.sparse.common:write_kv_slots"),
                 {"bf16": _with(adapters.trtllm_write_kv_slots, **_BF16),
                  "fp8": _with(adapters.trtllm_write_kv_slots, **_FP8)}),
    EngineKernel("sglang", "sglang", "MHATokenToKVPool.set_kv_buffer",
                 ("sglang.srt.mem_cache.memory_pool:MHATokenToKVPool.set_kv_buffer",),
                 {"bf16": lambda k: adapters.sglang_set_kv_buffer(k),
                  "fp8": lambda k: adapters.sglang_set_kv_buffer(k, fp8=True)}),
    EngineKernel("sglang", "sglang", "fused_fp8_set_kv_buffer",
                 ("sglang.srt.layers.attention.triton_ops.trtllm_fp8_kv_kernel:"
                  "fused_fp8_set_kv_buffer",),
                 {"fp8": adapters.sglang_fused_fp8_set_kv_buffer}),
    EngineKernel("flashinfer", "flashinfer-python", "append_paged_kv_cache",
                 ("flashinfer.page:append_paged_kv_cache", "flashinfer:append_paged_kv_cache"),
                 {"bf16": adapters.flashinfer_append_paged_kv_cache}),
)


@dataclass
class EngineRow:
    """One (kernel, configuration)'s verdict: `verdict` is "pass", "mismatch", "failed-to-run",
    "invalid-input", "not judged", "absent" (the engine is not installed) or "unavailable" (this
    version has no such kernel); `modes` the modes the adapter declares; `detected` (a mismatch
    only) the modes kvoracle's detection finds the kernel implements instead; `detail` the first
    mismatch, the reason or the failed import; `left_out` the cases the adapter or the kernel
    declined, by reason ("12 cases: ..."), so that a pass says what it did not cover."""

    engine: str
    version: str
    kernel: str
    configuration: str
    cases: int
    verdict: str
    modes: str = ""
    detail: str = ""
    detected: str = ""
    left_out: str = ""
    seed: int = DEFAULT_SEED
    report: str = field(default="", repr=False)


def _module_alone(module: str):
    """`module` loaded from its file without importing the packages above it: an engine's package
    __init__ pulls in its whole server (tqdm, fastapi, ...), which a kernel file of torch and
    Triton alone does not need. Found on sys.path; registered under its own name."""
    import importlib.util

    relative = module.replace(".", "/") + ".py"
    for root in sys.path:
        path = f"{root or '.'}/{relative}"
        try:
            spec = importlib.util.spec_from_file_location(module, path)
        except (ImportError, OSError):
            continue
        if spec is None or spec.loader is None or not os.path.isfile(path):
            continue
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[module] = loaded
        try:
            spec.loader.exec_module(loaded)
        except BaseException:
            del sys.modules[module]
            raise
        return loaded
    raise ModuleNotFoundError(f"no {relative} on sys.path")


def _locate(location: str):
    """The object at "module:attribute.path": the module imported as usual or, when that fails
    (the package around it needs what the kernel does not), its file loaded alone."""
    module, _, attribute = location.partition(":")
    try:
        obj = importlib.import_module(module)
    except Exception as package_error:
        try:
            obj = _module_alone(module)
        except Exception as alone_error:
            raise ImportError(f"{type(package_error).__name__}: {package_error}; loaded alone: "
                              f"{type(alone_error).__name__}: {alone_error}") from alone_error
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return obj


def _first_of(locations: Sequence[str]):
    errors = []
    for where in locations:
        try:
            return _locate(where), where
        except Exception as e:  # an engine's import may raise anything (a missing GPU library)
            errors.append(f"{where}: {type(e).__name__}: {e}")
    raise LookupError("; ".join(errors))


def _version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _first_mismatch(message: str) -> str:
    """The line of a report that says what went wrong first (SPEC 7's first mismatch)."""
    lines = [line.strip() for line in message.splitlines()]
    for prefix in ("first:", "cases that did not pass"):
        for i, line in enumerate(lines):
            if line.startswith(prefix):
                return line if prefix == "first:" else (lines[i + 1] if i + 1 < len(lines) else line)
    return ""


def _left_out(message: str) -> str:
    """The unsupported classes of a report ("      12  unsupported: <why> (first: ...)") as
    "12 cases: <why>", joined."""
    return "; ".join(f"{m[1]} cases: {m[2]}" for m in
                     re.finditer(r"^\s+(\d+)\s+unsupported: (.*?) \(first:", message, re.M))


def _modes(adapter: adapters.Adapter) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(adapter.overrides.items())
                    if k not in ("layers",))


def _detected(adapter: adapters.Adapter, op: str, cases: int, seed: int, device: str) -> str:
    """What a failing kernel implements instead (SPEC 7's detection): each mode axis that every
    matching combination agrees on, from the detection's per-mode line ("slot_mode=legacy_wrap":
    the -1 padding wraps), or that no combination matched."""
    for result in detect_modes(adapter, op=op, cases=cases, seed=seed, device=device):
        if result.outcome != "pass" or not result.matched:
            return "no combination of the contract's modes matches"
        line = next((x for x in result.report.splitlines() if x.strip().startswith("per mode:")),
                     "")
        fixed = [f"{m[1]}={m[2]}" for m in
                 re.finditer(r"(\w+)=([\w|]+)( \(every value matched\))?", line)
                 if not m[3] and "|" not in m[2]]
        return " ".join(fixed) or "every combination matches"
    return ""


def _default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "none"
    except ImportError:
        return "none"


def judge_installed(*, cases: int = 100, seed: int = DEFAULT_SEED, device: Optional[str] = None,
                    engines: Optional[Sequence[str]] = None,
                    kernels: Sequence[EngineKernel] = ENGINE_KERNELS) -> List[EngineRow]:
    """Every kernel of `kernels` (of `engines`, default all) found installed, judged over `cases`
    cases from `seed` per configuration on `device` ("cuda"; "cpu" for NumPy stand-ins with the
    engines' signatures; default: cuda where torch sees a GPU, else nothing is judged)."""
    device = device or _default_device()
    rows: List[EngineRow] = []
    for k in kernels:
        if engines and k.engine not in engines:
            continue
        version = _version(k.distribution)
        if version is None:
            rows += [EngineRow(k.engine, "-", k.kernel, c, 0, "absent",
                               detail=f"{k.distribution} is not installed")
                     for c in k.configurations]
            continue
        try:
            kernel, _ = _first_of(k.locations)
            needed = [_first_of(n)[0] for n in k.needs]
        except LookupError as e:
            rows += [EngineRow(k.engine, version, k.kernel, c, 0, "unavailable", detail=str(e))
                     for c in k.configurations]
            continue
        for name, make in k.configurations.items():
            adapter = make(kernel, *needed)
            if device == "none":
                rows.append(EngineRow(k.engine, version, k.kernel, name, 0, "not judged",
                                      _modes(adapter), "no GPU: torch sees no CUDA device"))
                continue
            report = check(adapter, op=k.op, cases=cases, seed=seed, device=device)
            detail = "" if report.passed else _first_mismatch(report.message)
            detected = (_detected(adapter, k.op, min(cases, 32), seed, device)
                        if report.outcome == "mismatch" else "")
            rows.append(EngineRow(k.engine, version, k.kernel, name, cases, report.outcome,
                                  _modes(adapter), detail, detected, _left_out(report.message),
                                  report.seed, report.message))
    return rows


def table(rows: Sequence[EngineRow]) -> str:
    head = ("engine", "version", "kernel", "config", "cases", "verdict", "first mismatch / why")
    body = [(r.engine, r.version, r.kernel, r.configuration, str(r.cases), r.verdict,
             r.detail[:160]) for r in rows]
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head) - 1)]
    out = []
    for line in [head] + body:
        out.append("  ".join(c.ljust(w) for c, w in zip(line, widths)) + "  " + line[-1])
    judged = [r for r in rows if r.verdict not in ("absent", "unavailable", "not judged")]
    failed = [r for r in judged if r.verdict != "pass"]
    out.append(f"{len(judged)} judged, {len(failed)} not passing, "
               f"{sum(r.verdict == 'absent' for r in rows)} absent, "
               f"{sum(r.verdict == 'unavailable' for r in rows)} unavailable, "
               f"{sum(r.verdict == 'not judged' for r in rows)} not judged")
    for r in judged:
        if r.modes:
            out.append(f"modes declared, {r.kernel} [{r.configuration}]: {r.modes}")
        if r.detected:
            out.append(f"modes detected, {r.kernel} [{r.configuration}]: {r.detected}")
        if r.left_out:
            out.append(f"left out, {r.kernel} [{r.configuration}]: {r.left_out}")
    return "\n".join(out)


def junit(rows: Sequence[EngineRow]) -> str:
    """One testcase per (kernel, configuration): a failure for a verdict other than pass, skipped
    for absent, unavailable and not judged."""
    failures = sum(r.verdict not in ("pass", "absent", "unavailable", "not judged") for r in rows)
    skipped = sum(r.verdict in ("absent", "unavailable", "not judged") for r in rows)
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuite name="kvoracle.engines" tests="{len(rows)}" failures="{failures}" '
           f'skipped="{skipped}">']
    for r in rows:
        name = quoteattr(f"{r.kernel} [{r.configuration}]")
        out.append(f'  <testcase classname={quoteattr(f"{r.engine} {r.version}")} name={name}>')
        if r.verdict in ("absent", "unavailable", "not judged"):
            out.append(f"    <skipped message={quoteattr(r.verdict + ': ' + r.detail)}/>")
        elif r.verdict != "pass":
            out.append(f"    <failure message={quoteattr(r.verdict + ': ' + r.detail)}>"
                       f"{escape(r.report)}</failure>")
        out.append("  </testcase>")
    out.append("</testsuite>")
    return "\n".join(out) + "\n"


def exit_status(rows: Sequence[EngineRow]) -> int:
    judged = [r for r in rows if r.verdict not in ("absent", "unavailable", "not judged")]
    if not judged:
        return 3
    return 0 if all(r.verdict == "pass" for r in judged) else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="kvoracle engines", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=100, help="cases per kernel and configuration")
    p.add_argument("--seed", type=lambda s: int(s, 0), default=DEFAULT_SEED)
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda where torch sees a GPU (cpu: NumPy stand-ins only)")
    p.add_argument("--engine", action="append", help="only these engines (repeatable)")
    p.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    p.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
    a = p.parse_args(argv)
    if a.cases < 1:
        p.error(f"--cases {a.cases}: must be >= 1")
    rows = judge_installed(cases=a.cases, seed=a.seed, device=a.device, engines=a.engine)
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{k: v for k, v in asdict(r).items() if k != "report" or r.verdict != "pass"}
                       for r in rows], f,
                      indent=2)
    if a.junit:
        with open(a.junit, "w") as f:
            f.write(junit(rows))
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
