"""The package's one front: campaigns, mode detection and case files over Python functions.

Every rule (the cases, how an answer is judged, shrinking, the reports, the flag table) is the C++
libraries' (kvoracle._core); this module turns Python arguments into theirs and their answers into
Python objects.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np

from . import _core

DEFAULT_SEED = 0x6B766F72  # the command line's default campaign seed


class Unsupported(Exception):
    """Raise it from a subject function for a configuration the kernel does not implement.

    The case counts as unsupported, not failed; a run whose every case is unsupported is not a pass.
    """


class SubjectError(Exception):
    """What a subject function raised, with its traceback: the case is failed-to-run."""


# Element types of call tensors (kvo/gpu/device_caches.hpp names) and of case-file tensors
# (safetensors names): the NumPy array that carries them (bf16 and fp8 as raw integer bits, since
# NumPy and DLPack cannot carry them everywhere) and torch's dtype name.
_CALL_TYPES = {
    "f32": (np.float32, "float32"),
    "fp16": (np.float16, "float16"),
    "bf16": (np.uint16, "bfloat16"),
    "fp8_e4m3": (np.uint8, "float8_e4m3fn"),
    "fp8_e5m2": (np.uint8, "float8_e5m2"),
    "i32": (np.int32, "int32"),
    "i64": (np.int64, "int64"),
    "u8": (np.uint8, "uint8"),
}
_FILE_TYPES = {
    "F32": "f32",
    "F16": "fp16",
    "BF16": "bf16",
    "F8_E4M3": "fp8_e4m3",
    "F8_E5M2": "fp8_e5m2",
    "I32": "i32",
    "I64": "i64",
    "U8": "u8",
}
_FILE_NAMES = {v: k for k, v in _FILE_TYPES.items()}


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is optional
        raise ImportError("kvoracle: this needs torch (pip install torch)") from e
    return torch


def raw_dtype(type_name: str):
    """The NumPy dtype that carries an element type ("bf16" -> uint16 bits)."""
    return np.dtype(_CALL_TYPES[type_name][0])


def torch_dtype(type_name: str):
    """torch's dtype of an element type ("fp8_e4m3" -> torch.float8_e4m3fn)."""
    return getattr(_torch(), _CALL_TYPES[type_name][1])


def as_torch(array, type_name: str, device=None):
    """A raw array (NumPy, or a DLPack array on the device) as a torch tensor of its real dtype,
    sharing memory where it can (a copy only when `device` differs)."""
    torch = _torch()
    if isinstance(array, torch.Tensor):
        t = array
    elif isinstance(array, np.ndarray):
        t = torch.from_numpy(array)
    else:
        try:
            t = torch.from_dlpack(array)
        except TypeError:  # a producer without the newer __dlpack__ keywords
            t = torch.utils.dlpack.from_dlpack(array.__dlpack__())
    if t.dtype != torch_dtype(type_name):
        t = t.view(torch_dtype(type_name))
    return t if device is None else t.to(device)


def to_raw_numpy(x, type_name: str, what: str) -> np.ndarray:
    """`x` (NumPy array, torch tensor of either the real or the raw dtype) as the raw NumPy array of
    `type_name`; ValueError naming `what` when its dtype is neither."""
    raw = raw_dtype(type_name)
    try:
        import torch  # noqa: F401

        if isinstance(x, torch.Tensor):
            t = x.detach()
            if t.dtype == torch_dtype(type_name) and t.dtype != getattr(torch, raw.name):
                t = t.view(getattr(torch, raw.name))
            x = t.cpu().numpy()
    except ImportError:
        pass
    a = np.asarray(x)
    if a.dtype != raw:
        raise ValueError(
            f"{what}: dtype {a.dtype} where {type_name} is expected "
            f"(as NumPy: {raw.name}{' bits' if raw.kind == 'u' and type_name != 'u8' else ''})"
        )
    return a


def _value(text: str):
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    return text


class Call:
    """One call of one op, as the subject function receives it.

    Attributes are the op's tensors (kvo/gpu/device_calls.hpp names: `k`, `v`, `index_k`,
    `slot_mapping`, `k_scale`, ..., the caches `k_cache`, `v_cache` in their layout's shape, `k_view`
    and `v_view` as [num_blocks, block_size, num_kv_heads, head_dim] views with the layout's strides,
    `index_cache`; the outputs `ids`, `out`, `q_out`), `config` (the model configuration: layout,
    block_size, kv_dtype, ...), `params` (read ops), `layer_kind`, `device` ("cpu" or "cuda") and
    `stream`. On the CPU the tensors are NumPy views, bf16 and fp8 as raw integer bits
    (`dtype(name)` says which); on CUDA they are torch tensors of their real dtypes. Every tensor is
    valid during the call only; the caches and outputs are written in place.
    """

    def __init__(self, raw: Dict[str, Any]):
        raw = dict(raw)
        self._types: Dict[str, str] = dict(raw.pop("dtypes"))
        self.config: Dict[str, Any] = {k: _value(v) for k, v in raw.pop("config").items()}
        cuda = raw["device"] == "cuda"
        self._names = []
        for name, value in raw.items():
            if cuda and name in self._types:
                value = as_torch(value, self._types[name])
            setattr(self, name, value)
            if name in self._types:
                self._names.append(name)

    def dtype(self, name: str) -> str:
        """The element type of tensor `name` ("bf16", "fp8_e4m3", "i64", ...)."""
        return self._types[name]

    def tensors(self) -> List[str]:
        """The names of the tensors this call has."""
        return list(self._names)

    def torch(self, name: str):
        """Tensor `name` as torch of its real dtype, sharing memory."""
        return as_torch(getattr(self, name), self._types[name])

    def __repr__(self):
        parts = [f"{n}: {self._types[n]} {list(getattr(self, n).shape)}" for n in self._names]
        return f"Call({getattr(self, 'op', '?')}; " + ", ".join(parts) + ")"


# The output each op's function may also return instead of writing it in place.
_OUTPUT = {"dense": "q_out", "indexer": "ids", "attention": "out"}

# False only in the test that proves the stream test can fail: the returned output is copied on
# torch's current stream after the call's stream block, unordered after the user's kernels (the
# race this package once had).
_STORE_ON_CALL_STREAM = True


def _store(call: Call, name: str, value) -> None:
    """Copies a function's returned answer into the call's output `name`, checking shape and dtype.
    On CUDA it runs on the call's stream (the caller's stream block), so that the copy is ordered
    after the kernels that produced `value`; kvoracle waits for that stream before it reads."""
    out = getattr(call, name)
    type_name = call.dtype(name)
    want = list(out.shape)
    if call.device == "cuda":
        torch = _torch()
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(np.asarray(value), device=out.device)
        if list(value.shape) != want or value.dtype != out.dtype:
            raise ValueError(
                f"returned {name} is {value.dtype} {list(value.shape)}; expected {out.dtype} {want}"
            )
        out.copy_(value)
        return
    a = to_raw_numpy(value, type_name, f"returned {name}")
    if list(a.shape) != want:
        raise ValueError(f"returned {name} has shape {list(a.shape)}; expected {want}")
    out[...] = a


def _out_of_device_memory(e: BaseException) -> bool:
    """Whether `e` is torch's CUDA out-of-memory error (torch only when already imported)."""
    torch = sys.modules.get("torch")
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    return oom is not None and isinstance(e, oom)


def _wrap(fn: Callable, op: str) -> Callable:
    """The function the core calls: the raw call made a Call, the user's function run (on the call's
    stream on CUDA), a returned answer stored."""

    def run(raw):
        try:
            call = Call(raw)
            returns = op in _OUTPUT
            if call.device == "cuda":
                torch = _torch()
                # The function and the copy of what it returns both on the call's stream: the
                # copy after the function's kernels, kvoracle's read (a wait for this stream and
                # the device) after the copy.
                with torch.cuda.stream(torch.cuda.ExternalStream(call.stream)):
                    result = fn(call)
                    if result is not None and returns and _STORE_ON_CALL_STREAM:
                        _store(call, _OUTPUT[op], result)
                if result is not None and returns and not _STORE_ON_CALL_STREAM:
                    _store(call, _OUTPUT[op], result)
            else:
                result = fn(call)
                if result is not None and returns:
                    _store(call, _OUTPUT[op], result)
        except Unsupported:
            raise
        except Exception as e:
            if _out_of_device_memory(e):
                # Another process (a parallel test run) holds the device's memory: the case is
                # skipped, as kvoracle's own allocations report it, not the kernel's failure.
                raise Unsupported(f"skipped: the function ran out of device memory: "
                                  f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                                  ) from None
            # The report carries the function's own frames, not the campaign's.
            frames = traceback.format_exception(type(e), e, e.__traceback__.tb_next)
            raise SubjectError("".join(frames).rstrip()) from None

    return run


def _flags(overrides: Mapping[str, Any], where: str) -> List[str]:
    """Keyword overrides (block_size=16, layout="hnd", per_head_scale=True) as the command line's
    flags; TypeError naming an unknown one."""
    known = set(_core.case_flag_names())
    flags: List[str] = []
    for key, value in overrides.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if flag not in known:
            names = ", ".join(sorted(f[2:].replace("-", "_") for f in known))
            raise TypeError(f"{where}: unknown override {key!r}; known: {names}")
        if isinstance(value, bool):
            value = "true" if value else "false"
        flags += [flag, str(value)]
    return flags


def _int(where: str, name: str, value, minimum: int = 0, maximum: int = 2**64 - 1) -> int:
    """`value` as an int in [minimum, maximum]; TypeError or ValueError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{where}: {name} must be an int, not {type(value).__name__}")
    if not minimum <= int(value) <= maximum:
        raise ValueError(f"{where}: {name} = {value} is outside [{minimum}, {maximum}]")
    return int(value)


def _test_file(relative: str) -> str:
    """The absolute path of the running test file whose path ends in `relative` (pytest names a
    node relative to its rootdir, which need not be the current directory): the caller's frame
    whose file it is; `relative` itself when none is."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if os.path.isabs(name) and name.replace(os.sep, "/").endswith("/" + relative):
            return name
        frame = frame.f_back
    return relative


def _rerun_command() -> str:
    """How to rerun the running test, runnable from any directory: the pytest node (its file by
    absolute path) when pytest runs it, else this script; PYTHONPATH in front when it is set (a
    build tree's package is found through it)."""
    current = os.environ.get("PYTEST_CURRENT_TEST")
    if current:
        node = current.rsplit(" ", 1)[0]
        path, sep, rest = node.partition("::")
        words = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                 _test_file(path) + sep + rest]
    else:
        script = sys.argv[0] if sys.argv else ""
        # A script by its absolute path; `python -c ...` or an interactive session as it is.
        words = [sys.executable] + ([os.path.abspath(script)] if os.path.isfile(script)
                                    else [script] if script else []) + sys.argv[1:]
    command = " ".join(shlex.quote(a) for a in words)
    pythonpath = os.environ.get("PYTHONPATH")
    if pythonpath:
        paths = os.pathsep.join(os.path.abspath(p) for p in pythonpath.split(os.pathsep) if p)
        command = f"PYTHONPATH={shlex.quote(paths)} {command}"
    return command


@dataclass
class Report:
    """A campaign's verdict: `passed`, the campaign `seed`, `outcome` ("pass", "mismatch",
    "failed-to-run", "invalid-input", or "not judged": a subject that could not run here, such as
    device="cuda" without a GPU, or whose every case was unsupported), and `message`: the report
    (the summary with every class of failure, its count and a case; for a failure each failing
    case's seed, first mismatch with coordinates and both values, the line that replays it in this
    test, and the case shrunk with its own line)."""

    passed: bool
    seed: int
    message: str
    outcome: str = "pass"

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return self.message


@dataclass
class _Subject:
    name: str
    functions: Any
    device: str
    ordering: str
    topk_order: str
    profile: str
    ops: List[str]
    overrides: Dict[str, Any] = field(default_factory=dict)


def _subject(fn, op, name, device, ordering, topk_order, profile, write, dense, indexer,
             attention, overrides, where) -> _Subject:
    given = {"write": write, "dense": dense, "indexer": indexer, "attention": attention}
    if fn is not None:
        ops = [op] if isinstance(op, str) else list(op or [])
        if len(ops) != 1:
            raise TypeError(f"{where}: a function needs exactly one op (op='write', ...)")
        if ops[0] not in given:
            raise ValueError(f"{where}: unknown op {ops[0]!r}; known: {', '.join(given)}")
        if given[ops[0]] is not None:
            raise TypeError(f"{where}: the {ops[0]} function is given twice")
        given[ops[0]] = fn
    ops = [o for o, f in given.items() if f is not None]
    if not ops:
        raise TypeError(f"{where}: no function given (fn with op=, or write=, indexer=, ...)")
    implied: Dict[str, Any] = {}
    for o in ops:
        f = given[o]
        if not callable(f):
            raise TypeError(f"{where}: the {o} function is {type(f).__name__}, not callable")
        implied.update(getattr(f, "overrides", {}) or {})
        ordering = ordering or getattr(f, "ordering", None)
        topk_order = topk_order or getattr(f, "topk_order", None)
        profile = profile or getattr(f, "profile", None)
    functions = _core._Functions()
    functions.unsupported = Unsupported
    for o in ops:
        setattr(functions, o, _wrap(given[o], o))
    if device not in ("cpu", "cuda"):
        raise ValueError(f"{where}: device {device!r}; expected 'cpu' or 'cuda'")
    first = given[ops[0]]
    name = name or getattr(first, "__name__", None) or type(first).__name__
    return _Subject(name, functions, device, ordering or "canonical",
                    topk_order or "ascending_ids", profile or "fp32", ops,
                    {**implied, **overrides})


def check(fn: Optional[Callable] = None, *, op: Optional[str] = None, cases: int = 200,
          seed: int = DEFAULT_SEED, case_seed: Optional[int] = None, device: str = "cpu",
          name: Optional[str] = None, ordering: Optional[str] = None,
          topk_order: Optional[str] = None, profile: Optional[str] = None, write=None, dense=None,
          indexer=None, attention=None, jobs: int = 0, shrink: bool = True,
          fail_fast: bool = False, time_budget: Optional[float] = None,
          **overrides) -> Report:
    """Judges a kernel against kvoracle's reference over `cases` random cases from `seed` (the
    KVO_SEED, KVO_CASES and KVO_CASE_SEED environment variables override them, as in C++ tests).

    `fn` implements `op` ("write", "dense", "indexer", "attention"); or give one function per op as
    write=..., indexer=... Each receives a `Call` and writes the caches (and the output) in place,
    or returns the output. `device="cuda"` runs it on the GPU with torch tensors. `ordering`
    ("canonical": bit for bit; "foreign": against the float64 truth), `topk_order` and `profile`
    declare how a foreign kernel computes; an adapter (kvoracle.adapters) declares them and the
    modes its engine implies. `**overrides` fix a dimension as the command line's flags do
    (block_size=16, layout="hnd", kv_dtype="fp8_e4m3", layers="2D", ...).

    As `kvoracle check` takes them: `jobs` (threads that draw cases and the reference's answers;
    0: one per core), `shrink` (a failing case shrunk to a small one that fails the same way;
    False skips it), `fail_fast` (stop at the first case that does not pass) and `time_budget`
    (seconds after which no new case is drawn; None: no limit).
    """
    s = _subject(fn, op, name, device, ordering, topk_order, profile, write, dense, indexer,
                 attention, overrides, "kvoracle.check")
    where = "kvoracle.check"
    if not isinstance(shrink, bool) or not isinstance(fail_fast, bool):
        raise TypeError(f"{where}: shrink and fail_fast must be bool")
    budget = 0.0
    if time_budget is not None:
        if isinstance(time_budget, bool) or not isinstance(time_budget, (int, float)):
            raise TypeError(f"{where}: time_budget must be a number of seconds or None")
        if not time_budget > 0:
            raise ValueError(f"{where}: time_budget = {time_budget} must be > 0 (None: no limit)")
        budget = float(time_budget)
    passed, used_seed, message, outcome = _core.check(
        s.name, s.functions, s.device, s.ordering, s.topk_order, s.profile, s.ops,
        _int(where, "cases", cases, 1, 2**63 - 1), _int(where, "seed", seed),
        None if case_seed is None else _int(where, "case_seed", case_seed),
        _flags(s.overrides, where), _rerun_command(), _int(where, "jobs", jobs, 0, 4096),
        shrink, fail_fast, budget)
    return Report(bool(passed), int(used_seed), message, outcome)


def assert_passes(fn: Optional[Callable] = None, **kwargs) -> Report:
    """check(fn, **kwargs), raising AssertionError with the SPEC 7 report unless it passed; pytest
    shows the report as the failure. Returns the report (its message names the seed on a pass)."""
    __tracebackhide__ = True  # pytest: the failure points at the user's test, not at kvoracle
    report = check(fn, **kwargs)
    if not report.passed:
        raise AssertionError(report.message)
    return report


@dataclass
class ModeResult:
    """Mode detection of one op: `matched` lists every mode combination that matched every case
    ("saturation=satfinite scale_mode=divide ..."), tightest first; `report` is the full text."""

    op: str
    outcome: str
    matched: List[str]
    report: str


def detect_modes(fn: Optional[Callable] = None, *, op: Optional[str] = None, cases: int = 64,
                 seed: int = DEFAULT_SEED, device: str = "cpu", name: Optional[str] = None,
                 ordering: Optional[str] = None, topk_order: Optional[str] = None,
                 profile: Optional[str] = None, write=None, dense=None, indexer=None,
                 attention=None, **overrides) -> List[ModeResult]:
    """Which of the contract's modes the kernel implements (SPEC 7), per op with modes: the kernel
    runs once per case, told the pinned modes, and its answer is judged under every combination."""
    s = _subject(fn, op, name, device, ordering, topk_order, profile, write, dense, indexer,
                 attention, overrides, "kvoracle.detect_modes")
    where = "kvoracle.detect_modes"
    out = _core.detect(s.name, s.functions, s.device, s.ordering, s.topk_order, s.profile, s.ops,
                       _int(where, "cases", cases, 1, 2**63 - 1), _int(where, "seed", seed),
                       _flags(s.overrides, where))
    return [ModeResult(o, outcome, _declared_first(list(matched), s.overrides), report)
            for o, outcome, matched, report in out]


# The override keys that are detection axes, by the name detection prints them under (the mode
# rows of the C++ table of write dimensions).
_DETECTION_AXES = {flag[2:].replace("-", "_"): axis for flag, axis in _core.mode_axes()}


def _declared_first(matched: List[str], declared: Mapping[str, Any]) -> List[str]:
    """The combinations that agree with more of the declared modes (an adapter's engine, the
    user's overrides) first, tightest first among equals: where several modes match, the engine's
    own is named first (a Triton `/`: div_approx before the mul_recip it happened to equal)."""
    want = {axis: str(declared[key]).lower() for key, axis in _DETECTION_AXES.items()
            if key in declared}

    def disagreement(combination: str) -> int:
        values = dict(t.split("=", 1) for t in combination.split() if "=" in t)
        return -sum(values.get(axis) == value for axis, value in want.items())

    return sorted(matched, key=disagreement)


class Case:
    """One case of one op as arrays: what `kvoracle case emit` writes (`file`, safetensors bytes;
    `save(path)` writes it). `inputs` and `caches` hold the case (`input.*`, `cache.*`), `expected`
    the reference's answer, by name without its prefix; `metadata` the configuration and modes. bf16
    and fp8 tensors are raw integer bits: `dtype(name)` names them, `to_torch(device)` converts."""

    def __init__(self, file: bytes):
        self.file = bytes(file)
        metadata, tensors = _core.read_tensors(self.file)
        self.metadata: Dict[str, str] = dict(metadata)
        self.op: str = self.metadata["op"]
        self.seed: int = int(self.metadata["case_seed"], 16)
        self.tensors: Dict[str, np.ndarray] = {}
        self._types: Dict[str, str] = {}
        for tname, dtype, shape, data in tensors:
            t = _FILE_TYPES[dtype]
            self._types[tname] = t
            self.tensors[tname] = np.frombuffer(data, dtype=raw_dtype(t)).reshape(shape)

    def _part(self, prefix: str) -> Dict[str, np.ndarray]:
        return {n[len(prefix):]: a for n, a in self.tensors.items() if n.startswith(prefix)}

    @property
    def inputs(self) -> Dict[str, np.ndarray]:
        return self._part("input.")

    @property
    def caches(self) -> Dict[str, np.ndarray]:
        return self._part("cache.")

    @property
    def expected(self) -> Dict[str, np.ndarray]:
        return self._part("expected.")

    def dtype(self, name: str) -> str:
        return self._types[name]

    def to_torch(self, device="cpu") -> Dict[str, Any]:
        """Every tensor as torch of its real dtype on `device` (copies)."""
        return {n: as_torch(a.copy(), self._types[n], device) for n, a in self.tensors.items()}

    def save(self, path) -> None:
        with open(path, "wb") as f:
            f.write(self.file)

    @classmethod
    def load(cls, path) -> "Case":
        with open(path, "rb") as f:
            return cls(f.read())


def emit_case(op: str, seed: int, **overrides) -> Case:
    """Case `seed` of `op` (as `kvoracle check --case-seed` draws it) under the overrides.
    Raises Unsupported for a case no file can hold (a huge cache: `kvoracle check` judges those)."""
    where = "kvoracle.emit_case"
    try:
        return Case(_core.emit_case(op, _int(where, "seed", seed), _flags(overrides, where)))
    except NotImplementedError as e:
        raise Unsupported(str(e)) from None


@dataclass
class Judgement:
    """A result judged: `outcome` ("pass", "mismatch", ...), `exit_status` (the command line's 0, 1,
    2, 3), `report` (SPEC 7), `result_file` (what `kvoracle judge CASE RESULT` reads)."""

    outcome: str
    exit_status: int
    report: str
    result_file: bytes

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    def __bool__(self) -> bool:
        return self.passed


def judge(case: Case, result: Mapping[str, Any], *, subject: str = "python",
          ordering: str = "canonical", topk_order: str = "ascending_ids",
          profile: str = "fp32") -> Judgement:
    """Judges `result` (the case's `expected` names without the prefix, each a NumPy array or torch
    tensor of its dtype) as `kvoracle judge` does. A missing, extra, or wrongly typed or shaped
    tensor is ValueError naming it."""
    expected = case.expected
    unknown = sorted(set(result) - set(expected))
    if unknown:
        raise ValueError(f"kvoracle.judge: result tensor {unknown[0]!r} is not one of the case's "
                         f"({', '.join(sorted(expected))})")
    tensors = []
    for tname, want in expected.items():
        if tname not in result:
            raise ValueError(f"kvoracle.judge: result tensor {tname!r} is missing")
        t = case.dtype("expected." + tname)
        a = to_raw_numpy(result[tname], t, f"kvoracle.judge: result tensor {tname!r}")
        if a.shape != want.shape:
            raise ValueError(f"kvoracle.judge: result tensor {tname!r} has shape {list(a.shape)}; "
                             f"expected {list(want.shape)}")
        tensors.append((tname, _FILE_NAMES[t], list(a.shape), np.ascontiguousarray(a).tobytes()))
    outcome, status, report, file = _core.judge(case.file, tensors, subject, ordering, topk_order,
                                                profile)
    return Judgement(outcome, int(status), report, bytes(file))
