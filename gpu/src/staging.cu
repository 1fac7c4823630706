// Pooled device memory, the call stream and the host checks every host path shares (staging.cuh).
#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#include "kvo/spec/outcome.hpp"
#include "launch.cuh"
#include "staging.cuh"

namespace kvo::gpu::detail {
namespace {

/// Blocks up to 1 GiB are pooled in power-of-two sizes (at least 256 bytes); larger ones are
/// allocated to the next 2 MiB and freed at once. The pool keeps at most kMaxCached bytes.
constexpr std::size_t kPooledMax = std::size_t{1} << 30;
constexpr std::size_t kMaxCached = std::size_t{4} << 30;

std::size_t block_size_for(std::size_t bytes) {
  if (bytes <= kPooledMax) return std::max<std::size_t>(256, std::bit_ceil(bytes));
  constexpr std::size_t kGranule = std::size_t{2} << 20;
  return (bytes + kGranule - 1) / kGranule * kGranule;
}

class Pool {
 public:
  ~Pool() {
    for (const auto& [size, p] : free_) cudaFree(p);
  }
  void* acquire(std::size_t block) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->first == block) {
        void* p = it->second;
        cached_ -= block;
        free_.erase(it);
        return p;
      }
    }
    void* p = nullptr;
    if (cudaMalloc(&p, block) != cudaSuccess) {
      // Give the cached blocks back and try once more before reporting.
      (void)cudaGetLastError();
      for (const auto& [size, q] : free_) cudaFree(q);
      free_.clear();
      cached_ = 0;
      check_cuda(cudaMalloc(&p, block), "cudaMalloc");
    }
    return p;
  }
  void release(void* p, std::size_t block) {
    if (block > kPooledMax || cached_ + block > kMaxCached) {
      cudaFree(p);
      return;
    }
    free_.emplace_back(block, p);
    cached_ += block;
  }

 private:
  std::vector<std::pair<std::size_t, void*>> free_;
  std::size_t cached_ = 0;
};

Pool& pool() {
  thread_local Pool p;
  return p;
}

}  // namespace

DeviceBuffer::DeviceBuffer(std::size_t bytes) : size_(bytes) {
  // Even an empty buffer gets a block: a present pointer that is never dereferenced.
  capacity_ = block_size_for(bytes);
  data_ = static_cast<std::uint8_t*>(pool().acquire(capacity_));
}

DeviceBuffer::DeviceBuffer(const void* src, std::size_t bytes) : DeviceBuffer(bytes) {
  if (src != nullptr && bytes > 0) {
    check_cuda(cudaMemcpy(data_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy(to device)");
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) pool().release(data_, capacity_);
}

void DeviceBuffer::fill(std::uint8_t byte) const {
  if (size_ > 0) check_cuda(cudaMemset(data_, byte, size_), "cudaMemset");
}

void DeviceBuffer::download(void* dst, std::size_t bytes) const {
  if (bytes > 0) {
    check_cuda(cudaMemcpy(dst, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(to host)");
  }
}

DeviceTensor upload_values(std::vector<DeviceBuffer>& keep, const void* values, ElementType type,
                           std::vector<std::int64_t> shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  keep.emplace_back(values, static_cast<std::size_t>(n) * element_bytes(type));
  return contiguous_tensor(keep.back().data(), type, std::move(shape));
}

DeviceTensor upload_tensor(std::vector<DeviceBuffer>& keep, const spec::HostTensor& t) {
  return upload_values(keep, t.bytes.data(), element_type_of(t.dtype), t.shape);
}

DeviceTensor poisoned_tensor(std::vector<DeviceBuffer>& keep, ElementType type,
                             std::vector<std::int64_t> shape, std::uint8_t poison) {
  DeviceTensor t = upload_values(keep, nullptr, type, std::move(shape));
  keep.back().fill(poison);
  return t;
}

cudaStream_t call_stream() {
  struct Stream {
    cudaStream_t s = nullptr;
    Stream() { check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream"); }
    ~Stream() { cudaStreamDestroy(s); }
  };
  thread_local Stream stream;
  return stream.s;
}

std::vector<std::uint8_t> slot_storage(const spec::SlotMapping& m) {
  const std::size_t eb = m.type == spec::SlotType::kI64 ? 8 : 4;
  std::vector<std::uint8_t> out(m.slots.size() * eb);
  for (std::size_t i = 0; i < m.slots.size(); ++i) {
    if (eb == 8) {
      std::memcpy(out.data() + i * 8, &m.slots[i], 8);
    } else {
      const auto v = static_cast<std::int32_t>(m.slots[i]);
      std::memcpy(out.data() + i * 4, &v, 4);
    }
  }
  return out;
}

QueryRows::QueryRows(const spec::ModelConfig& c, const spec::ReadBatch& b) {
  spec::validate_batch(c, b);
  for (std::int64_t r = 0; r < b.num_requests(); ++r) {
    const std::int64_t q_len = b.query_start_loc[static_cast<std::size_t>(r + 1)] -
                               b.query_start_loc[static_cast<std::size_t>(r)];
    for (std::int64_t j = 0; j < q_len; ++j) {
      request.push_back(r);
      position.push_back(b.seq_lens[static_cast<std::size_t>(r)] - q_len + j);
    }
  }
}

std::int64_t QueryRows::n_valid(const spec::ReadBatch& b, std::int64_t row, std::int64_t sb) const {
  const auto i = static_cast<std::size_t>(row);
  return b.seq_lens[static_cast<std::size_t>(request[i])] == 0 ? 0 : position[i] / sb + 1;
}

std::int64_t QueryRows::max_n_valid(const spec::ReadBatch& b, std::int64_t sb) const {
  std::int64_t m = 1;
  for (std::int64_t i = 0; i < size(); ++i) m = std::max(m, n_valid(b, i, sb));
  return m;
}

void check_tensor(const spec::HostTensor& t, const char* field, spec::DType dt, std::int64_t rows,
                  std::int64_t heads, std::int64_t dim) {
  if (t.dtype != dt || t.shape != std::vector<std::int64_t>{rows, heads, dim} ||
      static_cast<std::int64_t>(t.bytes.size()) !=
          rows * heads * dim * static_cast<std::int64_t>(spec::dtype_bytes(dt))) {
    throw spec::InvalidInput(field, -1, "tensor",
                             "expected " + std::string(spec::name_of(dt)) + " [" +
                                 std::to_string(rows) + ", " + std::to_string(heads) + ", " +
                                 std::to_string(dim) + "]");
  }
}

void check_selection(const spec::ModelConfig& c, const spec::AttentionParams& p,
                     const spec::ReadBatch& b, const QueryRows& rows,
                     const std::vector<std::int32_t>& selection, std::int64_t topk) {
  const std::int64_t tq = rows.size(), nkv = c.geometry.num_kv_heads;
  if (topk < 1 || static_cast<std::int64_t>(selection.size()) != tq * nkv * topk) {
    throw spec::InvalidInput(
        "selection", -1, std::to_string(selection.size()) + " ids",
        "expected [" + std::to_string(tq) + ", " + std::to_string(nkv) + ", topk]");
  }
  for (std::int64_t qi = 0; qi < tq; ++qi) {
    const std::int64_t n_valid = rows.n_valid(b, qi, p.sparse_block);
    for (std::int64_t g = 0; g < nkv; ++g) {
      const std::int32_t* row = &selection[static_cast<std::size_t>((qi * nkv + g) * topk)];
      for (std::int64_t k = 0; k < topk; ++k) {
        const std::int32_t id = row[k];
        const bool dup = id >= 0 && std::find(row, row + k, id) != row + k;
        if (id >= 0 && (id >= n_valid || dup)) {
          throw spec::InvalidInput(
              "selection", (qi * nkv + g) * topk + k, std::to_string(id),
              "a duplicate or a block past n_valid = " + std::to_string(n_valid));
        }
      }
    }
  }
}

}  // namespace kvo::gpu::detail
