"""Adapters: a kernel with an engine's own calling convention, as a kvoracle subject function.

Each adapter takes the kernel (a torch op, a Triton launcher, a NumPy stand-in: anything with the
engine's signature), builds that signature's arguments from a kvoracle call (views of the call's
tensors, never copies of the caches, so the kernel writes kvoracle's guarded caches in place) and
declares the SPEC modes the engine implies, with the evidence (`overrides`, `evidence`). The user's
own overrides win over an adapter's. On the CPU the arguments are NumPy arrays (bf16 and fp8 as raw
bits), on CUDA torch tensors of their real dtypes.

    kvoracle.check(adapters.vllm_reshape_and_cache_flash(torch.ops._C_cache_ops.reshape_and_cache_flash),
                   op="write", device="cuda")
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import numpy as np

from ._api import Call, Unsupported


class Adapter:
    """A subject function made from an engine kernel: callable with a Call; `overrides` are the
    modes the engine implies (merged under the user's), `evidence` says where they come from."""

    def __init__(self, name: str, run: Callable[[Call], Any], overrides: Dict[str, Any],
                 evidence: str, ordering: Optional[str] = None, topk_order: Optional[str] = None,
                 profile: Optional[str] = None):
        self.__name__ = name
        self._run = run
        self.overrides = dict(overrides)
        self.evidence = evidence
        self.ordering = ordering
        self.topk_order = topk_order
        self.profile = profile

    def __call__(self, call: Call):
        return self._run(call)

    def __repr__(self):
        return f"Adapter({self.__name__}, implies {self.overrides})"


class _Ops:
    """The few array operations an adapter needs, over NumPy (CPU calls) or torch (CUDA calls)."""

    def __init__(self, call: Call):
        self.cuda = call.device == "cuda"
        if self.cuda:
            import torch

            self.torch = torch
            self.device = call.k.device

    def arange(self, n: int, dtype: str):
        if self.cuda:
            return self.torch.arange(n, dtype=getattr(self.torch, dtype), device=self.device)
        return np.arange(n, dtype=dtype)

    def nonnegative(self, x):
        """Indices of x >= 0."""
        if self.cuda:
            return self.torch.nonzero(x >= 0).flatten()
        return np.nonzero(x >= 0)[0]

    def astype(self, x, dtype: str):
        if self.cuda:
            return x.to(getattr(self.torch, dtype))
        return x.astype(dtype)


def _tokens(call: Call) -> int:
    return int(call.slot_mapping.shape[0])


def _require_dense_layer(call: Call, engine: str) -> None:
    if call.layer_kind != "dense":
        raise Unsupported(f"{engine} writes K and V only: a sparse layer's index-K is not its job "
                          "(layers='...D' fixes dense layers)")


_VLLM_CACHE_DTYPE = {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8_e5m2"}

# vLLM's CUDA cache writes: "auto" stores the model dtype unscaled; fp8 is
# __nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE) in fp32 (scaled_fp8_conversion).
_VLLM_AUTO: Dict[str, Any] = {"act_dtype": "bf16", "kv_dtype": "bf16", "scale_mode": "none"}
_VLLM_FP8: Dict[str, Any] = {"act_dtype": "bf16", "kv_dtype": "fp8_e4m3", "sat": "satfinite",
                             "scale_mode": "divide", "via_model_dtype": False,
                             "scale_in_model_dtype": False}


def vllm_kv_cache_dtype(config: Dict[str, Any]) -> str:
    """vLLM's kv_cache_dtype string for a kvoracle configuration: "auto" when the cache holds the
    model dtype, "fp8" (e4m3) or "fp8_e5m2" otherwise."""
    kv = config["kv_dtype"]
    if kv == config["act_dtype"]:
        return "auto"
    if kv in _VLLM_CACHE_DTYPE:
        return _VLLM_CACHE_DTYPE[kv]
    raise Unsupported(f"vLLM stores a {config['act_dtype']} model in a {kv} cache only as 'auto'")


# vLLM's two KV writes with one signature: the CUDA op and its Triton twin. What each supports and
# the arithmetic each implies (vLLM 0.11-0.34: csrc/cache_kernels.cu, _custom_ops.py;
# vllm/v1/attention/ops/triton_reshape_and_cache_flash.py @027e07f2).
_VLLM_BACKENDS: Dict[str, Dict[str, Any]] = {
    # Every layout by its strides, [1] or [H] scales, x / s exact in fp32.
    "cuda": {"layouts": None, "strided": True, "fp8_scale_mode": "divide", "per_head": None},
    # NHD pages whose slot rows (H x D) are contiguous (the [nb, 2, bs, H, D] pool unbound: split_nhd),
    # one tensor scale, x / s lowered to div.full.f32 (within 2 ulp: div_approx), every "fp8..."
    # string stored as the platform's e4m3 (an e5m2 cache gets e4m3 codes: a bug kvoracle shows).
    "triton": {"layouts": ("nhd", "split_nhd"), "strided": False, "fp8_scale_mode": "div_approx",
               "per_head": False},
}


def vllm_reshape_and_cache_flash(kernel: Callable, *, fp8: bool = False,
                                 backend: str = "cuda") -> Adapter:
    """vLLM's `reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
    kv_cache_dtype, k_scale, v_scale)`, the CUDA op (`vllm._custom_ops`, backend="cuda") or its
    Triton twin `triton_reshape_and_cache_flash` (backend="triton"): key/value [T_src, H, D] (T =
    slot_mapping.size(0), the rows past it CUDA-graph padding); key_cache/value_cache [num_blocks,
    block_size, H, D] with the layout's strides; slot_mapping int64, -1 skipped; k_scale/v_scale
    fp32 tensors [1] (or [H], CUDA only). Dense layers (K and V only). The Triton twin's cases are
    drawn within what it supports: NHD and the unbound [nb, 2, bs, H, D] pool, dense pages, one
    scale, and div_approx declared for its `/`; HND and strided pages are left out (its kernel
    addresses a slot's H x D row as one contiguous run)."""
    if backend not in _VLLM_BACKENDS:
        raise ValueError(f"vllm_reshape_and_cache_flash: backend {backend!r}; expected one of "
                         f"{', '.join(_VLLM_BACKENDS)}")
    b = _VLLM_BACKENDS[backend]
    overrides: Dict[str, Any] = {"layers": "2D", "slot_type": "i64", "slot_mode": "strict",
                                 **(_VLLM_FP8 if fp8 else _VLLM_AUTO)}
    if fp8:
        overrides["scale_mode"] = b["fp8_scale_mode"]
    if b["per_head"] is not None:
        overrides["per_head_scale"] = b["per_head"]

    def write(call: Call):
        _require_dense_layer(call, "reshape_and_cache_flash")
        if b["layouts"] is not None and call.config["layout"] not in b["layouts"]:
            raise Unsupported(f"vLLM's {backend} reshape_and_cache_flash writes "
                              f"{' and '.join(b['layouts'])} pages only")
        if not b["strided"] and "kv_strides" in call.config:
            raise Unsupported(f"vLLM's {backend} reshape_and_cache_flash needs each slot's H x D "
                              "row contiguous")
        kernel(call.k, call.v, call.k_view, call.v_view, call.slot_mapping,
               vllm_kv_cache_dtype(call.config), call.k_scale, call.v_scale)

    return Adapter(
        f"vllm.reshape_and_cache_flash[{backend}]", write, overrides,
        "vLLM csrc/cache_kernels.cu (CUDA) and vllm/v1/attention/ops/"
        "triton_reshape_and_cache_flash.py @027e07f2 (Triton): slot < 0 returns early; the token "
        "count is slot_mapping.size(0); block and slot strides from the cache tensor; fp8 = "
        "cvt_satfinite(x / scale) in fp32, exact in CUDA, Triton's `/` approximate (div_approx).")


def vllm_indexer_k_quant_and_cache(kernel: Callable, kv_write: Adapter, *,
                                   ue8m0: bool = False, backend: str = "cuda") -> Adapter:
    """A sparse layer as vLLM writes it (vllm/model_executor/layers/sparse_attn_indexer.py):
    `kv_write` (an adapter that writes K and V, e.g. vllm_reshape_and_cache_flash) then
    `indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, scale_fmt)`, positional
    as vLLM calls it: k [T, index_dim] with exactly slot_mapping's T rows (vLLM cuts k[:T]; a
    Triton kernel's grid is k.shape[0]); kv_cache [num_blocks, block_size, index_dim + index_dim /
    128 * 4], a byte-count view of the block-major page (all fp8 rows, then all fp32 scales):
    uint8 for the CUDA op (backend="cuda", vLLM's DeepseekV32IndexerCache), an fp8 e4m3 view for a
    Triton kernel (backend="triton"); slot_mapping int64; quant_block_size 128; scale_fmt "ue8m0"
    or ""."""
    if backend not in ("cuda", "triton"):
        raise ValueError(f"vllm_indexer_k_quant_and_cache: backend {backend!r}; expected 'cuda' "
                         "or 'triton'")
    overrides = dict(kv_write.overrides)
    overrides.update(layers="2S", index_layout="blockscale", index_dim=128, ue8m0=ue8m0,
                     blockscale_scale="divide", separate_index_slots=False, slot_type="i64")

    def write(call: Call):
        if call.layer_kind == "sparse":
            call.layer_kind = "dense"  # the K/V kernel sees its own part of the layer
            try:
                kv_write(call)
            finally:
                call.layer_kind = "sparse"
        else:
            kv_write(call)
            return
        nb = call.index_cache.shape[0]
        bs = call.config["block_size"]
        page = call.index_cache.reshape(nb, bs, -1)
        if backend == "triton" and call.device == "cuda":
            import torch

            page = page.view(torch.float8_e4m3fn)
        kernel(call.index_k[: _tokens(call)], page, call.slot_mapping, 128,
               "ue8m0" if ue8m0 else "")

    return Adapter(
        f"vllm.indexer_k_quant_and_cache[{backend}]", write, overrides,
        "vLLM csrc/cache_kernels.cu indexer_k_quant_and_cache and sparse_attn_indexer.py: k cut "
        "to slot_mapping's rows; scale = fmaxf(amax, 1e-4) / 448 in fp32 (ue8m0: a power of two, "
        "rounded up), values cvt_satfinite(x / scale), slot < 0 skipped; the page block-major: "
        "B * index_dim fp8 bytes then B * index_dim / 128 fp32 scales.")


def vllm_concat_and_cache_mla(kernel: Callable, *, pe_dim: int = 64, fp8: bool = False) -> Adapter:
    """vLLM's MLA write `concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype,
    scale)`: kv_c [T, kv_lora_rank], k_pe [T, pe_dim], kv_cache [num_blocks, block_size,
    kv_lora_rank + pe_dim], one scalar scale. MLA caches one latent row per token, which kvoracle
    models as a one-head NHD K cache of head_dim kv_lora_rank + pe_dim (the row kv_c ‖ k_pe); the
    layer's V rows go through the same kernel into the V cache, so every byte kvoracle checks is the
    kernel's. kv_lora_rank = head_dim - pe_dim (pe_dim capped at half the head)."""
    overrides: Dict[str, Any] = {"layers": "2D", "layout": "nhd", "num_kv_heads": 1,
                                 "slot_type": "i64", "slot_mode": "strict", "per_head_scale": False,
                                 **(_VLLM_FP8 if fp8 else _VLLM_AUTO)}

    def write(call: Call):
        _require_dense_layer(call, "concat_and_cache_mla")
        nb, bs, heads, hd = call.k_view.shape
        if heads != 1:
            raise Unsupported("an MLA cache holds one latent row per token (num_kv_heads=1)")
        pe = min(pe_dim, hd // 2)
        dtype = vllm_kv_cache_dtype(call.config)
        for rows, cache, scale in ((call.k, call.k_view, call.k_scale),
                                   (call.v, call.v_view, call.v_scale)):
            latent = rows[:, 0]
            kernel(latent[:, : hd - pe], latent[:, hd - pe:], cache.reshape(nb, bs, hd),
                   call.slot_mapping, dtype, scale)

    return Adapter(
        "vllm.concat_and_cache_mla", write, overrides,
        "vLLM csrc/cache_kernels.cu concat_and_cache_mla: dst = blk * block_stride + off * "
        "entry_stride + i (+ kv_lora_rank for k_pe), slot < 0 skipped, fp8 through "
        "scaled_convert(x, *scale) = cvt_satfinite(x / scale).")


def _flashinfer_layout(call: Call):
    layout = call.config["layout"]
    if layout in ("nhd", "hnd"):
        return (call.k_cache, call.v_cache), layout.upper()
    if layout in ("split_nhd", "split_hnd"):
        return call.k_cache, layout.split("_")[1].upper()
    raise Unsupported(f"FlashInfer has no {layout} paged cache")


def flashinfer_append_paged_kv_cache(kernel: Callable) -> Adapter:
    """FlashInfer's `append_paged_kv_cache(append_key, append_value, batch_indices, positions,
    paged_kv_cache, kv_indices, kv_indptr, kv_last_page_len, kv_layout)`: the cache as a (k, v)
    tuple of [num_pages, page_size, H, D] (NHD) or [num_pages, H, page_size, D] (HND), or one
    [num_pages, 2, ...] tensor (kvoracle's split layouts); pages addressed through a page table, not
    a slot mapping. The adapter gives each written token a one-page request (its page the slot's
    block, its position the slot's offset), so the table says exactly what the slot mapping says;
    padding tokens (slot -1) are not appended, as an engine would not append them."""
    overrides = {"layers": "2D", "act_dtype": "bf16", "kv_dtype": "bf16", "scale_mode": "none",
                 "slot_mode": "strict"}

    def write(call: Call):
        _require_dense_layer(call, "append_paged_kv_cache")
        ops = _Ops(call)
        paged, kv_layout = _flashinfer_layout(call)
        slots = call.slot_mapping[: _tokens(call)]
        rows = ops.nonnegative(slots)
        valid = slots[rows]
        bs = call.config["block_size"]
        n = int(valid.shape[0])
        positions = ops.astype(valid % bs, "int32")
        kernel(call.k[rows], call.v[rows], ops.arange(n, "int32"), positions, paged,
               ops.astype(valid // bs, "int32"), ops.arange(n + 1, "int32"), positions + 1,
               kv_layout)

    return Adapter(
        "flashinfer.append_paged_kv_cache", write, overrides,
        "FlashInfer flashinfer/page.py append_paged_kv_cache docstring and "
        "include/flashinfer/page.cuh: page = kv_indices[kv_indptr[b] + pos // page_size], entry "
        "pos % page_size; no quantization (the cache holds the input dtype).")


def _swap_axes_1_2(x):
    """[nb, bs, H, D] as [nb, H, bs, D] (or back): a view, NumPy or torch."""
    return x.swapaxes(1, 2)


class _SGLangPool:
    """What `MHATokenToKVPool.set_kv_buffer` reads of its pool (sglang 0.5.x,
    srt/mem_cache/memory_pool.py), over kvoracle's caches: one layer's k_buffer/v_buffer
    [num_slots, H, D] (the NHD pages seen flat), stored as the fp8 dtype's bytes (uint8) when the
    cache is fp8, the model dtype otherwise."""

    def __init__(self, call: Call):
        nb, bs, h, d = call.k_cache.shape
        self.size, self.page_size, self.start_layer, self.layer_num = nb * bs - bs, bs, 0, 1
        self.head_num, self.head_dim, self.v_head_dim = h, d, d
        self.row_dim = self.v_row_dim = h * d
        self.k_buffer = [call.k_cache.reshape(nb * bs, h, d)]
        self.v_buffer = [call.v_cache.reshape(nb * bs, h, d)]
        self.dtype = self.store_dtype = self.k_buffer[0].dtype
        if call.device == "cuda":
            import torch

            self.device = str(call.k_cache.device)
            self.device_module = torch.get_device_module(call.k_cache.device)
            if self.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                self.store_dtype = torch.uint8
                self.k_buffer = [b.view(torch.uint8) for b in self.k_buffer]
                self.v_buffer = [b.view(torch.uint8) for b in self.v_buffer]
        self.alt_stream = None
        self.use_hnd = False
        self.kv_cache_layout = "nhd"
        self.is_quantized_kv_cache = False
        self.requires_physical_write_loc = False
        self.enable_custom_mem_pool = False


class _SGLangLayer:
    layer_id = 0


def sglang_set_kv_buffer(kernel: Callable, *, fp8: bool = False) -> Adapter:
    """SGLang's per-layer store as SGLang calls it: `MHATokenToKVPool.set_kv_buffer(self, layer,
    loc, cache_k, cache_v, k_scale=None, v_scale=None)`, passed as the unbound method (or any
    function of that signature): `self` a pool over kvoracle's NHD caches (_SGLangPool: one layer's
    k_buffer/v_buffer [num_slots, H, D], fp8 stored as uint8), layer with layer_id 0, loc int64
    (SGLang's out_cache_loc), cache_k/cache_v [T, H, D] in the model dtype, k_scale/v_scale Python
    floats (None without fp8). SGLang pads a CUDA graph's batch with its dummy slot 0, never -1:
    the adapter passes the written tokens only. Strided and non-NHD pages are left out (one dense
    [num_slots, H, D] tensor)."""
    overrides: Dict[str, Any] = {"layers": "2D", "layout": "nhd", "act_dtype": "bf16",
                                 "slot_mode": "strict", "slot_type": "i64"}
    if fp8:
        overrides.update(kv_dtype="fp8_e4m3", scale_mode="divide", via_model_dtype=True,
                         scale_in_model_dtype=False, sat="torch", per_head_scale=False)
    else:
        overrides.update(kv_dtype="bf16", scale_mode="none")

    def write(call: Call):
        _require_dense_layer(call, "set_kv_buffer")
        if call.config["layout"] != "nhd":
            raise Unsupported("SGLang's token pool is NHD")
        if "kv_strides" in call.config:  # padded pages do not flatten to [slots, H, D]
            raise Unsupported("SGLang's token pool is one dense [num_slots, H, D] tensor")
        ops = _Ops(call)
        slots = call.slot_mapping[: _tokens(call)]
        rows = ops.nonnegative(slots)
        quantized = call.config["kv_dtype"] != call.config["act_dtype"]
        k_scale = float(call.k_scale[0]) if quantized else None
        v_scale = float(call.v_scale[0]) if quantized else None
        kernel(_SGLangPool(call), _SGLangLayer(), slots[rows], call.k[rows], call.v[rows],
               k_scale, v_scale)

    return Adapter(
        "sglang.set_kv_buffer", write, overrides,
        "SGLang srt/mem_cache/memory_pool.py MHATokenToKVPool.set_kv_buffer (0.5.x): "
        "cache_k.div_(k_scale) on the model-dtype tensor with a Python float: the quotient rounded "
        "to the model dtype (via_model_dtype), the scale not; then .to(fp8) (torch's cast: no "
        "saturation), stored through its uint8 view at k_buffer[layer][loc].")


def sglang_fused_fp8_set_kv_buffer(kernel: Callable) -> Adapter:
    """SGLang's Triton fp8 write `fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc,
    k_scale=None, v_scale=None, page_size=16)` (srt/layers/attention/triton_ops/
    trtllm_fp8_kv_kernel.py, sglang 0.5.0-0.5.10): k/v [T, H, D] in the model dtype; k_cache/
    v_cache the pool's fp8 views [num_slots, H, D] (num_slots a multiple of page_size); cache_loc
    int64 (SGLang's out_cache_loc); scales Python floats, applied as x * (1 / s) with 1 / s in
    fp32 (mul_recip), then Triton's satfinite cast. The kernel does not mask a slot < 0: SGLang
    pads a CUDA graph's batch with its dummy slot 0, never -1, so the adapter passes the written
    tokens only, as for set_kv_buffer (passed a -1, the kernel writes a row before the cache: on
    the H100 21 of 150 cases, reported as writes outside every buffer)."""
    overrides: Dict[str, Any] = {"layers": "2D", "layout": "nhd", "act_dtype": "bf16",
                                 "kv_dtype": "fp8_e4m3", "slot_mode": "strict", "slot_type": "i64",
                                 "scale_mode": "mul_recip", "sat": "satfinite",
                                 "via_model_dtype": False, "scale_in_model_dtype": False,
                                 "per_head_scale": False}

    def write(call: Call):
        _require_dense_layer(call, "fused_fp8_set_kv_buffer")
        if call.config["layout"] != "nhd" or "kv_strides" in call.config:
            raise Unsupported("SGLang's token pool is one dense NHD [num_slots, H, D] tensor")
        nb, bs, h, d = call.k_cache.shape
        # Its blocks are tl.arange(min(H, 8)) heads by tl.arange(min(D, 128)) dims: Triton compiles
        # them only for powers of two (on the H100, 53 of 150 default cases did not compile).
        for what, n in (("min(num_kv_heads, 8)", min(h, 8)), ("min(head_dim, 128)", min(d, 128))):
            if n & (n - 1):
                raise Unsupported(f"fused_fp8_set_kv_buffer compiles only where {what} is a power "
                                  f"of two (Triton's arange)")
        slots = call.slot_mapping[: _tokens(call)]
        rows = _Ops(call).nonnegative(slots)
        kernel(call.k[rows], call.v[rows], call.k_cache.reshape(nb * bs, h, d),
               call.v_cache.reshape(nb * bs, h, d), slots[rows], float(call.k_scale[0]),
               float(call.v_scale[0]), bs)

    return Adapter(
        "sglang.fused_fp8_set_kv_buffer", write, overrides,
        "SGLang trtllm_fp8_kv_kernel.py fused_fp8_set_kv_buffer: inv = 1.0 / scale as an fp32 "
        "tensor, (x * inv).to(float8e4nv), no slot mask (passed the written tokens only).")


# What both of TensorRT-LLM's MiniMax-M3 layer writes imply: the HND pool and a flat index-K cache
# written through the one int32 out_cache_loc, bf16 sources, a plain cast to the cache dtype.
_TRTLLM_MSA: Dict[str, Any] = {"layout": "hnd", "index_layout": "flat", "slot_type": "i32",
                               "slot_mode": "strict", "separate_index_slots": False,
                               "scale_mode": "none", "act_dtype": "bf16"}


def _trtllm_pool(call: Call, engine: str):
    """The HND K and V pages as [num_pages, H, tokens_per_block, D] views (the [nb, 2, H, bs, D]
    pool as buffers[:, 0] and buffers[:, 1], as TensorRT-LLM's get_buffers(layer, "HND") gives)."""
    if call.config["layout"] not in ("hnd", "split_hnd"):
        raise Unsupported(f"{engine}: TensorRT-LLM's MiniMax-M3 pool is HND")
    return _swap_axes_1_2(call.k_view), _swap_axes_1_2(call.v_view)


def trtllm_fused_write_layer_caches(kernel: Callable) -> Adapter:
    """TensorRT-LLM MiniMax-M3's one-launch layer write, `fused_write_layer_caches(k_cache,
    v_cache, idx_cache, out_cache_loc, k, v, idx_k) -> bool`
    (tensorrt_llm/_torch/attention_backend/sparse/minimax_m3/msa_scatter.py @8897d68d): k_cache/
    v_cache [num_pages, H, tokens_per_block, D] HND views; idx_cache [num_pages, 1,
    tokens_per_block, index_dim] (None on a dense layer); out_cache_loc int32 [T]; k/v 2-D
    [T, H * D]; idx_k [T, index_dim] (None on a dense layer). fp8 is a plain cast, no KV scale.
    The kernel returns False where it declines a call (a head_dim that is not a power of two, a
    source that is not row-contiguous): such a case counts as unsupported, never as a pass."""
    overrides = {**_TRTLLM_MSA, "sat": "satfinite"}  # Triton's cast

    def write(call: Call):
        k_cache, v_cache = _trtllm_pool(call, "fused_write_layer_caches")
        t = _tokens(call)
        h, d = call.k.shape[1], call.k.shape[2]
        sparse = call.layer_kind == "sparse"
        idx_cache = call.index_cache[:, None] if sparse else None
        idx_k = call.index_k[:t] if sparse else None
        done = kernel(k_cache, v_cache, idx_cache, call.slot_mapping,
                      call.k[:t].reshape(t, h * d), call.v[:t].reshape(t, h * d), idx_k)
        if done is False:
            raise Unsupported("fused_write_layer_caches declined the call (returned False: head_dim "
                              f"{d} must be a power of two, caches 4-D HND, sources row-contiguous)")

    return Adapter(
        "trtllm.fused_write_layer_caches", write, overrides,
        "TensorRT-LLM msa_scatter.py _fused_paged_scatter_kernel: page = slot // tpb, within = "
        "slot % tpb, stores masked by slot >= 0 (an older version without the mask writes -1 rows "
        "before the cache), .to(cache dtype) with no scale (Triton: satfinite).")


def trtllm_write_kv_slots(kernel: Callable) -> Adapter:
    """TensorRT-LLM's torch fallback for the same layer write, `write_kv_slots(cache,
    out_cache_loc, values, *, layout="HND")` (minimax_m3 common.py), called per cache as the
    fallback calls it: K and V [T, H, D] into their [num_pages, H, tokens_per_block, D] views, and
    index-K [T, 1, index_dim] into [num_pages, 1, tokens_per_block, index_dim]; out_cache_loc int32.
    `cache[page, :, within] = values.to(cache.dtype)` (torch's cast: no saturation, no scale); it
    does not mask negative slots ("callers must provide valid slots"), so -1 padding wraps to the
    last slot (torch indexing): the vllm#43810 class, which kvoracle reports."""
    overrides = {**_TRTLLM_MSA, "sat": "torch"}  # torch's cast

    def write(call: Call):
        k_cache, v_cache = _trtllm_pool(call, "write_kv_slots")
        t = _tokens(call)
        loc = call.slot_mapping
        kernel(k_cache, loc, call.k[:t], layout="HND")
        kernel(v_cache, loc, call.v[:t], layout="HND")
        if call.layer_kind == "sparse":
            kernel(call.index_cache[:, None], loc, call.index_k[:t][:, None], layout="HND")

    return Adapter(
        "trtllm.write_kv_slots", write, overrides,
        "TensorRT-LLM minimax_m3 common.py write_kv_slots: page = loc // tpb, within = loc % tpb, "
        "cache[page, :, within, :] = values.to(cache.dtype), no slot mask, no scale.")


def topk_indexer(kernel: Callable, *, order: str = "descending_score",
                 layout: str = "token_major", key_bits: int = 32) -> Adapter:
    """A block top-k indexer in an engine's declared form (SPEC 5): kernel(call) returns ids int32,
    each row in the engine's order ("descending_score": vLLM's Triton M3 indexer; "ascending_ids":
    TensorRT-LLM MSA, vLLM's SM100 path; "unordered"), -1 after the kept blocks; laid out
    [T, H_kv, K] ("token_major") or [H_kv, T, K] ("head_major": vLLM's Triton M3 indexer, stored
    as its bytes in call.ids); ranked by exact scores (key_bits=32) or by score keys of that many
    bits (16: MSA's msa_v1), which widens the tie-aware bound by one key step."""

    def indexer(call: Call):
        ids = kernel(call)
        if layout == "head_major" and ids is not None:
            ids = ids.reshape(call.ids.shape)  # the head-major bytes, in the output's buffer
        return ids

    form = ",".join([order] + ([layout] if layout != "token_major" else []) +
                    ([f"keys{key_bits}"] if key_bits != 32 else []))
    return Adapter("topk_indexer", indexer, {}, "the engine's declared order and layout",
                   ordering="foreign", topk_order=form)


def foreign_attention(kernel: Callable, *, profile: str = "fp32") -> Adapter:
    """An attention kernel judged against the float64 truth within the bound of its arithmetic
    profile ("fp32", "bf16_p", "fp16_p": SPEC principle 4): kernel(call) returns out
    [Tq, nq, hd] in call.params['out_dtype'], or writes call.out."""

    def attention(call: Call):
        return kernel(call)

    return Adapter("foreign_attention", attention, {}, "declared arithmetic profile",
                   ordering="foreign", profile=profile)
