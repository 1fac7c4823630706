#!/usr/bin/env python3
"""One line block per profiled launch of an ncu text log (`ncu --print-details all`): duration,
DRAM and issue-slot use, occupancy, and the executed instruction mix by SASS opcode, the figures
issue 16 asks to explain each miss with.

    python3 gpu/ncu_summary.py LOG [LOG ...] [--top N]
"""
import argparse
import re
import sys

# "  void kernel<...>(Args) (8, 1, 1)x(256, 1, 1), Context 1, Stream 13, Device 0, CC 9.0"
LAUNCH = re.compile(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")
# "    Duration                         us          37.12"
SCALAR = re.compile(r"^    ([A-Z][A-Za-z .]+?)\s{2,}(?:[a-z%/]+\s+)?([\d,.]+)\s*$")
OPCODES = "Executed Warp-Level Instructions By Basic SASS Opcode"
PIPES = "Pipe Utilization (% of peak instructions executed"
CATEGORIES = "Executed Instructions by SASS Opcode Category"
WANTED = ("Duration", "DRAM Throughput", "Issue Slots Busy", "Executed Ipc Active",
          "Achieved Occupancy", "Warp Cycles Per Issued Instruction", "Executed Instructions")


def value_block(lines, i):
    """The text of a metric whose value wraps over lines, inside its parentheses (to the end of
    the log where it was cut short)."""
    text = lines[i]
    while ")" not in text and i + 1 < len(lines):
        i += 1
        text += " " + lines[i].strip()
    if "(" not in text:
        return ""
    inside = text[text.index("(") + 1:]
    return inside[:inside.rindex(")")] if ")" in inside else inside


def counts(text):
    """[(name, count)] of "IMAD: 20,424; FFMA: 16,384; ..." (names as ncu prints them)."""
    return [(k.strip(), int(v.replace(",", "")))
            for k, v in re.findall(r"([A-Za-z0-9_./ ]+?): ([\d,]+)", text)]


def launches(path):
    with open(path, errors="replace") as f:
        return parse(f.read())


def parse(text):
    """The profiled launches of an ncu text log, in order: name, grid, block, and what was found
    of registers, metrics (WANTED), pipes, categories and opcodes (opcodes_short: the opcodes
    listed do not add up to the instructions stated)."""
    lines = text.splitlines()
    out, cur = [], None
    for i, line in enumerate(lines):
        m = LAUNCH.match(line)
        if m:
            name = re.sub(r"^void ", "", m.group(1))
            cur = dict(name=name, grid="x".join(m.group(2, 3, 4)), block=m.group(5), metrics={})
            out.append(cur)
            continue
        if cur is None:
            continue
        if PIPES in line:  # rows after the header's two dashed lines, to the third
            rows, dashes, j = [], 0, i
            while dashes < 3 and j + 1 < len(lines):
                j += 1
                if lines[j].strip().startswith("---"):
                    dashes += 1
                elif dashes == 2:
                    r = re.match(r"^\s+(\S.*?)\s+%\s+([\d.]+)\s*$", lines[j])
                    if r:
                        rows.append((r.group(1), float(r.group(2))))
            cur.setdefault("pipes", rows)
        elif OPCODES in line:
            total = value_block(lines, i)
            cur["opcodes"] = counts(total)
            stated = re.search(r"([\d,]+)\s*\(", " ".join(lines[i:i + 2]))
            if stated and int(stated.group(1).replace(",", "")) != sum(v for _, v in cur["opcodes"]):
                cur["opcodes_short"] = True
        elif CATEGORIES in line:
            cur["categories"] = counts(value_block(lines, i))
        elif line.strip().startswith("Registers Per Thread") and "registers" not in cur:
            # "Registers Per Thread   register/thread   58 (0: 58)": the first count after the unit
            r = re.search(r"register/thread\s+(\d+)", line)
            if r:
                cur["registers"] = r.group(1)
        else:
            s = SCALAR.match(line)
            if s and s.group(1) in WANTED and s.group(1) not in cur["metrics"]:
                cur["metrics"][s.group(1)] = s.group(2)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--top", type=int, default=12, help="opcodes listed per launch")
    a = ap.parse_args()
    for path in a.logs:
        try:
            found = launches(path)
        except OSError as e:
            print(f"ncu_summary: cannot read {path}: {e.strerror}", file=sys.stderr)
            return 2
        if not found:
            print(f"{path}: no profiled launch")
            continue
        for k in found:
            m = k["metrics"]
            print(f"{path}: {k['name']} grid {k['grid']} block {k['block']}, "
                  f"{k.get('registers', '?')} registers")
            print("   duration %s us, DRAM %s%%, issue slots %s%% busy, IPC %s, occupancy %s%%, "
                  "%s cycles a warp between issues, %s warp instructions" % tuple(
                      m.get(w, "?") for w in ("Duration", "DRAM Throughput", "Issue Slots Busy",
                                              "Executed Ipc Active", "Achieved Occupancy",
                                              "Warp Cycles Per Issued Instruction",
                                              "Executed Instructions")))
            pipes = sorted(k.get("pipes", []), key=lambda r: -r[1])[:5]
            if pipes:
                print("   pipes (% of peak issue): " + ", ".join("%s %.1f" % p for p in pipes))
            if k.get("opcodes_short"):
                print("   (the opcodes listed do not add up to the executed instructions)")
            for label, key, n in (("categories", "categories", 9), ("mix", "opcodes", a.top)):
                rows = k.get(key, [])
                total = sum(v for _, v in rows)
                if total:
                    print(f"   {label}: " + ", ".join(
                        f"{op} {100.0 * v / total:.1f}%"
                        for op, v in sorted(rows, key=lambda r: -r[1])[:n]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
