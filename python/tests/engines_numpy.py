"""NumPy stand-ins with the engines' own kernel signatures (what the adapters must carry without
glue), each correct where the engine's kernel is, with the bugs real kernels had as options."""

import numpy as np

from kvoracle import Unsupported
from kvoracle.bits import bf16_to_float32, float32_to_bf16, float32_to_fp8_e4m3


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                            k_scale, v_scale, *, skip_negative=True):
    """vLLM's signature; "auto" only (the cache holds the model dtype). skip_negative=False is the
    vllm#43810 bug class: slot -1 indexes from the end, as torch and NumPy indexing do."""
    assert kv_cache_dtype == "auto", kv_cache_dtype
    tokens = slot_mapping.shape[0]
    block_size = key_cache.shape[1]
    slots = slot_mapping[:tokens]
    rows = np.nonzero(slots >= 0)[0] if skip_negative else np.arange(tokens)
    s = slots[rows]
    key_cache[s // block_size, s % block_size] = key[rows]
    value_cache[s // block_size, s % block_size] = value[rows]


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, *,
                         swap_parts=False):
    """vLLM's MLA write ("auto"). swap_parts=True stores k_pe first: a layout bug."""
    assert kv_cache_dtype == "auto", kv_cache_dtype
    tokens = slot_mapping.shape[0]
    block_size = kv_cache.shape[1]
    slots = slot_mapping[:tokens]
    rows = np.nonzero(slots >= 0)[0]
    s = slots[rows]
    parts = (k_pe[rows], kv_c[rows]) if swap_parts else (kv_c[rows], k_pe[rows])
    kv_cache[s // block_size, s % block_size] = np.concatenate(parts, axis=1)


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                          kv_indices, kv_indptr, kv_last_page_len, kv_layout="NHD"):
    """FlashInfer's signature and page-table addressing (flashinfer/page.py)."""
    if isinstance(paged_kv_cache, tuple):
        k_cache, v_cache = paged_kv_cache
    else:  # [num_pages, 2, ...]
        k_cache, v_cache = paged_kv_cache[:, 0], paged_kv_cache[:, 1]
    page_size = k_cache.shape[1] if kv_layout == "NHD" else k_cache.shape[2]
    for i in range(append_key.shape[0]):
        b, pos = int(batch_indices[i]), int(positions[i])
        page = int(kv_indices[int(kv_indptr[b]) + pos // page_size])
        entry = pos % page_size
        if kv_layout == "NHD":
            k_cache[page, entry] = append_key[i]
            v_cache[page, entry] = append_value[i]
        else:
            k_cache[page, :, entry] = append_key[i]
            v_cache[page, :, entry] = append_value[i]


def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None):
    """SGLang's MHATokenToKVPool.set_kv_buffer, as a method of its pool (no quantization)."""
    assert k_scale is None and v_scale is None
    i = layer.layer_id - self.start_layer
    self.k_buffer[i][loc] = cache_k
    self.v_buffer[i][loc] = cache_v


def fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None,
                            page_size=16, *, skip_negative=False):
    """SGLang's Triton fp8 write: (x * fl(1 / s)).to(e4m3, satfinite), no slot mask (a -1 row lands
    before the cache: NumPy's -1 is the last row, the same class of stray write); skip_negative=True
    is the masked kernel."""
    assert k_cache.shape[0] % page_size == 0
    rows = np.nonzero(cache_loc >= 0)[0] if skip_negative else np.arange(cache_loc.shape[0])
    for src, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        inv = np.float32(1.0) / np.float32(scale)
        x = bf16_to_float32(src[rows]) * inv
        cache[cache_loc[rows]] = float32_to_fp8_e4m3(x.astype(np.float32))


def fused_write_layer_caches(k_cache, v_cache, idx_cache, out_cache_loc, k, v, idx_k, *,
                             skip_negative=True):
    """TensorRT-LLM MiniMax-M3's fused write: HND [pages, H, tpb, D] caches, 2-D [T, H * D]
    sources, no quantization; skip_negative=False is the older kernel without the slot mask.
    Declines (returns False) a head_dim that is not a power of two, as the real one does."""
    d = k_cache.shape[3]
    if d & (d - 1) or k.ndim != 2:
        return False
    if k_cache.dtype != k.dtype:
        raise Unsupported("the stand-in stores the model dtype only (NumPy carries raw bits)")
    h, tpb = k_cache.shape[1], k_cache.shape[2]
    for t in range(out_cache_loc.shape[0]):
        s = int(out_cache_loc[t])
        if s < 0 and skip_negative:
            continue
        page, within = s // tpb, s % tpb
        k_cache[page, :, within] = k[t].reshape(h, d)
        v_cache[page, :, within] = v[t].reshape(h, d)
        if idx_k is not None:
            idx_cache[page, 0, within] = idx_k[t]
    return True


def write_kv_slots(cache, out_cache_loc, values, *, layout="NHD"):
    """TensorRT-LLM's torch fallback: no slot mask, so -1 indexes from the end (torch floor
    semantics: page -1, within tpb - 1); skip_negative is not an option: that is the real code."""
    if cache.dtype != values.dtype:
        raise Unsupported("the stand-in stores the model dtype only (NumPy carries raw bits)")
    tpb = cache.shape[2] if layout == "HND" else cache.shape[1]
    page, within = out_cache_loc // tpb, out_cache_loc % tpb
    if layout == "HND":
        cache[page, :, within] = values
    else:
        cache[page, within] = values


def attention(call, *, include_own_token=True):
    """Sparse (or dense) paged attention in float64 over the call's selection; the answer rounded
    to the output dtype. include_own_token=False is the off-by-one a causal mask gets wrong."""
    cfg, p = call.config, call.params
    assert call.dtype("q") == "bf16" and call.dtype("k_view") == "bf16"
    q = bf16_to_float32(call.q).astype(np.float64)
    # The caches are read where the rows' pages are, never converted whole: a huge one (past 2^32
    # bytes) is a view of mostly unbacked memory.
    k, v = call.k_view, call.v_view
    tq, nq, hd = q.shape
    nkv, bs, sb = cfg["num_kv_heads"], cfg["block_size"], p["sparse_block"]
    group = nq // nkv

    def scale(scales, g):  # SPEC 2: dequantized with the scale unless the scale mode is none
        return 1.0 if cfg["scale_mode"] == "none" else float(scales[min(g, scales.size - 1)])

    sm_scale = p["sm_scale"] or float(np.float32(1) / np.float32(np.sqrt(np.float32(hd))))
    out = np.zeros((tq, nq, hd), dtype=np.float64)
    for row in range(tq):
        r, pos = int(call.row_request[row]), int(call.row_position[row])
        if int(call.seq_lens[r]) == 0:
            continue
        last = pos + 1 if include_own_token else pos
        for g in range(nkv):
            if call.selection is None:
                tokens = np.arange(last)
            else:
                blocks = [int(b) for b in call.selection[row, g] if b >= 0]
                tokens = np.concatenate(
                    [np.arange(b * sb, min((b + 1) * sb, last)) for b in blocks] or [[]]
                ).astype(np.int64)
            if tokens.size == 0:
                continue
            pages = call.block_table[r, tokens // bs]
            kk = bf16_to_float32(k[pages, tokens % bs, g]).astype(np.float64)
            vv = bf16_to_float32(v[pages, tokens % bs, g]).astype(np.float64)
            kk, vv = kk * scale(call.k_scale, g), vv * scale(call.v_scale, g)
            for h in range(g * group, (g + 1) * group):
                s = kk @ q[row, h] * sm_scale
                w = np.exp(s - s.max())
                out[row, h] = (w / w.sum()) @ vv
    if p["out_dtype"] == "f32":
        return out.astype(np.float32)
    if p["out_dtype"] == "bf16":
        return float32_to_bf16(out.astype(np.float32))
    return out.astype(np.float16)


def block_topk_head_major(call):
    """vLLM's Triton M3 indexer's output form in NumPy: block scores in float64 from a flat bf16
    index-K cache (max over each block's visible tokens; init and local blocks forced), the top-k
    best first (stable: ties to the lower id), -1 after; ids [H_kv, T, K] head-major. One index
    head per KV head (index_group max reduces several)."""
    cfg, p = call.config, call.params
    assert call.dtype("index_q") == "bf16" and call.dtype("index_cache") == "bf16"
    iq = bf16_to_float32(call.index_q).astype(np.float64)
    ik = call.index_cache  # read where the rows' pages are, as attention's caches
    tq, nh, _ = iq.shape
    nkv, bs, sb, topk = cfg["num_kv_heads"], cfg["block_size"], p["sparse_block"], p["topk"]
    ids = np.full((nkv, tq, topk), -1, dtype=np.int32)
    for row in range(tq):
        r, pos = int(call.row_request[row]), int(call.row_position[row])
        if int(call.seq_lens[r]) == 0:
            continue
        n_valid = pos // sb + 1
        t = np.arange(pos + 1)
        keys = bf16_to_float32(ik[call.block_table[r, t // bs], t % bs]).astype(np.float64)
        s = iq[row] @ keys.T  # [nh, tokens]
        for g in range(nkv):
            group = s[g * (nh // nkv):(g + 1) * (nh // nkv)].max(axis=0)
            score = np.array([group[j * sb:(j + 1) * sb].max() for j in range(n_valid)])
            score[:p["init_blocks"]] = 1e30
            score[max(n_valid - p["local_blocks"], 0):] = 1e29
            best = np.argsort(-score, kind="stable")[:min(topk, n_valid)]
            ids[g, row, :best.size] = best
    return ids


def dense_insert(call):
    """The dense-layer fused insert (SPEC 4: Gemma RMSNorm and partial NeoX RoPE of q and k, v as
    it is, k and v stored at their slots) in float64, rounded to bf16 once: a foreign kernel (its
    own arithmetic), for bf16 activations and caches without a scale. Returns q_out."""
    cfg = call.config
    if (call.dtype("q"), call.dtype("k_view"), cfg["scale_mode"]) != ("bf16", "bf16", "none"):
        raise Unsupported("bf16 activations and caches without a scale only")
    tokens = call.slot_mapping.shape[0]
    rd = int(call.rotary_dim)
    half = rd // 2
    table = call.cos_sin[call.positions[:tokens]].astype(np.float64)  # [T, rotary_dim]
    cos, sin = table[:, None, :half], table[:, None, half:]

    def norm_rope(x, w):  # x [T, heads, hd]
        x = bf16_to_float32(x[:tokens]).astype(np.float64)
        r = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + float(call.eps))
        y = x * r * (1.0 + w.astype(np.float64))
        x1, x2 = y[..., :half].copy(), y[..., half:rd].copy()
        y[..., :half] = x1 * cos - x2 * sin
        y[..., half:rd] = x2 * cos + x1 * sin
        return float32_to_bf16(y.astype(np.float32))

    q = norm_rope(call.q, call.q_norm_weight)
    k = norm_rope(call.k, call.k_norm_weight)
    slots = call.slot_mapping[:tokens]
    rows = np.nonzero(slots >= 0)[0]
    s, bs = slots[rows], cfg["block_size"]
    call.k_view[s // bs, s % bs] = k[rows]
    call.v_view[s // bs, s % bs] = call.v[rows]
    return q


def reshape_and_cache_flash_fp8_mul_recip(key, value, key_cache, value_cache, slot_mapping,
                                          kv_cache_dtype, k_scale, v_scale):
    """vLLM's signature storing e4m3 as x * fl(1 / s) (satfinite), one scale: what a Triton `/` may
    compile to, inside div_approx's admissible set."""
    # vLLM's Triton wrapper stores every "fp8..." string as the platform's e4m3 (the e5m2 bug).
    assert kv_cache_dtype.startswith("fp8"), kv_cache_dtype
    tokens = slot_mapping.shape[0]
    block_size = key_cache.shape[1]
    rows = np.nonzero(slot_mapping[:tokens] >= 0)[0]
    s = slot_mapping[rows]
    for src, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        inv = np.float32(1.0) / np.float32(scale[0])
        cache[s // block_size, s % block_size] = float32_to_fp8_e4m3(
            (bf16_to_float32(src[rows]) * inv).astype(np.float32))
