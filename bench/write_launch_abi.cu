// libkvo_bench_write: kvoracle's fused write and the write benchmarks' setup behind a C ABI, for
// bench_write_peer.py (ctypes), which times this kernel and the Triton peer in one process, on the
// same torch buffers, through one timing function. Everything a point is (flavours, configuration,
// slots, bytes moved) comes from write_bench_setup.hpp, as in bench_write_gpu; the empty launch and
// the copy bandwidth are gpu_bench.cuh's, measured in the caller's process.
//
// Errors: a function that can fail returns -1 (or a negative figure) and writes the message into
// `error` [error_len] chars, NUL-terminated; none throws across the ABI.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include "gpu_bench.cuh"
#include "kvo/gpu/write.hpp"
#include "kvo/spec/outcome.hpp"
#include "write_bench_setup.hpp"

namespace {

using kvo::bench::kNumWriteFlavours;
using kvo::bench::kWriteFlavours;
using kvo::bench::WriteFlavour;

const WriteFlavour& flavour_at(int f) {
  if (f < 0 || f >= kNumWriteFlavours) {
    throw kvo::spec::InvalidInput("flavour", f, std::to_string(f),
                                  "not in 0.." + std::to_string(kNumWriteFlavours - 1));
  }
  return kWriteFlavours[f];
}

void put_error(const std::exception& e, char* error, std::int64_t error_len) {
  if (error == nullptr || error_len <= 0) return;
  std::strncpy(error, e.what(), static_cast<std::size_t>(error_len) - 1);
  error[error_len - 1] = '\0';
}

/// Runs `body`, turning an exception into `fail` and the message in `error`.
template <class T, class Body>
T guarded(T fail, char* error, std::int64_t error_len, Body body) {
  try {
    return body();
  } catch (const std::exception& e) {
    put_error(e, error, error_len);
    return fail;
  }
}

}  // namespace

// Only the C entry points are exported (the library is built with hidden visibility).
#define KVO_BENCH_API __attribute__((visibility("default")))

extern "C" {

KVO_BENCH_API int kvo_bench_num_flavours() { return kNumWriteFlavours; }

/// Whether kvoracle's fused write takes its specialised kernel for this flavour's sparse layers.
KVO_BENCH_API int kvo_bench_flavour_specialised(int f) {
  if (f < 0 || f >= kNumWriteFlavours) return -1;
  return kvo::gpu::fused_write_is_specialised(
             kvo::bench::write_bench_config(kWriteFlavours[f], kvo::bench::bench_num_blocks(1)),
             kvo::spec::LayerKind::kSparse)
             ? 1
             : 0;
}

/// The flavour's name, fp8 (1) or bf16 (0) caches, scale mode ("divide", "mul_recip", "none") and
/// K/V scale value; f out of range: null / -1.
KVO_BENCH_API const char* kvo_bench_flavour_name(int f) {
  return f >= 0 && f < kNumWriteFlavours ? kWriteFlavours[f].name.data() : nullptr;
}
KVO_BENCH_API int kvo_bench_flavour_fp8(int f) {
  return f >= 0 && f < kNumWriteFlavours ? (kWriteFlavours[f].fp8 ? 1 : 0) : -1;
}
KVO_BENCH_API const char* kvo_bench_flavour_scale_mode(int f) {
  return f >= 0 && f < kNumWriteFlavours ? kvo::spec::name_of(kWriteFlavours[f].scale_mode).data()
                                         : nullptr;
}
KVO_BENCH_API float kvo_bench_flavour_scale(int f) {
  return f >= 0 && f < kNumWriteFlavours ? kWriteFlavours[f].scale : -1.0f;
}

/// The model's layer mix as "D"/"S" per layer, e.g. "DDDSSS...": [60] chars, NUL-terminated.
KVO_BENCH_API const char* kvo_bench_layer_kinds() {
  static const std::string kinds = [] {
    std::string s;
    for (kvo::spec::LayerKind k : kvo::spec::parse_layer_mix(kvo::spec::kDefaultLayerMix))
      s += k == kvo::spec::LayerKind::kSparse ? 'S' : 'D';
    return s;
  }();
  return kinds.c_str();
}

KVO_BENCH_API std::int64_t kvo_bench_num_blocks(std::int64_t tokens) {
  return kvo::bench::bench_num_blocks(tokens);
}
KVO_BENCH_API std::int64_t kvo_bench_block_size() { return kvo::bench::kBenchBlockSize; }
KVO_BENCH_API std::int64_t kvo_bench_kv_heads() { return kvo::bench::kBenchKvHeads; }
KVO_BENCH_API std::int64_t kvo_bench_head_dim() { return kvo::bench::kBenchHeadDim; }
KVO_BENCH_API std::int64_t kvo_bench_index_dim() { return kvo::bench::kBenchIndexDim; }

/// Body bytes of the packed K/V tensor and of the index-K cache of one layer; -1 on error.
KVO_BENCH_API std::int64_t kvo_bench_kv_bytes(int f, std::int64_t num_blocks, char* error,
                                              std::int64_t error_len) {
  return guarded<std::int64_t>(-1, error, error_len, [&] {
    return kvo::gpu::kv_buffer_bytes(kvo::bench::write_bench_config(flavour_at(f), num_blocks));
  });
}
KVO_BENCH_API std::int64_t kvo_bench_index_bytes(int f, std::int64_t num_blocks, char* error,
                                                 std::int64_t error_len) {
  return guarded<std::int64_t>(-1, error, error_len, [&] {
    return kvo::gpu::index_buffer_bytes(kvo::bench::write_bench_config(flavour_at(f), num_blocks));
  });
}

/// The benchmarks' slot pattern: out [tokens] int64.
KVO_BENCH_API void kvo_bench_slots(std::int64_t tokens, std::int64_t num_blocks,
                                   std::int64_t* out) {
  const std::vector<std::int64_t> s = kvo::bench::bench_slots(tokens, num_blocks);
  std::memcpy(out, s.data(), s.size() * sizeof(std::int64_t));
}

/// Bytes one fused write of a layer reads and writes (sparse: 1, dense: 0); -1 on a bad flavour.
KVO_BENCH_API double kvo_bench_layer_bytes(int f, int sparse, std::int64_t tokens) {
  if (f < 0 || f >= kNumWriteFlavours) return -1;
  return kvo::bench::bench_layer_bytes(
      kWriteFlavours[f], sparse ? kvo::spec::LayerKind::kSparse : kvo::spec::LayerKind::kDense,
      tokens);
}

/// kvo::gpu::launch_fused_write of one layer (generic != 0: launch_fused_write_generic, the
/// generic kernel whatever the configuration) on `stream` (a cudaStream_t; may be capturing):
/// k, v [tokens, 4, 128] bf16; index_k [tokens, 128] bf16 (sparse only); slots [tokens] int64;
/// k_scale, v_scale [1] fp32; kv_cache the packed [nb, 4, bs, 256] tensor; index_cache the flat
/// or blockscale cache (sparse only). Returns the launches (1, or 0 without tokens), -1 on error.
KVO_BENCH_API int kvo_bench_fused_write(int f, std::int64_t num_blocks, int sparse, const void* k,
                                        const void* v, const void* index_k, const void* slots,
                                        const float* k_scale, const float* v_scale,
                                        std::int64_t tokens, void* kv_cache, void* index_cache,
                                        void* stream, int pdl, int generic, char* error,
                                        std::int64_t error_len) {
  return guarded(-1, error, error_len, [&] {
    const kvo::spec::ModelConfig c = kvo::bench::write_bench_config(flavour_at(f), num_blocks);
    kvo::gpu::DeviceWriteInputs in;
    in.k = k;
    in.v = v;
    in.index_k = index_k;
    in.slots = slots;
    in.k_scale = k_scale;
    in.v_scale = v_scale;
    in.num_tokens = tokens;
    kvo::gpu::DeviceLayerCaches caches;
    caches.k = kv_cache;
    caches.index_k = index_cache;
    const auto kind = sparse ? kvo::spec::LayerKind::kSparse : kvo::spec::LayerKind::kDense;
    return generic != 0
               ? kvo::gpu::launch_fused_write_generic(c, kind, in, caches, stream, pdl != 0)
               : kvo::gpu::launch_fused_write(c, kind, in, caches, stream, pdl != 0);
  });
}

/// gpu_bench.cuh's empty launch (60 in a graph, per launch) in us, and the device-to-device copy
/// bandwidth (read + written) in GB/s; -1 on error.
KVO_BENCH_API double kvo_bench_empty_launch_us(int pdl, char* error, std::int64_t error_len) {
  return guarded(-1.0, error, error_len,
                 [&] { return kvo::bench::empty_launch_s(pdl != 0) * 1e6; });
}
KVO_BENCH_API double kvo_bench_copy_gbps(char* error, std::int64_t error_len) {
  return guarded(-1.0, error, error_len,
                 [&] { return kvo::bench::copy_bandwidth().best() * 1e-9; });
}

}  // extern "C"
