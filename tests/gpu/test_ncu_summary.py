"""gpu/ncu_summary.py, the profile stage's table: a launch of a captured ncu log (trimmed from
session 35's profile of the fused write, data/ncu_write_divide_1.txt) read back figure by figure,
and the parser fuzzed: any text, and any cut or edit of the captured log, parses without raising."""
import os
import subprocess
import sys

from hypothesis import given, settings, strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "gpu", "ncu_summary.py")
LOG = os.path.join(HERE, "data", "ncu_write_divide_1.txt")
sys.path.insert(0, os.path.join(ROOT, "gpu"))

import ncu_summary  # noqa: E402

with open(LOG) as f:
    CAPTURED = f.read()


def test_the_captured_launch_reads_back_figure_by_figure():
    (k,) = ncu_summary.parse(CAPTURED)
    assert k["name"] == "fused_write_decode_kernel<1, 3, 0, 3, 0>(FusedParams)"
    assert (k["grid"], k["block"], k["registers"]) == ("1x1x1", "160", "58")
    assert k["metrics"] == {
        "DRAM Throughput": "0.30", "Duration": "3.42", "Executed Ipc Active": "0.34",
        "Issue Slots Busy": "0.03", "Warp Cycles Per Issued Instruction": "13.87",
        "Executed Instructions": "1,155", "Achieved Occupancy": "7.41"}
    ops = dict(k["opcodes"])
    # ncu wraps the list over lines, a count apart from its opcode at times: every one is counted.
    assert sum(ops.values()) == 1155 and "opcodes_short" not in k
    assert (ops["IMAD"], ops["FFMA"]) == (204, 152)
    assert sum(v for _, v in k["categories"]) == 1155
    assert dict(k["categories"])["Integer"] == 518
    # The table of % of peak instructions executed, its 15 rows and no row of another table.
    pipes = dict(k["pipes"])
    assert len(k["pipes"]) == 15 and (pipes["ADU"], pipes["FMA"], pipes["XU"]) == (0.02, 0.01, 0.0)


def test_a_list_that_does_not_add_up_is_flagged():
    cut = CAPTURED.replace("IMAD: 204;", "IMAD: 203;")
    (k,) = ncu_summary.parse(cut)
    assert k.get("opcodes_short") is True


def test_the_command_prints_the_mix_and_names_an_unreadable_log():
    out = subprocess.run([sys.executable, SCRIPT, LOG, "--top", "3"], capture_output=True,
                         text=True, check=True).stdout
    assert "mix: IMAD 17.7%, FFMA 13.2%, ISETP 8.1%" in out
    assert "58 registers" in out and "duration 3.42 us" in out
    bad = subprocess.run([sys.executable, SCRIPT, os.path.join(HERE, "data", "no_such.txt")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "cannot read" in bad.stderr and "no_such.txt" in bad.stderr


@settings(derandomize=True, max_examples=300, deadline=None, database=None)
@given(st.text(alphabet=st.sampled_from(list(" ()x,:;%0123456789.-\nvoidABCDEFGHIJKLMNOPQRSTUVWXYZ")),
               max_size=400))
def test_any_text_parses_without_raising(text):
    for k in ncu_summary.parse(text):
        assert {"name", "grid", "block", "metrics"} <= set(k)


@settings(derandomize=True, max_examples=300, deadline=None, database=None)
@given(st.lists(st.sampled_from(CAPTURED.splitlines()), max_size=60))
def test_the_captured_lines_in_any_order_and_number_parse_without_raising(lines):
    ncu_summary.parse("\n".join(lines))


@settings(derandomize=True, max_examples=300, deadline=None, database=None)
@given(st.integers(0, len(CAPTURED)), st.integers(0, len(CAPTURED)), st.text(max_size=20))
def test_any_cut_or_edit_of_the_captured_log_parses_without_raising(a, b, insert):
    a, b = min(a, b), max(a, b)
    ncu_summary.parse(CAPTURED[:a] + insert + CAPTURED[b:])
    ncu_summary.parse(CAPTURED[:a])
