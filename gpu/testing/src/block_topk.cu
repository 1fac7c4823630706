// kvo_gpu_testing: the indexer's block top-k selection (topk.cuh) launched alone, with n_valid
// given per row (ListNValid), for tests/gpu.
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

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
void require_limits(std::int64_t rows, std::int64_t n, std::int64_t topk) {
  detail::require(n >= 0 && n <= detail::kMaxNValid,
                  "block top-k: more than " + std::to_string(detail::kMaxNValid) + " blocks");
  detail::require(topk >= 1 && topk <= detail::kMaxTopk,
                  "block top-k: topk outside [1, " + std::to_string(detail::kMaxTopk) + "]");
  detail::require(rows >= 0 && rows <= 65535, "block top-k: more than 65535 rows");
}

}  // namespace

void launch_block_topk(const float* scores, const std::int32_t* n_valid, std::int64_t rows,
                       std::int64_t n, std::int64_t topk, std::int32_t* ids, ReadKernel kernel,
                       void* stream) {
  require_limits(rows, n, topk);
  if (rows == 0) return;
  detail::launch_topk(detail::TopkArgs{scores, ids, 1, n, topk}, rows, detail::ListNValid{n_valid},
                      kernel == ReadKernel::kCanonical, static_cast<cudaStream_t>(stream));
}

std::vector<std::int32_t> block_topk_host(const std::vector<float>& scores, std::int64_t rows,
                                          std::int64_t n, const std::vector<std::int32_t>& n_valid,
                                          std::int64_t topk, ReadKernel kernel) {
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
  if (topk < 1) throw spec::InvalidInput("topk", -1, std::to_string(topk), "must be >= 1");
  require_limits(rows, n, topk);  // before any CUDA call
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
  launch_block_topk(d_scores.get(), d_n_valid.get(), rows, n, topk, d_ids.get(), kernel, nullptr);
  detail::check_cuda(cudaMemcpy(ids.data(), d_ids.get(), ids.size() * 4, cudaMemcpyDeviceToHost),
                     "block top-k");
  return ids;
}

}  // namespace kvo::gpu::testing
