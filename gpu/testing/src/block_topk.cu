// kvo_gpu_testing: the indexer's block top-k selection (topk.cuh) launched alone, with n_valid
// given per row (ListNValid), for tests/gpu.
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "indexer_fused.cuh"
#include "kvo/gpu/testing/topk.hpp"
#include "kvo/spec/outcome.hpp"
#include "topk.cuh"

namespace kvo::gpu::testing {
namespace {

/// Device memory of n elements, freed on scope exit.
template <class T>
class DeviceVector {
 public:
  explicit DeviceVector(std::size_t n) {
    if (n > 0) detail::check_cuda(cudaMalloc(&ptr_, n * sizeof(T)), "cudaMalloc(block top-k)");
  }
  ~DeviceVector() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

/// The selection kernel's limits (spec::Unsupported past them).
void require_limits(std::int64_t rows, std::int64_t n, std::int64_t topk, std::int64_t heads) {
  const std::int64_t most = heads > 0 ? detail::kKeyTile : detail::kMaxNValid;
  detail::require(n >= 0 && n <= most, "block top-k: more than " + std::to_string(most) +
                                           " blocks" + (heads > 0 ? " in one launch" : ""));
  detail::require(topk >= 1 && topk <= detail::kMaxTopk,
                  "block top-k: topk outside [1, " + std::to_string(detail::kMaxTopk) + "]");
  detail::require(rows >= 0 && rows <= 65535, "block top-k: more than 65535 rows");
}

/// The one-launch indexer's selection alone: CUDA block g selects rows [g * a.heads, (g + 1) *
/// a.heads) of a.scores (stride a.stride), whose n_valid is n_valid[g * a.heads]; 0: -1 rows, as
/// the fused kernel writes a padded request's.
template <bool kCanonical>
__global__ void __launch_bounds__(detail::kFusedThreads)
    fused_select_kernel(detail::TopkArgs a, const std::int32_t* n_valid) {
  __shared__ unsigned long long keys[detail::kKeyTile];
  __shared__ int best[detail::kMaxTopk];
  const long long g = blockIdx.x, groups = gridDim.x;
  const long long nv = n_valid[g * a.heads];
  if (nv == 0) {
    for (long long k = threadIdx.x; k < a.heads * a.topk; k += blockDim.x)
      a.ids[g * a.heads * a.topk + k] = -1;
    return;
  }
  detail::fused_select<kCanonical>(a, {a.scores + g * a.heads * a.stride, a.stride}, g, groups, nv,
                                   keys, best);
}

}  // namespace

void launch_block_topk(const float* scores, const std::int32_t* n_valid, std::int64_t rows,
                       std::int64_t n, std::int64_t topk, std::int32_t* ids, ReadKernel kernel,
                       void* stream, std::int64_t fused_heads) {
  require_limits(rows, n, topk, fused_heads);
  detail::require(fused_heads >= 0 && (fused_heads == 0 || rows % fused_heads == 0),
                  "block top-k: rows not a multiple of the fused heads");
  if (rows == 0) return;
  if (fused_heads > 0) {
    const detail::TopkArgs a{scores, ids, fused_heads, n, topk};
    const auto s = static_cast<cudaStream_t>(stream);
    const auto groups = static_cast<unsigned>(rows / fused_heads);
    if (kernel == ReadKernel::kCanonical) {
      fused_select_kernel<true><<<groups, detail::kFusedThreads, 0, s>>>(a, n_valid);
    } else {
      fused_select_kernel<false><<<groups, detail::kFusedThreads, 0, s>>>(a, n_valid);
    }
    detail::check_cuda(cudaGetLastError(), "fused_select_kernel launch");
    return;
  }
  detail::launch_topk(detail::TopkArgs{scores, ids, 1, n, topk}, rows, detail::ListNValid{n_valid},
                      kernel == ReadKernel::kCanonical, static_cast<cudaStream_t>(stream));
}

std::vector<std::int32_t> block_topk_host(const std::vector<float>& scores, std::int64_t rows,
                                          std::int64_t n, const std::vector<std::int32_t>& n_valid,
                                          std::int64_t topk, ReadKernel kernel,
                                          std::int64_t fused_heads) {
  if (rows < 0 || n < 0 || static_cast<std::int64_t>(scores.size()) != rows * n) {
    throw spec::InvalidInput("scores", -1, std::to_string(scores.size()) + " floats",
                             "expected [rows, n]");
  }
  if (static_cast<std::int64_t>(n_valid.size()) != rows) {
    throw spec::InvalidInput("n_valid", -1, std::to_string(n_valid.size()) + " rows",
                             "expected " + std::to_string(rows));
  }
  for (std::size_t r = 0; r < n_valid.size(); ++r) {
    if (n_valid[r] < 0 || n_valid[r] > n) {
      throw spec::InvalidInput("n_valid", static_cast<std::int64_t>(r), std::to_string(n_valid[r]),
                               "outside [0, n]");
    }
  }
  for (std::size_t i = 0; i < scores.size(); ++i) {
    if (std::isnan(scores[i])) {
      throw spec::InvalidInput("scores", static_cast<std::int64_t>(i), "nan",
                               "block scores are never NaN (SPEC 5: a NaN block scores -1e30)");
    }
  }
  if (fused_heads < 0 || (fused_heads > 0 && rows % fused_heads != 0)) {
    throw spec::InvalidInput("fused_heads", -1, std::to_string(fused_heads),
                             "must be 0 or divide rows (" + std::to_string(rows) + ")");
  }
  for (std::int64_t r = 0; fused_heads > 0 && r < rows; ++r) {
    if (n_valid[static_cast<std::size_t>(r)] !=
        n_valid[static_cast<std::size_t>(r / fused_heads * fused_heads)]) {
      throw spec::InvalidInput("n_valid", r, std::to_string(n_valid[static_cast<std::size_t>(r)]),
                               "differs from its fused row's first head's");
    }
  }
  if (topk < 1) throw spec::InvalidInput("topk", -1, std::to_string(topk), "must be >= 1");
  require_limits(rows, n, topk, fused_heads);  // before any CUDA call
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows * topk), -1);
  if (rows == 0) return ids;
  DeviceVector<float> d_scores(scores.size());
  DeviceVector<std::int32_t> d_n_valid(n_valid.size()), d_ids(ids.size());
  if (!scores.empty()) {
    detail::check_cuda(cudaMemcpy(d_scores.get(), scores.data(), scores.size() * sizeof(float),
                                  cudaMemcpyHostToDevice),
                       "cudaMemcpy(scores)");
  }
  detail::check_cuda(
      cudaMemcpy(d_n_valid.get(), n_valid.data(), n_valid.size() * 4, cudaMemcpyHostToDevice),
      "cudaMemcpy(n_valid)");
  launch_block_topk(d_scores.get(), d_n_valid.get(), rows, n, topk, d_ids.get(), kernel, nullptr,
                    fused_heads);
  detail::check_cuda(cudaMemcpy(ids.data(), d_ids.get(), ids.size() * 4, cudaMemcpyDeviceToHost),
                     "block top-k");
  return ids;
}

}  // namespace kvo::gpu::testing
