"""`kvoracle engines` (python -m kvoracle.engines): the installed engines found by package and import
path, each kernel judged through its adapter, absent engines listed as absent. Here the engines are
fake packages in a temporary folder whose kernels are the NumPy stand-ins with the real signatures
(engines_numpy); on the device the same command judges the real ones."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

# module path -> source; each package gets a dist-info so that importlib.metadata finds its version.
FAKE_ENGINES = {
    "vllm": ("0.0.1+standin", {
        "vllm/__init__.py": "",
        "vllm/_custom_ops.py": """
            import engines_numpy as eng
            from kvoracle import Unsupported

            def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
                                        kv_cache_dtype, k_scale, v_scale):
                if kv_cache_dtype != "auto":
                    raise Unsupported("the stand-in stores the model dtype only")
                eng.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
                                            kv_cache_dtype, k_scale, v_scale)
            """,
    }),
    "tensorrt_llm": ("0.0.2+standin", {
        # As a real engine's package: its __init__ needs what this machine lacks (the C++
        # runtime); the kernel files need only what the kernels use, and load alone.
        "tensorrt_llm/__init__.py": "raise ImportError('tensorrt_llm needs its C++ runtime')\n",
        "tensorrt_llm/_torch/__init__.py": "",
        "tensorrt_llm/_torch/attention_backend/__init__.py": "",
        "tensorrt_llm/_torch/attention_backend/sparse/__init__.py": "",
        "tensorrt_llm/_torch/attention_backend/sparse/minimax_m3/__init__.py": "",
        "tensorrt_llm/_torch/attention_backend/sparse/minimax_m3/msa_scatter.py":
            "from engines_numpy import fused_write_layer_caches\n",
        "tensorrt_llm/_torch/attention_backend/sparse/minimax_m3/common.py":
            "from engines_numpy import write_kv_slots\n",
    }),
}


def _install(root, only=None):
    for dist, (version, files) in FAKE_ENGINES.items():
        if only is not None and dist not in only:
            continue
        for path, source in files.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(textwrap.dedent(source))
        info = os.path.join(root, f"{dist}-{version}.dist-info")
        os.makedirs(info, exist_ok=True)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")


def _run(root, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), HERE] + sys.path)
    return subprocess.run([sys.executable, "-m", "kvoracle.engines", "--device", "cpu", *args],
                          capture_output=True, text=True, env=env, cwd=str(root), timeout=600)


def test_installed_engines_are_judged_and_the_absent_listed(tmp_path):
    _install(tmp_path)
    out = _run(tmp_path, "--cases", "20", "--json", "rows.json", "--junit", "engines.xml")
    print(out.stdout + out.stderr)
    rows = {(r["engine"], r["kernel"], r["configuration"]): r
            for r in json.load(open(tmp_path / "rows.json"))}
    cuda_op = rows[("vllm", "reshape_and_cache_flash (CUDA op)", "auto")]
    assert cuda_op["verdict"] == "pass" and cuda_op["version"] == "0.0.1+standin"
    assert "slot_type=i64" in cuda_op["modes"]
    # A configuration every case of which the kernel declines is not judged, never a pass.
    assert rows[("vllm", "reshape_and_cache_flash (CUDA op)", "fp8")]["verdict"] == "not judged"
    # This version has no such kernel: unavailable, with the import that failed.
    mla = rows[("vllm", "concat_and_cache_mla", "auto")]
    assert mla["verdict"] == "unavailable" and "concat_and_cache_mla" in mla["detail"]
    # Judged although `import tensorrt_llm` fails: its kernel file loaded alone. The head dims it
    # declines (not powers of two) are said, with their count.
    fused = rows[("tensorrt_llm", "fused_write_layer_caches", "bf16")]
    assert fused["verdict"] == "pass", fused
    assert re.match(r"\d+ cases: fused_write_layer_caches declined the call", fused["left_out"])
    # The torch fallback's -1 wrap (the vllm#43810 class) is caught, with its first mismatch.
    fallback = rows[("tensorrt_llm", "write_kv_slots (torch fallback)", "bf16")]
    assert fallback["verdict"] == "mismatch" and fallback["detail"], fallback
    # ... and detection names what it does instead: the -1 padding wraps.
    assert "slot_mode=legacy_wrap" in fallback["detected"], fallback
    assert "modes detected, write_kv_slots (torch fallback) [bf16]:" in out.stdout
    for engine in ("sglang", "flashinfer"):
        assert all(r["verdict"] == "absent" for k, r in rows.items() if k[0] == engine)
    assert out.returncode == 1, out.stdout
    xml = (tmp_path / "engines.xml").read_text()
    assert 'failures="1"' in xml and "<skipped message=\"absent" in xml
    assert "write_kv_slots (torch fallback)" in out.stdout


def test_exit_status_passes_and_nothing_to_judge(tmp_path):
    _install(tmp_path, only={"vllm"})
    assert _run(tmp_path, "--cases", "10", "--engine", "vllm").returncode == 0
    nothing = _run(tmp_path, "--cases", "10", "--engine", "sglang")
    assert nothing.returncode == 3, nothing.stdout
    assert "absent" in nothing.stdout
    assert _run(tmp_path, "--cases", "0").returncode == 2  # argparse's usage error


def test_without_a_gpu_an_installed_engine_is_not_judged(tmp_path, monkeypatch):
    """No device to run on (device "none": what a machine without a GPU defaults to): an installed
    engine's kernels are not judged, exit 3, never a pass."""
    import importlib

    from kvoracle import engines

    _install(tmp_path, only={"vllm"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(HERE)
    importlib.invalidate_caches()
    rows = engines.judge_installed(cases=5, device="none",
                                   kernels=[k for k in engines.ENGINE_KERNELS
                                            if k.engine == "vllm"][:1])
    assert [r.verdict for r in rows] == ["not judged", "not judged"], rows
    assert rows[0].version == "0.0.1+standin" and "no GPU" in rows[0].detail
    assert engines.exit_status(rows) == 3


def test_the_pytest_entry_judges_what_is_installed(tmp_path):
    """`pytest --pyargs kvoracle.test_installed_engines`: a test per engine kernel, the absent and
    unavailable skipped, the torch fallback's -1 wrap a failure with kvoracle's report."""
    _install(tmp_path)
    env = dict(os.environ, KVO_ENGINES_DEVICE="cpu", KVO_CASES="20",
               PYTHONPATH=os.pathsep.join([str(tmp_path), HERE] + sys.path))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          "--pyargs", "kvoracle.test_installed_engines"], capture_output=True,
                         text=True, env=env, cwd=str(tmp_path), timeout=600)
    print(out.stdout[-3000:])
    # vllm's CUDA op and TensorRT-LLM's fused write pass; the fallback fails; 3 vllm kernels this
    # version lacks and the 3 absent engines' are skipped.
    assert "1 failed, 2 passed, 6 skipped" in out.stdout, out.stdout
    assert "write_kv_slots" in out.stdout and "first:" in out.stdout
    assert out.returncode == 1
