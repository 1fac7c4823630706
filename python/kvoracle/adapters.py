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


def vllm_reshape_and_cache_flash(kernel: Callable, *, fp8: bool = False) -> Adapter:
    """vLLM's `reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
    kv_cache_dtype, k_scale, v_scale)`: key/value [T_src, H, D] (T = slot_mapping.size(0), the
    rows past it are CUDA-graph padding); key_cache/value_cache [num_blocks, block_size, H, D] with
    the layout's strides (NHD, HND by strides, vLLM's packed and split pools the same way);
    slot_mapping int64, -1 skipped; k_scale/v_scale [1] or [H]. Dense layers (K and V only)."""
    overrides: Dict[str, Any] = {"layers": "2D", "slot_type": "i64", "slot_mode": "strict",
                                 **(_VLLM_FP8 if fp8 else _VLLM_AUTO)}

    def write(call: Call):
        _require_dense_layer(call, "reshape_and_cache_flash")
        kernel(call.k, call.v, call.k_view, call.v_view, call.slot_mapping,
               vllm_kv_cache_dtype(call.config), call.k_scale, call.v_scale)

    return Adapter(
        "vllm.reshape_and_cache_flash", write, overrides,
        "vLLM csrc/cache_kernels.cu: slot_idx < 0 returns early; num_tokens = slot_mapping.size(0); "
        "block/page/head strides taken from the cache tensor; fp8 through scaled_fp8_conversion "
        "= __nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE) in fp32 (research/anchors_kvcache.md "
        "1.3, 1.6). Its Triton twin divides approximately: declare scale_mode='div_approx' for it "
        "(peer_findings.md 1).")


def vllm_indexer_k_quant_and_cache(kernel: Callable, kv_write: Adapter, *,
                                   ue8m0: bool = False) -> Adapter:
    """A sparse layer as vLLM writes it: `kv_write` (an adapter that writes K and V, e.g.
    vllm_reshape_and_cache_flash) then `indexer_k_quant_and_cache(k, kv_cache, slot_mapping,
    quant_block_size, scale_fmt)`: k [T_src, index_dim]; kv_cache [num_blocks, block_size,
    index_dim + index_dim / 128 * 4] uint8, a byte-count view of the block-major page (all fp8
    rows, then all fp32 scales); quant_block_size 128; scale_fmt "ue8m0" or ""."""
    overrides = dict(kv_write.overrides)
    overrides.update(layers="2S", index_layout="blockscale", index_dim=128, ue8m0=ue8m0,
                     blockscale_scale="divide", separate_index_slots=False)

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
        kernel(call.index_k, page, call.slot_mapping, 128, "ue8m0" if ue8m0 else "")

    return Adapter(
        "vllm.indexer_k_quant_and_cache", write, overrides,
        "vLLM csrc/cache_kernels.cu indexer_k_quant_and_cache: scale = fmaxf(amax, 1e-4) / 448 in "
        "fp32 (ue8m0: a power of two, rounded up), values cvt_satfinite(x / scale), the page "
        "block-major: B * index_dim fp8 bytes then B * index_dim / 128 fp32 scales "
        "(research/anchors_kvcache.md 1.5); peer_findings.md: 16/16 identical.")


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
        "scaled_convert(x, *scale) = cvt_satfinite(x / scale) (research/anchors_kvcache.md 1.4).")


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
        "pos % page_size; no quantization (the cache holds the input dtype); "
        "peer_findings.md: its pure-torch reference identical on 92/92 cases.")


def sglang_set_kv_buffer(kernel: Callable, *, fp8: bool = False) -> Adapter:
    """SGLang's per-layer store, `MHATokenToKVPool.set_kv_buffer`'s body:
    kernel(k_buffer, v_buffer, loc, cache_k, cache_v, k_scale, v_scale) with k_buffer/v_buffer
    [num_slots, H, D] token-major (kvoracle's NHD cache seen flat), loc int64 of the written
    tokens, k_scale/v_scale Python floats (None without fp8). SGLang pads with a dummy slot, never
    -1, so padding tokens are not passed."""
    overrides: Dict[str, Any] = {"layers": "2D", "layout": "nhd", "act_dtype": "bf16",
                                 "slot_mode": "strict"}
    if fp8:
        overrides.update(kv_dtype="fp8_e4m3", scale_mode="divide", via_model_dtype=True,
                         scale_in_model_dtype=False, sat="torch", per_head_scale=False)
    else:
        overrides.update(kv_dtype="bf16", scale_mode="none")

    def write(call: Call):
        _require_dense_layer(call, "set_kv_buffer")
        if call.config["layout"] != "nhd":
            raise Unsupported("SGLang's token pool is NHD")
        if "kv_strides" in call.config:  # SPEC 3: padded pages do not flatten to [slots, H, D]
            raise Unsupported("SGLang's token pool is one dense [num_slots, H, D] tensor")
        ops = _Ops(call)
        slots = call.slot_mapping[: _tokens(call)]
        rows = ops.nonnegative(slots)
        nb, bs, h, d = call.k_cache.shape
        k_buffer = call.k_cache.reshape(nb * bs, h, d)
        v_buffer = call.v_cache.reshape(nb * bs, h, d)
        quantized = call.config["kv_dtype"] != call.config["act_dtype"]
        k_scale = float(call.k_scale[0]) if quantized else None
        v_scale = float(call.v_scale[0]) if quantized else None
        kernel(k_buffer, v_buffer, slots[rows], call.k[rows], call.v[rows], k_scale, v_scale)

    return Adapter(
        "sglang.set_kv_buffer", write, overrides,
        "SGLang mem_cache/memory_pool.py set_kv_buffer: cache_k.div_(k_scale) on the model-dtype "
        "tensor with a Python float: the quotient rounded to the model dtype (via_model_dtype), "
        "the scale not (measured on the H200 with torch 2.11: mode detection of x / s.item() "
        "names via_model_dtype=true scale_in_model_dtype=false); then .to(fp8) (torch's cast: no "
        "saturation, peer_findings.md 5), then k_buffer[loc] = cache_k.")


def trtllm_msa_fused_write(kernel: Callable) -> Adapter:
    """TensorRT-LLM MiniMax-M3's fused K/V/index-K write (the seed):
    kernel(k, v, index_k, k_cache, v_cache, index_cache, slot_mapping) with k/v [T_src, H, D], the
    caches in kvoracle's HND views (k_cache/v_cache [num_blocks, H, block_size, D]; the
    [num_blocks, 2, H, block_size, D] pool as kvoracle's split_hnd, where v_cache is None and
    k_cache the pool), index_cache [num_blocks, block_size, index_dim] (flat), slot_mapping
    int64 with -1 padding."""
    overrides = {"layout": "hnd", "index_layout": "flat", "slot_type": "i64", "slot_mode": "strict",
                 "separate_index_slots": False,
                 "scale_mode": "none", "sat": "satfinite"}

    def write(call: Call):
        if call.config["layout"] not in ("hnd", "split_hnd"):
            raise Unsupported("the MSA pool is HND")
        kernel(call.k, call.v, call.index_k, call.k_cache, call.v_cache, call.index_cache,
               call.slot_mapping)

    return Adapter(
        "trtllm.msa_fused_write", write, overrides,
        "TensorRT-LLM _torch/attention_backend/sparse/minimax_m3/msa_scatter.py "
        "fused_write_layer_caches (research/anchors_kvcache.md): HND pool, the slot < 0 check, "
        "fp8 without a KV scale; peer_findings.md: identical on 20/20 (satfinite, scale none).")


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
