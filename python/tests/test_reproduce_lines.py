"""Every reproduce line kvoracle prints runs as printed, from any directory, and replays its case:
a failing pytest's lines (the case's, and the shrunk case's with its reductions), a plain script's,
and the command line's (`kvoracle check` and its shrunk case, `kvoracle judge` of case files).
Each line is taken from real output and run through the shell, as a user pastes it."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import kvoracle

# A -1 slot wraps onto the last block (numpy's negative index): vllm#43810's class.
BUGGY_MODULE = '''
import numpy as np
import kvoracle

MODES = dict(act_dtype="bf16", kv_dtype="bf16", scale_mode="none", slot_mode="strict", layers="2D")


def wrapping_write(call):
    tokens = call.slot_mapping.shape[0]
    bs = call.config["block_size"]
    s = call.slot_mapping[:tokens]
    call.k_view[s // bs, s % bs] = call.k[:tokens]
    call.v_view[s // bs, s % bs] = call.v[:tokens]
'''

PYTEST_FILE = BUGGY_MODULE + '''

def test_wrapping_write():
    kvoracle.assert_passes(wrapping_write, op="write", cases=100, **MODES)
'''

SCRIPT_FILE = BUGGY_MODULE + '''
print(kvoracle.check(wrapping_write, op="write", cases=100, **MODES).message)
'''


def clean_env():
    """This process's environment without the variables a reproduce line sets, PYTHONPATH made
    absolute (the runs start in other directories)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVO_")
           and k != "PYTEST_CURRENT_TEST"}
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p)
                                            for p in env["PYTHONPATH"].split(os.pathsep) if p)
    return env


def run(line, cwd, env=None):
    """`line` through the shell in `cwd`: (exit status, stdout and stderr, "E   " prefixes of
    pytest's failure text removed)."""
    p = subprocess.run(["bash", "-c", line], cwd=cwd, env=env or clean_env(),
                       capture_output=True, text=True, timeout=600)
    out = re.sub(r"(?m)^E {3}", "", p.stdout + p.stderr)
    return p.returncode, out


def reproduce_lines(text):
    """The case's and the shrunk case's reproduce lines of a report: (case line, shrunk line)."""
    first = re.search(r"(?m)^reproduce in this test \([^)]*\): (.*)$", text)
    shrunk_part = text[text.index("shrunk failure of"):]
    shrunk = re.search(r"(?m)^reproduce: (.*)$", shrunk_part)
    assert first and shrunk, text
    return first.group(1), shrunk.group(1)


def first_mismatch(text):
    return re.search(r"(?m)^ *first: (layer .*)$", text).group(1)


def check_lines_replay(text, elsewhere, failing_status, env=None):
    """Runs the case's and the shrunk case's lines of report `text` in directory `elsewhere`
    (environment `env`, else this one's less KVO_*): each exits with `failing_status` (None: any
    but 0) and fails on exactly its case."""
    case_line, shrunk_line = reproduce_lines(text)
    seed = re.search(r"KVO_CASE_SEED=(0x[0-9A-F]{16})", case_line).group(1)
    assert "KVO_CASE_REDUCTIONS=write:" in shrunk_line, shrunk_line
    shrunk_text = text[text.index("shrunk failure of"):]
    for line, must_show in ((case_line, f"case 0 seed {seed}"),
                            (shrunk_line, first_mismatch(shrunk_text))):
        status, out = run(line, elsewhere, env)
        assert status != 0 if failing_status is None else status == failing_status, out
        assert "result: mismatch" in out and "1 cases in" in out, out
        assert must_show in out, (line, out)


def test_a_failing_pytest_prints_lines_that_replay_its_case_and_its_shrunk_case(tmp_path):
    tests = tmp_path / "suite"
    tests.mkdir()
    (tests / "test_user_kernel.py").write_text(PYTEST_FILE)
    status, out = run(f"{shlex.quote(sys.executable)} -m pytest -p no:cacheprovider -q "
                      f"--tb=short suite/test_user_kernel.py", tmp_path)
    assert status == 1, out
    assert "kvoracle check --case-seed" not in out, out  # no line for a subject it cannot run
    check_lines_replay(out, "/", None)


def test_a_script_prints_lines_that_replay_its_case(tmp_path):
    script = tmp_path / "judge_my_kernel.py"
    script.write_text(SCRIPT_FILE)
    status, out = run(f"{shlex.quote(sys.executable)} {shlex.quote(script.name)}", tmp_path)
    assert status == 0, out
    assert "result: mismatch" in out, out
    check_lines_replay(out, "/", 0)


def test_a_failing_googletest_prints_lines_that_replay_its_case(tmp_path):
    """The GoogleTest helper's lines: `KVO_CASE_SEED=S <binary> --gtest_filter=Suite.Test`, and the
    shrunk case's with KVO_CASE_REDUCTIONS (a planted failure in tests/oracle/test_testing)."""
    exe = Path(kvoracle.__file__).resolve().parents[2] / "tests" / "oracle" / "test_testing"
    if not exe.is_file():
        pytest.skip("no test_testing binary beside this package (an installed wheel)")
    env = dict(clean_env(), KVO_PLANTED_FAILURE="1")
    status, out = run(f"{exe} --gtest_filter=TestingHelperPlanted.FailsWithLinesThatReplayIt",
                      tmp_path, env)
    assert status == 1, out
    assert "--gtest_filter=TestingHelperPlanted.FailsWithLinesThatReplayIt" in out, out
    check_lines_replay(out, "/", 1, env)


def cli():
    """The build tree's command line (build/cli/kvoracle beside build/python/kvoracle)."""
    path = Path(kvoracle.__file__).resolve().parents[2] / "cli" / "kvoracle"
    if not path.is_file():
        pytest.skip("no kvoracle command line beside this package (an installed wheel)")
    return path


def test_the_command_line_prints_lines_that_replay_its_cases(tmp_path):
    exe = cli()
    env = dict(clean_env(), PATH=f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    status, out = run("kvoracle check --subject minus-one-wraps --ops write --cases 40 --jobs 1",
                      tmp_path, env)
    assert status == 1, out
    lines = re.findall(r"(?m)^reproduce: (kvoracle check .*)$", out)
    assert len(lines) == 2, out  # the first failure's and the shrunk case's
    for line, part in zip(lines, [out[out.index("first failure of"):],
                                  out[out.index("shrunk failure of"):]]):
        status, again = run(line, "/", env)
        assert status == 1, again
        assert first_mismatch(part) in again, (line, again)

    # A case file judged: its lines (the campaign's, and judging the files again) replay it.
    seed = re.search(r"--case-seed (0x[0-9A-F]{16})", lines[0]).group(1)
    flags = lines[0].split(" --ops write", 1)[1]
    status, out = run(f"kvoracle case emit --op write --case-seed {seed}{flags} -o case.st && "
                      "kvoracle case run case.st --subject minus-one-wraps -o result.st && "
                      "kvoracle judge case.st result.st", tmp_path, env)
    assert status == 1, out
    judged = re.search(r"(?m)^reproduce: (.*)\n\s+or: (.*)$", out)
    assert judged, out
    status, again = run(judged.group(1), "/", env)
    assert status == 1 and first_mismatch(out) in again, again
    status, again = run(judged.group(2), tmp_path, env)
    assert status == 1 and first_mismatch(out) in again, again
