"""The Triton peer of kvoracle's fused write: one launch per layer writes a token's K and V rows of
every head and (sparse layers) its index-K row, in the style of the engines' Triton cache writes
(TensorRT-LLM's fused K/V/index-K write, vLLM's reshape_and_cache_flash): one program per token,
the whole row as one tensor, the cast at the store. bench_write_peer.py times it next to kvoracle's
kernel; kvoracle judges it first (`write` is a kvoracle subject), so every figure is a ratio against
a kernel that writes the same bytes.

Modes it implements (SPEC 2-3): scale none, divide (fl(x / s): tl.math.div_rn, not Triton's
approximate `/`), mul_recip (fl(x * fl(1 / s))), one scale per tensor or per head; bf16, fp16, f32
or fp8 e4m3 caches (satfinite, as Triton's conversion on sm_90 is); strict slots (a slot < 0 writes
nothing); index-K flat (any flat dtype Triton casts to) or blockscale (128-groups, s = amax / 448
correctly rounded, optionally ue8m0), its own slot mapping or the K/V one; every layout and strided
view, by strides. Anything else raises kvoracle.Unsupported (never a silent other contract)."""

import torch
import triton
import triton.language as tl

SCALE_NONE, SCALE_DIVIDE, SCALE_MUL_RECIP = 0, 1, 2
SCALE_CODES = {"none": SCALE_NONE, "divide": SCALE_DIVIDE, "mul_recip": SCALE_MUL_RECIP}
INDEX_NONE, INDEX_FLAT, INDEX_BLOCKSCALE = 0, 1, 2
NUM_WARPS = 4


@triton.jit
def _scaled(x, s, SCALE: tl.constexpr):
    if SCALE == 1:  # divide: fl(x / s)
        x = tl.math.div_rn(x, s)
    elif SCALE == 2:  # mul_recip: fl(x * fl(1 / s))
        x = x * tl.math.div_rn(tl.zeros_like(s) + 1.0, s)
    return x


@triton.jit
def _fused_write_layer_kernel(
        k_ptr, v_ptr, index_k_ptr, slot_ptr, index_slot_ptr, k_scale_ptr, v_scale_ptr,
        k_cache_ptr, v_cache_ptr, index_ptr, index_scale_ptr,
        k_src_stride, v_src_stride, index_src_stride,
        st_block, st_token, st_head, ix_block, ix_token, block_size,
        NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, ROW: tl.constexpr,
        INDEX_DIM: tl.constexpr, INDEX_ROW: tl.constexpr, SCALE: tl.constexpr,
        PER_HEAD: tl.constexpr, INDEX: tl.constexpr, UE8M0: tl.constexpr):
    """Program t writes token t. k, v: [T, NUM_HEADS * HEAD_DIM] rows (token stride given);
    index_k: [T, INDEX_DIM]; slots: [T]; scales: [1] or [NUM_HEADS] fp32. K/V caches: element
    (block b, offset o, head h, dim d) at b*st_block + o*st_token + h*st_head + d. Flat index-K:
    (b, o, d) at b*ix_block + o*ix_token + d. Blockscale: index_ptr the cache's bytes, block b at
    byte b*ix_block (its block_size*INDEX_DIM fp8 values token-major, then its fp32 scales
    token-major), index_scale_ptr the same bytes as fp32 words."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        page = slot // block_size
        off = slot - page * block_size
        e = tl.arange(0, ROW)
        m = e < NUM_HEADS * HEAD_DIM
        h = e // HEAD_DIM
        dst = page * st_block + off * st_token + h * st_head + (e - h * HEAD_DIM)
        k = tl.load(k_ptr + t * k_src_stride + e, mask=m).to(tl.float32)
        v = tl.load(v_ptr + t * v_src_stride + e, mask=m).to(tl.float32)
        if SCALE != 0:
            if PER_HEAD:
                ks = tl.load(k_scale_ptr + h, mask=m, other=1.0)
                vs = tl.load(v_scale_ptr + h, mask=m, other=1.0)
            else:
                ks = tl.load(k_scale_ptr)
                vs = tl.load(v_scale_ptr)
            k = _scaled(k, ks, SCALE)
            v = _scaled(v, vs, SCALE)
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=m)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=m)
    if INDEX != 0:
        islot = tl.load(index_slot_ptr + t).to(tl.int64)
        if islot >= 0:
            page = islot // block_size
            off = islot - page * block_size
            if INDEX == 1:
                d = tl.arange(0, INDEX_ROW)
                m = d < INDEX_DIM
                x = tl.load(index_k_ptr + t * index_src_stride + d, mask=m).to(tl.float32)
                tl.store(index_ptr + page * ix_block + off * ix_token + d,
                         x.to(index_ptr.dtype.element_ty), mask=m)
            else:
                base = page * ix_block
                d = tl.arange(0, 128)
                for g in tl.static_range(INDEX_DIM // 128):
                    x = tl.load(index_k_ptr + t * index_src_stride + g * 128 + d).to(tl.float32)
                    amax = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-4)  # NaN ignored
                    s = tl.math.div_rn(amax, 448.0)
                    if UE8M0:  # the next power of two by the exponent bits, never exp2(ceil(log2))
                        u = s.to(tl.uint32, bitcast=True)
                        u = (((u >> 23) & 0xFF) + ((u & 0x7FFFFF) != 0).to(tl.uint32)) << 23
                        s = u.to(tl.float32, bitcast=True)
                    q = tl.math.div_rn(x, s)
                    tl.store(index_ptr + base + off * INDEX_DIM + g * 128 + d,
                             q.to(tl.float8e4nv))
                    tl.store(index_scale_ptr + (base + block_size * INDEX_DIM) // 4 +
                             off * (INDEX_DIM // 128) + g, s)


def byte_and_word_views(cache):
    """A blockscale cache [nb, ...] (bytes, blocks one stride(0) apart, each contiguous inside) as
    what a kernel handed its data_ptr() addresses: fp8 codes and fp32 words, from its first byte to
    its last."""
    run = torch.as_strided(cache, ((cache.shape[0] - 1) * cache.stride(0) + cache[0].numel(),),
                           (1,))
    return run.view(torch.float8_e4m3fn), run.view(torch.float32)


def fused_write_layer(k, v, slots, k_scale, v_scale, k_view, v_view, scale_mode, *, index_k=None,
                      index_slots=None, index_cache=None, index_layout="flat", ue8m0=False):
    """One launch: K and V ([T, H, D] or [T, H*D], rows contiguous) into the caches' [nb, bs, H, D]
    views k_view and v_view (any strides, d contiguous) through slots [T]; with index_k ([T,
    index_dim]) the index-K row into index_cache (flat: a [nb, bs, index_dim] view; blockscale: the
    [nb, block_bytes] byte view) through index_slots (default: slots). Launches on torch's current
    stream, so it can be captured in a CUDA graph."""
    tokens = slots.shape[0]
    if tokens == 0:
        return
    _, bs, heads, dim = k_view.shape
    index = INDEX_NONE
    index_dim, ix_block, ix_token = 128, 0, 0
    index_ptr = index_scale_ptr = k_view  # unused without index-K
    if index_k is not None:
        index_dim = index_k.shape[-1]
        if index_layout == "flat":
            index, index_ptr = INDEX_FLAT, index_cache
            ix_block, ix_token = index_cache.stride(0), index_cache.stride(1)
        else:
            index = INDEX_BLOCKSCALE
            index_ptr, index_scale_ptr = byte_and_word_views(index_cache)
            ix_block = index_cache.stride(0)
    _fused_write_layer_kernel[(tokens,)](
        k, v, index_k if index_k is not None else k, slots,
        index_slots if index_slots is not None else slots, k_scale, v_scale, k_view, v_view,
        index_ptr, index_scale_ptr, k.stride(0), v.stride(0),
        index_k.stride(0) if index_k is not None else 0, k_view.stride(0), k_view.stride(1),
        k_view.stride(2), ix_block, ix_token, bs, NUM_HEADS=heads, HEAD_DIM=dim,
        ROW=triton.next_power_of_2(heads * dim), INDEX_DIM=index_dim,
        INDEX_ROW=triton.next_power_of_2(index_dim), SCALE=SCALE_CODES[scale_mode],
        PER_HEAD=k_scale.numel() > 1, INDEX=index, UE8M0=ue8m0, num_warps=NUM_WARPS)


def write(call):
    """The peer as a kvoracle write subject (kvoracle.check(write, op="write", device="cuda"))."""
    from kvoracle import Unsupported

    cfg = call.config
    if cfg["scale_mode"] not in SCALE_CODES:
        raise Unsupported(f"scale_mode {cfg['scale_mode']}: none, divide and mul_recip only")
    if cfg["slot_mode"] != "strict":
        raise Unsupported("strict slots only (a slot < 0 writes nothing)")
    if cfg.get("via_model_dtype") or cfg.get("scale_in_model_dtype"):
        raise Unsupported("fp32 arithmetic only: no rounding to the model dtype")
    if cfg["kv_dtype"] == "fp8_e5m2" or (cfg["kv_dtype"] == "fp8_e4m3" and
                                         cfg["saturation"] != "satfinite"):
        raise Unsupported("fp8 e4m3 with satfinite only (Triton's conversion)")
    sparse = call.layer_kind == "sparse"
    blockscale = cfg["index_layout"] == "blockscale"
    if sparse and blockscale and cfg.get("blockscale_scale", "divide") != "divide":
        raise Unsupported("block scale s = amax / 448 only")
    if sparse and not blockscale and cfg.get("index_dtype") in ("fp8_e5m2", "fp8_e4m3") and \
            cfg["saturation"] != "satfinite":
        raise Unsupported("fp8 index-K with satfinite only")
    tokens = call.slot_mapping.shape[0]
    fused_write_layer(
        call.k, call.v, call.slot_mapping, call.k_scale, call.v_scale, call.k_view, call.v_view,
        cfg["scale_mode"], index_k=call.index_k[:tokens] if sparse else None,
        index_slots=call.index_slot_mapping if sparse else None,
        index_cache=call.index_cache if sparse else None, index_layout=cfg["index_layout"],
        ue8m0=bool(cfg.get("ue8m0")))


write.__name__ = "triton_peer_fused_write"
