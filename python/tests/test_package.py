"""The package as a user installs it: one version everywhere, the pytest plugin's options reaching
every kvoracle.check of a run."""

import os
import re
import subprocess
import sys
import textwrap

import kvoracle

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_one_version_everywhere():
    """CMakeLists.txt's project() is the version; the module, pyproject.toml and the CLI say it."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        cmake = re.search(r"^project\(kvoracle VERSION ([0-9.]+)", f.read(), re.M)[1]
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        pyproject = re.search(r'^version = "([^"]+)"', f.read(), re.M)[1]
    assert kvoracle.__version__ == cmake == pyproject


def test_the_package_says_it_is_typed():
    assert os.path.isfile(os.path.join(ROOT, "python", "kvoracle", "py.typed"))


def test_the_pytest_plugin_sets_cases_and_seed_for_the_run(tmp_path):
    (tmp_path / "test_user.py").write_text(textwrap.dedent("""
        import kvoracle
        import engines_numpy as eng
        from kvoracle import adapters

        def test_write():
            r = kvoracle.check(adapters.vllm_reshape_and_cache_flash(eng.reshape_and_cache_flash),
                               op="write", cases=500)
            assert r.passed
            line = next(x for x in r.message.splitlines() if x.startswith("kvoracle check:"))
            print("REPORT", r.seed, line)
        """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__)] + sys.path))
    for name in ("KVO_CASES", "KVO_SEED", "KVO_CASE_SEED"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider",
                          "-p", "kvoracle.pytest_plugin", "--kvo-cases", "7", "--kvo-seed",
                          "0x1234", "test_user.py"], capture_output=True, text=True, env=env,
                         cwd=str(tmp_path), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"kvoracle {kvoracle.__version__}: campaign seed 0x1234, cases 7" in out.stdout
    assert "REPORT 4660 kvoracle check: seed 0x0000000000001234, 7 cases" in out.stdout, out.stdout


def test_a_failing_assert_passes_points_at_the_users_test(tmp_path):
    """kvoracle's own frames are hidden from pytest's traceback: the failure shows the user's line
    and kvoracle's report, not assert_passes's body."""
    (tmp_path / "test_user.py").write_text(textwrap.dedent("""
        import functools
        import kvoracle
        import engines_numpy as eng
        from kvoracle import adapters

        def test_write():
            buggy = functools.partial(eng.reshape_and_cache_flash, skip_negative=False)
            kvoracle.assert_passes(adapters.vllm_reshape_and_cache_flash(buggy), op="write",
                                   cases=30, shrink=False)
        """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__)] + sys.path))
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_user.py"],
                         capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert out.returncode == 1, out.stdout
    assert "kvoracle.assert_passes(adapters.vllm_reshape_and_cache_flash(buggy)" in out.stdout
    assert "raise AssertionError(report.message)" not in out.stdout, out.stdout
    assert "first: layer" in out.stdout


def test_the_fp8_e4m3_codec():
    """kvoracle.bits: every finite e4m3 code round-trips; ties go to the even code; past 448
    saturates (satfinite); NaN is 0x7F; the sign of -0 is kept."""
    import numpy as np

    from kvoracle.bits import float32_to_fp8_e4m3, fp8_e4m3_to_float32

    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    values = fp8_e4m3_to_float32(codes)
    assert (float32_to_fp8_e4m3(values) == codes).all()
    assert np.isnan(fp8_e4m3_to_float32(np.array([0x7F, 0xFF], dtype=np.uint8))).all()
    x = np.array([1.0625, 1.1875, 2.0**-10, 3 * 2.0**-11, 449.0, 1e30, -1e30, -0.0, np.nan],
                 dtype=np.float32)
    # 1.0625: between 1.0 (0x38) and 1.125 (0x39), to the even 0x38; 1.1875 to 1.25 (0x3A);
    # 2^-10: half the smallest subnormal, to +0; 0.75 * 2^-9 up to it (0x01).
    assert float32_to_fp8_e4m3(x).tolist() == [0x38, 0x3A, 0x00, 0x01, 0x7E, 0x7E, 0xFE, 0x80,
                                               0x7F]
