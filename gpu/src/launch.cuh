#pragma once
/// \file launch.cuh
/// What the fused and unfused launchers share on the host: the kernel parameter block, the layout
/// strides (gpu's own arithmetic of SPEC 3), the config and pointer checks, the CUDA error
/// conversion into spec::FailedToRun, and the host-memory write path with the fused launcher as a
/// parameter (so that kvo_gpu_testing runs it over its planted-bug launchers).

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "convert.cuh"
#include "kvo/gpu/write.hpp"
#include "kvo/spec/config.hpp"

namespace kvo::gpu::detail {

/// A bug planted in the fused write kernel (kvo_gpu_testing's WriteFault), a template parameter of
/// launch_fused_write_t (write_fused.cuh); kNone in production.
enum class WriteBug : std::uint8_t {
  kNone,
  kWrapNegativeSlots,  ///< a padding slot -1 wraps to the last slot, as torch indexing does
  kOffsetPlusOne,      ///< K/V/index rows land one offset further into the block
  kSwapHndNhd,         ///< the kernel uses the HND strides for an NHD cache and vice versa
  /// div_approx: each K/V element stores the code one step beyond its admissible set (outside
  /// cvt of every quotient within 2 ulp); other scale modes as in production.
  kDivApproxOneCodeBeyond,
  kE4m3IntoE5m2,          ///< an fp8_e5m2 cache receives e4m3 codes (vLLM's Triton wrapper)
  kTruncDivNegativeSlot,  ///< slot -1 -> page 0, offset -1 (Triton's truncating // and %)
  kStridedAssumedDense,   ///< a strided view (SPEC 3) addressed as the layout's dense tensor
  kPerHeadScaleAsHead0,   ///< per-head K/V scales read as head 0's (a scalar-scale kernel)
  kInt32Offset,           ///< K/V element offsets in int32: past 2^31 they wrap (vllm#50427)
  kZeroGroupScale,        ///< blockscale without the amax floor: a zero group gets scale 0
  kFp8FlushToZero,        ///< fp8 K/V: a subnormal code flushed to signed zero
  kRoundHalfAway,         ///< fp8 K/V: a tie rounded away from zero, not to even
  kVectorTailOverrun,     ///< a head row of 8 (mod 16) bytes stored with 16-byte vectors
  kTornWrapRace,          ///< a slot several tokens write: even bytes the first's, odd the last's
};

/// How the index-K row of a sparse layer is stored.
enum class IndexMode : std::uint8_t { kNone, kFlatBf16, kFlatFp8, kBlockScale };

/// Everything one fused launch needs; passed by value as the kernel parameter. Shapes: T tokens,
/// nkv heads, hd head dim, idim index dim, nb blocks of bs slots.
struct FusedParams {
  const void* k = nullptr;            ///< [>= T, nkv, hd] act
  const void* v = nullptr;            ///< [>= T, nkv, hd] act
  const void* index_k = nullptr;      ///< [>= T, idim] act
  const void* slots = nullptr;        ///< [T] int32/int64
  const void* index_slots = nullptr;  ///< [T]; == slots when there is no separate mapping
  const float* k_scale = nullptr;     ///< [1] or [nkv]
  const float* v_scale = nullptr;     ///< [1] or [nkv]
  void* k_cache = nullptr;            ///< K (or KV) body
  void* v_cache = nullptr;            ///< V body; for one-tensor layouts K body + kv_part elements
  std::uint8_t* index_cache = nullptr;
  KvStrides st;
  std::int64_t num_tokens = 0;
  std::int64_t block_size = 1;
  std::int64_t capacity = 0;
  /// The index-K view's block and token strides (SPEC 3; index_cache at its first element): flat
  /// in elements, blockscale in bytes (token: idim, each block's values then scales packed).
  std::int64_t index_block = 0, index_token = 0;
  std::int32_t nkv = 1, hd = 8, idim = 0, groups = 0;
  std::int32_t tile_tokens = 1;  ///< tokens per thread block
  FastDiv items_per_token;       ///< K/V items (+ flat index items) of one token
  FastDiv row_items;             ///< nkv * hd / 8: items of one K (or V) row
  FastDiv head_items;            ///< hd / 8
  FastDiv groups_div;            ///< idim / 128 (blockscale)
  std::int32_t kv_items = 0;     ///< 2 * row_items
  FastDiv bs_div;                ///< block_size, valid when bs_fast
  bool bs_fast = false;          ///< every slot < 2^31: page = bs_div.quo(slot)
  bool pdl = false;              ///< programmatic dependent launch (griddepcontrol)
  bool small = false;            ///< one item per thread: the short (1-item) instantiation
  bool pdl_early = false;        ///< trigger the dependents at the start (small grids)
  bool slots_i64 = true;
  bool legacy_wrap = false;
  bool per_head_scale = false;
  bool via_model = false;
  bool scale_in_model = false;  ///< K/V scales rounded to the activation dtype first
  bool ue8m0 = false;
  bool blockscale_mul_recip = false;  ///< index-K block scale fl(amax * fl(1/448))
  /// The specialised kernel's divide mode on bf16 activations, 4 tokens a thread: the instantiation
  /// whose warps first check their scales for the two-operation division (write_decode.cuh).
  bool recip_pair_check = false;
  ScaleMode scale_mode = ScaleMode::kNone;
  Saturation sat = Saturation::kSatFinite;
  IndexMode index_mode = IndexMode::kNone;
};

/// Threads per block of every kernel here.
inline constexpr int kThreads = 256;
/// Upper bound of FusedParams::tile_tokens (the shared per-token tables).
inline constexpr int kMaxTileTokens = 64;

/// Throws spec::FailedToRun("what: <CUDA error string>") when err is not cudaSuccess.
void check_cuda(cudaError_t err, const char* what);

/// Checks the config, the pointers the layer needs and their 16-byte alignment; fills the parts of
/// FusedParams common to both paths (pointers, strides, shapes, quantization). Throws
/// spec::InvalidInput.
FusedParams make_params(const spec::ModelConfig& config, spec::LayerKind kind,
                        const DeviceWriteInputs& in, const DeviceLayerCaches& caches);

/// Multiprocessors of the current device (cached).
int sm_count();

/// Launches kernel(args...) on grid x block as a programmatic dependent of the stream's previous
/// kernel (cudaLaunchKernelEx with the programmatic stream serialization attribute; a programmatic
/// edge when captured into a graph): the kernel must run griddepcontrol.wait before it reads what
/// that kernel writes. `what` names the launch in an error.
template <class Kernel, class... Args>
void launch_programmatic(Kernel kernel, dim3 grid, dim3 block, cudaStream_t stream,
                         const char* what, const Args&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, args...), what);
}

/// Launches kernel(p) on grid x block; with p.pdl as a programmatic dependent.
template <class Kernel>
void launch_kernel(Kernel kernel, const FusedParams& p, dim3 grid, dim3 block,
                   cudaStream_t stream) {
  if (!p.pdl) {
    kernel<<<grid, block, 0, stream>>>(p);
    return;
  }
  launch_programmatic(kernel, grid, block, stream, "cudaLaunchKernelEx(fused write)", p);
}

/// Whether the fused write of this layer takes the specialised kernel (write_decode.cuh): the
/// configurations it is instantiated for; every other one runs the generic kernel.
bool decode_write_applies(const spec::ModelConfig& config, spec::LayerKind kind);
/// Launches the specialised kernel for p (made by make_params, p.pdl set; decode_write_applies
/// true): its tile and grid, then the instantiation of (act, cache, scale mode, index mode).
void launch_decode_write(const spec::ModelConfig& config, FusedParams p, cudaStream_t stream);

/// launch_fused_write's signature (kvo/gpu/write.hpp).
using FusedLaunch = int (*)(const spec::ModelConfig&, spec::LayerKind, const DeviceWriteInputs&,
                            const DeviceLayerCaches&, void*, bool);

/// write_layer_host (kvo/gpu/write.hpp) with `fused` as the fused path's launcher.
/// `resolve_collisions` false hands a legacy_wrap mapping whose tokens collide to the kernel as it
/// is (WriteBug::kTornWrapRace, whose planted kernel settles the race itself).
void write_layer_host_via(FusedLaunch fused, WritePath path, const spec::ModelConfig& config,
                          const spec::LayerWrite& write, spec::LayerCaches& caches,
                          bool resolve_collisions = true);

}  // namespace kvo::gpu::detail
