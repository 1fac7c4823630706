// The dense-layer fused insert (SPEC 4, vLLM MiniMax-M3 qknorm + rope + insert): ONE launch per
// layer; one warp per (token, head slot), head slots = nq q heads, then nkv k heads, then nkv v
// heads. A lane owns E = hd / 32 contiguous dims.
//
// Canonical order per q/k head vector x (fp32, widened exactly):
//   sq_i = fl(x_i * x_i); ms = fl(tree_sum(sq) / hd), the tree sum of SPEC 6.1 (distance hd/2 down
//   to E across lanes by shuffles, then E/2 down to 1 inside the lane: the same pairs, the same
//   order); r = fl(1 / fl(sqrt(fl(ms + eps)))); y_i = fl(fl(x_i * r) * fl(1 + w_i)); RoPE on pairs
//   (i, i + rot/2), i < rot/2: fma(y_i, c, -fl(y_j * s)), fma(y_j, c, fl(y_i * s)), the partner
//   read from the warp's shared row (pre-rotation values).
// q: rounded to the activation dtype into q_out [T, nq, hd]; k (normed, rotated) and v (as is): the
// SPEC 4 insert (scale by the mode with s, or s rounded to the activation dtype under
// scale_in_model_dtype; via_model_dtype; cast) at the slot's page and offset; padding skipped.
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "kvo/spec/outcome.hpp"
#include "launch.cuh"

namespace kvo::gpu {
namespace detail {
namespace {

constexpr int kWarps = 8;

struct DenseParams {
  const void* q;            ///< [>= T, nq, hd] act
  const void* k;            ///< [>= T, nkv, hd] act
  const void* v;            ///< [>= T, nkv, hd] act
  const float* q_w;         ///< [hd]
  const float* k_w;         ///< [hd]
  const float* cos_sin;     ///< [max_pos, rot]
  const std::int64_t* pos;  ///< [T]
  const void* slots;        ///< [T] int32/int64
  const float* k_scale;     ///< [1] or [nkv]
  const float* v_scale;     ///< [1] or [nkv]
  void* q_out;              ///< [T, nq, hd] act
  std::uint8_t* k_cache;    ///< K body (or KV)
  std::uint8_t* v_cache;    ///< V body (or KV + kv_part elements)
  KvStrides st;
  std::int64_t tokens, block_size, capacity;
  std::int32_t nq, nkv, rot;
  float eps;
  bool slots_i64, legacy_wrap, per_head_scale, via_model, scale_in_model;
  ScaleMode scale_mode;
  Saturation sat;
};

/// One element cast to the cache dtype C at dst.
template <DType C>
__device__ __forceinline__ void store1(std::uint8_t* dst, float y, Saturation sat) {
  if constexpr (C == DType::kF32) {
    *reinterpret_cast<float*>(dst) = y;
  } else if constexpr (C == DType::kBF16) {
    *reinterpret_cast<unsigned short*>(dst) = __bfloat16_as_ushort(__float2bfloat16_rn(y));
  } else if constexpr (C == DType::kF16) {
    *reinterpret_cast<unsigned short*>(dst) = __half_as_ushort(__float2half_rn(y));
  } else {
    *dst = static_cast<std::uint8_t>(
        sat == Saturation::kSatFinite
            ? static_cast<std::uint32_t>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, kFp8Kind<C>))
            : fp8_code_soft<C>(y, sat));
  }
}

template <DType A, DType C, int E>
__global__ void __launch_bounds__(kWarps * 32) dense_insert_kernel(const DenseParams p) {
  using Act = typename ActTraits<A>::T;
  constexpr int kHd = 32 * E;
  __shared__ float row[kWarps][kHd];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t slots_per_token = p.nq + 2 * p.nkv;
  const std::int64_t gw = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp;
  if (gw >= p.tokens * slots_per_token) return;  // uniform per warp
  const std::int64_t t = gw / slots_per_token;
  const int j = static_cast<int>(gw - t * slots_per_token);
  const int kind = j < p.nq ? 0 : (j < p.nq + p.nkv ? 1 : 2);  // q, k, v
  const int h = kind == 0 ? j : (kind == 1 ? j - p.nq : j - p.nq - p.nkv);
  const int heads = kind == 0 ? p.nq : p.nkv;
  const Act* src = static_cast<const Act*>(kind == 0 ? p.q : (kind == 1 ? p.k : p.v)) +
                   (t * heads + h) * kHd + lane * E;
  float y[E];
#pragma unroll
  for (int i = 0; i < E; ++i) {
    if constexpr (A == DType::kF32) {
      y[i] = src[i];
    } else if constexpr (A == DType::kBF16) {
      y[i] = __bfloat162float(src[i]);
    } else {
      y[i] = __half2float(src[i]);
    }
  }
  if (kind != 2) {
    float sq[E];
#pragma unroll
    for (int i = 0; i < E; ++i) sq[i] = __fmul_rn(y[i], y[i]);
#pragma unroll
    for (int lanes = 16; lanes >= 1; lanes >>= 1) {  // element distance lanes * E >= E
#pragma unroll
      for (int i = 0; i < E; ++i)
        sq[i] = __fadd_rn(sq[i], __shfl_down_sync(0xFFFFFFFFu, sq[i], lanes));
    }
#pragma unroll
    for (int m = E / 2; m >= 1; m >>= 1) {
#pragma unroll
      for (int i = 0; i < m; ++i) sq[i] = __fadd_rn(sq[i], sq[i + m]);
    }
    const float sum = __shfl_sync(0xFFFFFFFFu, sq[0], 0);
    const float ms = __fdiv_rn(sum, static_cast<float>(kHd));
    const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, p.eps)));
    const float* w = kind == 0 ? p.q_w : p.k_w;
#pragma unroll
    for (int i = 0; i < E; ++i) {
      y[i] = __fmul_rn(__fmul_rn(y[i], r), __fadd_rn(1.0f, w[lane * E + i]));
      row[warp][lane * E + i] = y[i];
    }
    __syncwarp();
    const int half = p.rot / 2;
    const float* cs = p.cos_sin + p.pos[t] * p.rot;
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int e = lane * E + i;
      if (e < half) {
        y[i] = __fmaf_rn(y[i], cs[e], -__fmul_rn(row[warp][e + half], cs[half + e]));
      } else if (e < p.rot) {
        y[i] = __fmaf_rn(y[i], cs[e - half], __fmul_rn(row[warp][e - half], cs[e]));
      }
    }
  }
  if (kind == 0) {
    Act* out = static_cast<Act*>(p.q_out) + (t * p.nq + h) * kHd + lane * E;
#pragma unroll
    for (int i = 0; i < E; ++i) {
      if constexpr (A == DType::kF32) {
        out[i] = y[i];
      } else if constexpr (A == DType::kBF16) {
        out[i] = __float2bfloat16_rn(y[i]);
      } else {
        out[i] = __float2half_rn(y[i]);
      }
    }
    return;
  }
  std::int64_t slot = p.slots_i64 ? static_cast<const std::int64_t*>(p.slots)[t]
                                  : static_cast<const std::int32_t*>(p.slots)[t];
  if (p.legacy_wrap && slot < 0) slot += p.capacity;
  if (slot < 0) return;
  const std::int64_t page = slot / p.block_size, off = slot - page * p.block_size;
  const float s = effective_scale<A>((kind == 1 ? p.k_scale : p.v_scale)[p.per_head_scale ? h : 0],
                                     p.scale_in_model);
  std::uint8_t* cache = kind == 1 ? p.k_cache : p.v_cache;
  const std::int64_t base = page * p.st.block + off * p.st.token + h * p.st.head + lane * E;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    // NaN: the norm and rope arithmetic and the scaling return the GPU's canonical NaN, as SPEC 2
    // says; only scale none hands a V input NaN to the cast as it is.
    float v = scale1(y[i], p.scale_mode, s);
    if (p.via_model) v = round_to_act<A>(v);
    store1<C>(cache + (base + i) * kBytes<C>, v, p.sat);
  }
}

template <DType A, DType C>
void launch_e(const DenseParams& p, int e, unsigned blocks) {
  switch (e) {
    case 1:
      return dense_insert_kernel<A, C, 1><<<blocks, kWarps * 32>>>(p);
    case 2:
      return dense_insert_kernel<A, C, 2><<<blocks, kWarps * 32>>>(p);
    case 4:
      return dense_insert_kernel<A, C, 4><<<blocks, kWarps * 32>>>(p);
    default:
      return dense_insert_kernel<A, C, 8><<<blocks, kWarps * 32>>>(p);
  }
}

template <DType A>
void launch_c(const DenseParams& p, DType cache, int e, unsigned blocks) {
  switch (cache) {
    case DType::kF32:
      return launch_e<A, DType::kF32>(p, e, blocks);
    case DType::kBF16:
      return launch_e<A, DType::kBF16>(p, e, blocks);
    case DType::kF16:
      return launch_e<A, DType::kF16>(p, e, blocks);
    case DType::kFp8E4M3:
      return launch_e<A, DType::kFp8E4M3>(p, e, blocks);
    case DType::kFp8E5M2:
      return launch_e<A, DType::kFp8E5M2>(p, e, blocks);
  }
}

/// Device copies freed at scope exit.
struct DeviceBuffers {
  std::vector<void*> ptrs;
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
  void* put(const void* src, std::size_t n) {
    void* d = nullptr;
    check_cuda(cudaMalloc(&d, n < 16 ? 16 : n), "cudaMalloc(dense insert)");
    ptrs.push_back(d);
    if (src != nullptr && n > 0)
      check_cuda(cudaMemcpy(d, src, n, cudaMemcpyHostToDevice), "cudaMemcpy(dense insert)");
    return d;
  }
};

}  // namespace
}  // namespace detail

spec::HostTensor dense_insert_host(const spec::ModelConfig& c, const spec::DenseInsert& in,
                                   spec::LayerCaches& caches) {
  using namespace detail;
  spec::validate(c);
  spec::validate_dense_insert(c, in);
  const spec::CacheGeometry& g = c.geometry;
  const std::int64_t hd = g.head_dim;
  if (hd != 32 && hd != 64 && hd != 128 && hd != 256) {
    throw spec::Unsupported("the fused dense insert kernel takes head_dim 32, 64, 128 or 256");
  }
  const bool one = spec::kv_in_one_tensor(c.layout);
  spec::CacheBuffer* kb = caches.find(one ? spec::BufferKind::kKv : spec::BufferKind::kK);
  spec::CacheBuffer* vb = one ? kb : caches.find(spec::BufferKind::kV);
  if (kb == nullptr || vb == nullptr || kb->body_bytes() != kv_buffer_bytes(c) ||
      vb->body_bytes() != kv_buffer_bytes(c)) {
    throw spec::InvalidInput("caches", -1, "K/V", "missing or of the wrong size");
  }
  const auto tokens = static_cast<std::int64_t>(in.kv.slots.slots.size());
  const std::int64_t nq = in.q.shape[1];
  std::vector<std::uint8_t> slots(in.kv.slots.slots.size() *
                                  (c.slot_type == spec::SlotType::kI64 ? 8 : 4));
  for (std::size_t i = 0; i < in.kv.slots.slots.size(); ++i) {
    if (c.slot_type == spec::SlotType::kI64) {
      std::memcpy(slots.data() + i * 8, &in.kv.slots.slots[i], 8);
    } else {
      const auto v = static_cast<std::int32_t>(in.kv.slots.slots[i]);
      std::memcpy(slots.data() + i * 4, &v, 4);
    }
  }
  DeviceBuffers d;
  DenseParams p{};
  p.q = d.put(in.q.bytes.data(), in.q.bytes.size());
  p.k = d.put(in.kv.k.bytes.data(), in.kv.k.bytes.size());
  p.v = d.put(in.kv.v.bytes.data(), in.kv.v.bytes.size());
  p.q_w = static_cast<const float*>(d.put(in.q_norm_weight.data(), in.q_norm_weight.size() * 4));
  p.k_w = static_cast<const float*>(d.put(in.k_norm_weight.data(), in.k_norm_weight.size() * 4));
  p.cos_sin = static_cast<const float*>(d.put(in.cos_sin.data(), in.cos_sin.size() * 4));
  p.pos = static_cast<const std::int64_t*>(d.put(in.positions.data(), in.positions.size() * 8));
  p.slots = d.put(slots.data(), slots.size());
  p.k_scale = static_cast<const float*>(d.put(in.kv.k_scale.data(), in.kv.k_scale.size() * 4));
  p.v_scale = static_cast<const float*>(d.put(in.kv.v_scale.data(), in.kv.v_scale.size() * 4));
  const std::size_t q_bytes =
      static_cast<std::size_t>(tokens * nq * hd) * spec::dtype_bytes(c.act_dtype);
  p.q_out = d.put(nullptr, q_bytes);
  auto* kst = static_cast<std::uint8_t*>(d.put(kb->storage.data(), kb->storage.size()));
  auto* vst = one ? kst : static_cast<std::uint8_t*>(d.put(vb->storage.data(), vb->storage.size()));
  p.st = kv_strides(g, c.layout);
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  p.k_cache = kst + kb->guard_bytes;
  p.v_cache = vst + vb->guard_bytes + (one ? p.st.kv_part * eb : 0);
  p.st.kv_part = 0;
  p.tokens = tokens;
  p.block_size = g.block_size;
  p.capacity = g.capacity();
  p.nq = static_cast<std::int32_t>(nq);
  p.nkv = static_cast<std::int32_t>(g.num_kv_heads);
  p.rot = static_cast<std::int32_t>(in.rotary_dim);
  p.eps = in.eps;
  p.slots_i64 = c.slot_type == spec::SlotType::kI64;
  p.legacy_wrap = c.slot_mode == spec::SlotMode::kLegacyWrap;
  p.per_head_scale = c.kv.per_head_scale;
  p.via_model = c.kv.via_model_dtype;
  p.scale_in_model = c.kv.scale_in_model_dtype;
  p.scale_mode = c.kv.scale_mode;
  p.sat = c.kv.saturation;
  spec::HostTensor q_out;
  q_out.dtype = c.act_dtype;
  q_out.shape = {tokens, nq, hd};
  q_out.bytes.resize(q_bytes);
  if (tokens > 0) {
    const std::int64_t warps = tokens * (nq + 2 * g.num_kv_heads);
    const auto blocks = static_cast<unsigned>((warps + kWarps - 1) / kWarps);
    const int e = static_cast<int>(hd / 32);
    switch (c.act_dtype) {
      case DType::kF32:
        launch_c<DType::kF32>(p, c.kv.cache_dtype, e, blocks);
        break;
      case DType::kBF16:
        launch_c<DType::kBF16>(p, c.kv.cache_dtype, e, blocks);
        break;
      default:
        launch_c<DType::kF16>(p, c.kv.cache_dtype, e, blocks);
        break;
    }
    check_cuda(cudaGetLastError(), "launch of the dense insert kernel");
    check_cuda(cudaDeviceSynchronize(), "dense insert kernel");
  }
  check_cuda(cudaMemcpy(q_out.bytes.data(), p.q_out, q_bytes, cudaMemcpyDeviceToHost),
             "cudaMemcpy(q_out)");
  check_cuda(cudaMemcpy(kb->storage.data(), kst, kb->storage.size(), cudaMemcpyDeviceToHost),
             "cudaMemcpy(K)");
  if (!one)
    check_cuda(cudaMemcpy(vb->storage.data(), vst, vb->storage.size(), cudaMemcpyDeviceToHost),
               "cudaMemcpy(V)");
  return q_out;
}

}  // namespace kvo::gpu
