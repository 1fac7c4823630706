"""kvoracle's fused write next to its Triton peer (triton_write_peer.py), in one process, on the same
torch buffers, through one timing function: every figure is a ratio against the peer, an empty
launch and a device copy measured in this run (issue 16).

For each flavour (bench/write_bench_setup.hpp: bf16; fp8 under divide, divide by 1.0, mul_recip,
none) the peer is first judged by kvoracle (kvoracle.check at the benchmark's geometry, under the
flavour's modes): a peer that does not pass is not timed. Then, per token count, the model's 60
layers (3D57S) are captured in one CUDA graph per kernel (kvoracle plain, kvoracle with PDL, the
peer) and timed as medians of event-timed replays after a 50 ms warm-up (gpu_bench.cuh's rule);
after timing, the peer's and kvoracle's bytes are compared on the benchmark's own caches.

    PYTHONPATH=<dir holding the kvoracle package> python bench/bench_write_peer.py \\
        --lib build/bench/libkvo_bench_write.so [--tokens 1,8,...] [--flavours bf16,...] \\
        [--cases 100] [--json out.json]

Exit status: 0 when every peer passed and every benchmark ran (targets missed are reported, not
failed), 1 when a peer failed kvoracle's judgement or the bytes differ, 2 on bad arguments."""

import argparse
import ctypes
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton_write_peer as peer  # noqa: E402

TOKENS = (1, 8, 64, 256, 4096, 65536)
ERROR_LEN = 1024


class KvoWrite:
    """libkvo_bench_write through ctypes (bench/write_launch_abi.cu)."""

    def __init__(self, path):
        c = ctypes
        self.lib = lib = c.CDLL(path)
        i64, vp = c.c_int64, c.c_void_p
        lib.kvo_bench_flavour_name.restype = c.c_char_p
        lib.kvo_bench_flavour_scale_mode.restype = c.c_char_p
        lib.kvo_bench_flavour_scale.restype = c.c_float
        lib.kvo_bench_layer_kinds.restype = c.c_char_p
        for f in ("num_blocks", "block_size", "kv_heads", "head_dim", "index_dim"):
            getattr(lib, "kvo_bench_" + f).restype = i64
        lib.kvo_bench_num_blocks.argtypes = [i64]
        for f in ("kv_bytes", "index_bytes"):
            getattr(lib, "kvo_bench_" + f).restype = i64
            getattr(lib, "kvo_bench_" + f).argtypes = [c.c_int, i64, c.c_char_p, i64]
        lib.kvo_bench_slots.argtypes = [i64, i64, vp]
        lib.kvo_bench_layer_bytes.restype = c.c_double
        lib.kvo_bench_layer_bytes.argtypes = [c.c_int, c.c_int, i64]
        lib.kvo_bench_fused_write.argtypes = [c.c_int, i64, c.c_int] + [vp] * 6 + [i64] + \
            [vp] * 3 + [c.c_int, c.c_int, c.c_char_p, i64]
        for f in ("empty_launch_us", "copy_gbps"):
            getattr(lib, "kvo_bench_" + f).restype = c.c_double
        lib.kvo_bench_empty_launch_us.argtypes = [c.c_int, c.c_char_p, i64]
        lib.kvo_bench_copy_gbps.argtypes = [c.c_char_p, i64]
        self.error = c.create_string_buffer(ERROR_LEN)
        self.flavours = []
        for f in range(lib.kvo_bench_num_flavours()):
            self.flavours.append(dict(
                index=f, name=lib.kvo_bench_flavour_name(f).decode(),
                fp8=bool(lib.kvo_bench_flavour_fp8(f)),
                scale_mode=lib.kvo_bench_flavour_scale_mode(f).decode(),
                scale=lib.kvo_bench_flavour_scale(f),
                specialised=bool(lib.kvo_bench_flavour_specialised(f))))
        self.layers = lib.kvo_bench_layer_kinds().decode()
        self.block_size = lib.kvo_bench_block_size()
        self.heads = lib.kvo_bench_kv_heads()
        self.head_dim = lib.kvo_bench_head_dim()
        self.index_dim = lib.kvo_bench_index_dim()

    def checked(self, value, what):
        if value < 0:
            raise RuntimeError(f"{what}: {self.error.value.decode()}")
        return value


def judge_modes(kvo, flavour):
    """The kvoracle flags of a flavour: the bench's geometry and the modes the peer implements."""
    modes = dict(act_dtype="bf16", layout="packed_hnd", slot_mode="strict", sat="satfinite",
                 via_model_dtype=False, scale_in_model_dtype=False, per_head_scale=False,
                 scale_mode=flavour["scale_mode"], block_size=kvo.block_size,
                 num_kv_heads=kvo.heads, head_dim=kvo.head_dim, index_dim=kvo.index_dim)
    if flavour["fp8"]:
        modes.update(kv_dtype="fp8_e4m3", index_layout="blockscale", ue8m0=True,
                     blockscale_scale="divide")
    else:
        modes.update(kv_dtype="bf16", index_layout="flat", index_dtype="bf16")
    return modes


class Point:
    """One flavour at one token count: inputs and 60 layers' caches as torch tensors, the views
    both kernels write through, and the bytes the fused write moves per step."""

    def __init__(self, kvo, flavour, tokens):
        dev = "cuda"
        self.kvo, self.flavour, self.tokens = kvo, flavour, tokens
        lib, f = kvo.lib, flavour["index"]
        self.nb = nb = lib.kvo_bench_num_blocks(tokens)
        h, d, bs, idim = kvo.heads, kvo.head_dim, kvo.block_size, kvo.index_dim
        gen = torch.Generator(device=dev).manual_seed(1)

        def uniform(*shape):  # [-4, 4) in bf16, as gpu_bench.cuh's fill
            return (torch.rand(*shape, generator=gen, device=dev) * 8 - 4).to(torch.bfloat16)

        self.k, self.v, self.index_k = uniform(tokens, h, d), uniform(tokens, h, d), uniform(
            tokens, idim)
        slots = torch.empty(tokens, dtype=torch.int64)
        lib.kvo_bench_slots(tokens, nb, slots.data_ptr())
        self.slots = slots.to(dev)
        self.scale = torch.tensor([flavour["scale"]], dtype=torch.float32, device=dev)
        kv_bytes = kvo.checked(lib.kvo_bench_kv_bytes(f, nb, kvo.error, ERROR_LEN), "kv bytes")
        ix_bytes = kvo.checked(lib.kvo_bench_index_bytes(f, nb, kvo.error, ERROR_LEN),
                               "index bytes")
        cache_dtype = torch.float8_e4m3fn if flavour["fp8"] else torch.bfloat16
        assert kv_bytes == nb * h * bs * 2 * d * cache_dtype.itemsize, kv_bytes
        self.layers = []
        self.bytes_per_step = 0.0
        for kind in kvo.layers:
            sparse = kind == "S"
            packed = torch.zeros((nb, h, bs, 2 * d), dtype=cache_dtype, device=dev)
            index = None
            if sparse:
                index = (torch.zeros((nb, ix_bytes // nb), dtype=torch.uint8, device=dev)
                         if flavour["fp8"] else
                         torch.zeros((nb, bs, idim), dtype=torch.bfloat16, device=dev))
                assert index.numel() * index.element_size() == ix_bytes, ix_bytes
            self.layers.append((sparse, packed, index))
            self.bytes_per_step += lib.kvo_bench_layer_bytes(f, int(sparse), tokens)

    def kvo_layer(self, layer, stream, pdl, generic=False):
        sparse, packed, index = self.layers[layer]
        kvo = self.kvo
        kvo.checked(kvo.lib.kvo_bench_fused_write(
            self.flavour["index"], self.nb, int(sparse), self.k.data_ptr(), self.v.data_ptr(),
            self.index_k.data_ptr() if sparse else None, self.slots.data_ptr(),
            self.scale.data_ptr(), self.scale.data_ptr(), self.tokens, packed.data_ptr(),
            index.data_ptr() if sparse else None, stream.cuda_stream, int(pdl), int(generic),
            kvo.error, ERROR_LEN), "kvoracle fused write")

    def kvo_generic_layer(self, layer, stream, pdl):
        self.kvo_layer(layer, stream, pdl, generic=True)

    def peer_layer(self, layer, stream, pdl):
        sparse, packed, index = self.layers[layer]
        d = self.kvo.head_dim
        # [nb, h, bs, 2d] -> K and V as [nb, bs, h, d] views
        k_view = packed[..., :d].permute(0, 2, 1, 3)
        v_view = packed[..., d:].permute(0, 2, 1, 3)
        peer.fused_write_layer(
            self.k, self.v, self.slots, self.scale, self.scale, k_view, v_view,
            self.flavour["scale_mode"], index_k=self.index_k if sparse else None,
            index_cache=index, index_layout="blockscale" if self.flavour["fp8"] else "flat",
            ue8m0=self.flavour["fp8"])

    def graph(self, layer_fn, pdl=False):
        """The 60 layers' writes by layer_fn captured in one graph (after one eager run, which
        compiles the Triton kernel outside the capture)."""
        torch.cuda.synchronize()  # the caches zeroed on the default stream
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for layer in range(len(self.layers)):
                layer_fn(layer, stream, pdl)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream, capture_error_mode="thread_local"):
            for layer in range(len(self.layers)):
                layer_fn(layer, stream, pdl)
        torch.cuda.synchronize()
        return g, stream

    def zero_caches(self):
        for _, packed, index in self.layers:
            packed.zero_()
            if index is not None:
                index.zero_()

    def first_difference_from(self, expected):
        """The first byte where these caches differ from `expected` (caches_bytes()), as text."""
        for layer, ((_, packed, index), (kp, ki)) in enumerate(zip(self.layers, expected)):
            for what, want, got in (("K/V", kp, packed), ("index-K", ki, index)):
                d = None if want is None else first_difference(want, got)
                if d is not None:
                    return (f"layer {layer} {what} byte {d[0]}: kvoracle 0x{d[1]:02x}, this "
                            f"0x{d[2]:02x}")
        return None

    def caches_bytes(self):
        return [(p.clone(), None if i is None else i.clone()) for _, p, i in self.layers]


def median_replay_s(graph, stream, reps):
    """gpu_bench.cuh's median_replay_s: replays for >= 50 ms (an idle H200 idles at a few hundred
    MHz), then the median of `reps` individually event-timed replays."""
    with torch.cuda.stream(stream):
        start = time.perf_counter()
        while time.perf_counter() - start < 0.05:
            for _ in range(10):
                graph.replay()
            stream.synchronize()
        times = []
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(reps):
            a.record(stream)
            graph.replay()
            b.record(stream)
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e-3)
    times.sort()
    return times[len(times) // 2]


def first_difference(a, b):
    """(flat byte index, a's byte, b's byte) of the first difference of two tensors' bytes."""
    x, y = a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    diff = torch.nonzero(x != y)
    if diff.numel() == 0:
        return None
    i = int(diff[0, 0])
    return i, int(x[i]), int(y[i])


def run_point(kvo, flavour, tokens, empty_us, copy_gbps):
    p = Point(kvo, flavour, tokens)
    reps = 10 if tokens >= 65536 else (30 if tokens >= 4096 else 100)
    n = len(p.layers)
    row = dict(flavour=flavour["name"], tokens=tokens)
    for name, fn, pdl in (("kvo", p.kvo_layer, False), ("kvo_pdl", p.kvo_layer, True),
                          ("generic", p.kvo_generic_layer, False), ("peer", p.peer_layer, False)):
        g, s = p.graph(fn, pdl)
        row[name + "_us"] = median_replay_s(g, s, reps) / n * 1e6
        del g
    # The bytes each wrote, on the benchmark's own caches zeroed first: kvoracle's as shipped, then
    # its generic kernel's and the peer's (graph() runs the layers once before capturing them).
    p.zero_caches()
    g, s = p.graph(p.kvo_layer)
    kvo_bytes = p.caches_bytes()
    row["identical"] = True
    for who, fn in (("generic kernel", p.kvo_generic_layer), ("peer", p.peer_layer)):
        p.zero_caches()
        g, s = p.graph(fn)
        difference = p.first_difference_from(kvo_bytes)
        if difference is not None:
            row["identical"] = False
            row["first_difference"] = f"{who}: {difference}"
            break
    del g
    for name in ("kvo", "kvo_pdl", "generic", "peer"):
        t = row[name + "_us"] * 1e-6 * n
        row[name + "_bw_frac"] = p.bytes_per_step / t / (copy_gbps * 1e9)
        row[name + "_x_empty"] = row[name + "_us"] / empty_us
    row["kvo_x_peer"] = row["kvo_us"] / row["peer_us"]
    row["kvo_pdl_x_peer"] = row["kvo_pdl_us"] / row["peer_us"]
    del p
    torch.cuda.empty_cache()
    return row


def targets(row, flavour):
    """Issue 16's write targets for this point, as (text, met plain, met with PDL)."""
    out = []
    if row["tokens"] <= 256:
        out.append(("kvo<=peer", row["kvo_x_peer"] <= 1.0, row["kvo_pdl_x_peer"] <= 1.0))
        out.append(("kvo<=2xEmpty", row["kvo_x_empty"] <= 2.0, row["kvo_pdl_x_empty"] <= 2.0))
    if row["tokens"] >= 65536:
        floor = 0.8 if flavour["scale_mode"] == "divide" else 0.9
        out.append((f"bw>={floor:.2f}", row["kvo_bw_frac"] >= floor,
                    row["kvo_pdl_bw_frac"] >= floor))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default=os.environ.get("KVO_BENCH_WRITE_LIB", ""),
                    help="path of libkvo_bench_write.so")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--flavours", default="", help="comma-separated; default: every flavour")
    ap.add_argument("--cases", type=int, default=100, help="kvoracle cases judging each peer")
    ap.add_argument("--json", default="", help="write the rows here")
    a = ap.parse_args()
    if not a.lib or not os.path.exists(a.lib):
        print(f"bench_write_peer: --lib '{a.lib}' is not a file (libkvo_bench_write.so)",
              file=sys.stderr)
        return 2
    try:
        tokens = [int(t) for t in a.tokens.split(",") if t]
    except ValueError:
        print(f"bench_write_peer: --tokens '{a.tokens}' is not a list of integers", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_write_peer: no CUDA device", file=sys.stderr)
        return 2
    import kvoracle

    kvo = KvoWrite(a.lib)
    wanted = [f for f in a.flavours.split(",") if f]
    unknown = set(wanted) - {f["name"] for f in kvo.flavours}
    if unknown:
        print(f"bench_write_peer: unknown flavour(s) {sorted(unknown)}; known: "
              f"{[f['name'] for f in kvo.flavours]}", file=sys.stderr)
        return 2
    flavours = [f for f in kvo.flavours if not wanted or f["name"] in wanted]
    empty_us = kvo.checked(kvo.lib.kvo_bench_empty_launch_us(0, kvo.error, ERROR_LEN), "empty")
    empty_pdl_us = kvo.checked(kvo.lib.kvo_bench_empty_launch_us(1, kvo.error, ERROR_LEN),
                               "empty pdl")
    copy_gbps = kvo.checked(kvo.lib.kvo_bench_copy_gbps(kvo.error, ERROR_LEN), "copy")
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{peer.triton.__version__}; empty launch {empty_us:.3f} us (PDL twin "
          f"{empty_pdl_us:.3f}), 60 in a graph; D2D copy {copy_gbps:.0f} GB/s read+write")
    status, rows, verdicts = 0, [], []
    for flavour in flavours:
        modes = judge_modes(kvo, flavour)
        report = kvoracle.check(peer.write, op="write", device="cuda", cases=a.cases, **modes)
        summary = report.message.splitlines()[0] if report.message else ""
        verdicts.append(dict(flavour=flavour["name"], passed=report.passed, summary=summary))
        print(f"peer judged by kvoracle, {flavour['name']} (kvoracle's specialised kernel: "
              f"{'yes' if flavour['specialised'] else 'no'}): "
              f"{'pass' if report.passed else 'FAIL'}: {summary}")
        if not report.passed:
            print(report.message)
            status = 1
            continue
        for t in tokens:
            row = run_point(kvo, flavour, t, empty_us, copy_gbps)
            row["targets"] = targets(row, flavour)
            rows.append(row)
            if not row["identical"]:
                status = 1
    print("%-13s %6s %8s %8s %8s %8s %7s %7s %7s %7s %7s %7s %7s  %s" % (
        "flavour", "tokens", "kvo_us", "kvoPDL", "generic", "peer_us", "kvo/pr", "PDL/pr",
        "kvo/E", "peer/E", "kvoBW", "kvoPBW", "peerBW", "same bytes; targets (plain|PDL)"))
    for r in rows:
        word = {True: "ok", False: "MISS"}
        notes = ", ".join(f"{text} {word[plain]}|{word[pdl]}" for text, plain, pdl in r["targets"])
        print("%-13s %6d %8.3f %8.3f %8.3f %8.3f %7.2f %7.2f %7.2f %7.2f %7.3f %7.3f %7.3f  %s%s" % (
            r["flavour"], r["tokens"], r["kvo_us"], r["kvo_pdl_us"], r["generic_us"],
            r["peer_us"], r["kvo_x_peer"], r["kvo_pdl_x_peer"], r["kvo_x_empty"],
            r["peer_x_empty"], r["kvo_bw_frac"], r["kvo_pdl_bw_frac"], r["peer_bw_frac"],
            "same" if r["identical"] else "DIFFERENT: " + r["first_difference"],
            "; " + notes if notes else ""))
    print("(us per layer, 60 layers in one graph; kvo: kvoracle's fused write as shipped (the "
          "specialised kernel where it applies), generic: its generic kernel; /pr: over the peer's "
          "time; /E: over an empty launch; BW: (bytes read + written) / time / copy bandwidth)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(empty_us=empty_us, empty_pdl_us=empty_pdl_us, copy_gbps=copy_gbps,
                           judged=verdicts, rows=rows), f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
