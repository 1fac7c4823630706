// The CUDA subjects. Writes: cuda-fused (one launch per layer: its specialised kernel where it
// applies), cuda-fused-generic (the same write through the generic kernel only) and cuda-unfused
// (the 12/8-launch baseline), through kvo::gpu::write_layer_host. Dense insert:
// cuda-dense-qknorm-rope (and cuda-dense-engine, foreign). Reads: cuda-canonical, cuda-fast and
// cuda-canonical-generic (the GPU tier's read answerer), through kvo::gpu's read host API. All
// validate on the host before any copy or launch and turn CUDA errors into spec::FailedToRun.
// Planted faults come from kvo_gpu_testing, never from the production launchers. Attention alone:
// cuda-flash-bf16, the flash family (FlashAttention's arithmetic, profile bf16_p).
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/read.hpp"
#include "kvo/gpu/testing/faults.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/oracle/cuda_subjects.hpp"
#include "kvo/oracle/device_subject.hpp"
#include "kvo/oracle/reference_tier.hpp"
#include "kvo/oracle/subject.hpp"

namespace kvo::oracle {
namespace {

std::string no_device_reason() { return device_unavailable_reason(); }

class CudaWriteSubject final : public Subject {
 public:
  CudaWriteSubject(std::string name, gpu::WritePath path,
                   std::optional<gpu::testing::WriteFault> fault = std::nullopt)
      : name_(std::move(name)),
        path_(path),
        fault_(fault),
        device_write_(fault.has_value() ? DeviceWriteFn{} : gpu::device_write_function(path)) {}
  std::string name() const override { return name_; }
  std::string unavailable_reason() const override { return no_device_reason(); }
  bool implements(spec::Op op) const override { return op == spec::Op::kWrite; }
  DeviceWriteFn device_write() const override { return device_write_; }
  /// Launchers on the call's stream whose one piece of state, the unfused path's workspace, is
  /// per host thread and stream (kvo/gpu/write.hpp).
  bool device_concurrent() const override { return true; }
  void write_layer(const spec::ModelConfig& config, const spec::LayerWrite& write,
                   spec::LayerCaches& caches) override {
    if (fault_.has_value()) {
      gpu::testing::write_layer_host_faulty(*fault_, path_, config, write, caches);
    } else {
      gpu::write_layer_host(path_, config, write, caches);
    }
  }

 private:
  std::string name_;
  gpu::WritePath path_;
  std::optional<gpu::testing::WriteFault> fault_;
  DeviceWriteFn device_write_;  ///< the path's device write (none with a planted fault)
};

/// The read kernels of kvo/gpu/read.hpp. cuda-canonical is diffed bit for bit against the
/// reference; cuda-fast (its own order, ids by descending score) against the float64 truth and the
/// tie-aware top-k rules; `fault` plants a bug (in the fast family, or the canonical selection's).
/// `written` is the top-k form the kernel is asked for; `declared` what the subject says it wrote
/// (differing only in a mutant).
class CudaReadSubject final : public Subject {
 public:
  CudaReadSubject(std::string name, gpu::ReadKernel kernel,
                  std::optional<gpu::testing::ReadFault> fault = std::nullopt,
                  std::optional<TopkForm> written = std::nullopt,
                  std::optional<TopkForm> declared = std::nullopt,
                  gpu::AttentionPath attention_path = gpu::AttentionPath::kAuto)
      : name_(std::move(name)),
        kernel_(kernel),
        attention_path_(attention_path),
        fault_(fault),
        written_(written.value_or(family_form(kernel))),
        declared_(declared.value_or(written_)),
        indexer_only_(written.has_value()) {}
  std::string name() const override { return name_; }
  std::string unavailable_reason() const override { return no_device_reason(); }
  bool implements(spec::Op op) const override {
    return op == spec::Op::kIndexer || (op == spec::Op::kAttention && !indexer_only_);
  }
  spec::Ordering ordering() const override {
    return kernel_ == gpu::ReadKernel::kCanonical ? spec::Ordering::kCanonical
                                                  : spec::Ordering::kForeign;
  }
  TopkForm topk_form() const override { return declared_; }
  /// The canonical family's reads on device memory (the resident read path judges canonical
  /// subjects only); none with a planted fault.
  /// Stateless launchers on the call's stream; their scratch is the stream's (cudaMallocAsync).
  bool device_concurrent() const override { return true; }
  DeviceIndexerFn device_indexer() const override {
    if (!has_device_reads()) return {};
    return gpu::device_indexer_function(kernel_);
  }
  DeviceAttentionFn device_attention() const override {
    if (!has_device_reads()) return {};
    return gpu::device_attention_function(kernel_, attention_path_);
  }
  std::vector<std::int32_t> indexer(const ReadCase& c) override {
    if (fault_.has_value()) {
      return gpu::testing::indexer_topk_host_faulty(*fault_, c.config, c.indexer, c.batch,
                                                    c.index_q, c.caches, kernel_);
    }
    return gpu::indexer_topk_host(c.config, c.indexer, c.batch, c.index_q, c.caches, kernel_,
                                  written_);
  }
  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* sel) override {
    const std::vector<std::int32_t> ids = sel != nullptr ? sel->ids : std::vector<std::int32_t>{};
    const std::int64_t topk = sel != nullptr ? sel->topk : 0;
    if (fault_.has_value()) {
      return gpu::testing::attention_host_faulty(*fault_, c.config, c.attention, c.batch, c.q,
                                                 c.caches, c.k_scale, c.v_scale, ids, topk,
                                                 kernel_);
    }
    return gpu::attention_host(c.config, c.attention, c.batch, c.q, c.caches, c.k_scale, c.v_scale,
                               ids, topk, kernel_, attention_path_);
  }
  /// The canonical family's ids with the block scores it ranked (the GPU tier's read answer).
  reference::TopkSelection indexer_selection(const ReadCase& c) override {
    if (kernel_ != gpu::ReadKernel::kCanonical || indexer_only_)
      return Subject::indexer_selection(c);
    gpu::BlockScores scores;
    std::vector<std::int32_t> ids =
        fault_.has_value()
            ? gpu::testing::indexer_topk_host_faulty(*fault_, c.config, c.indexer, c.batch,
                                                     c.index_q, c.caches, kernel_, &scores)
            : gpu::indexer_selection_host(c.config, c.indexer, c.batch, c.index_q, c.caches,
                                          kernel_, scores);
    return selection_from_scores(c, std::move(ids), scores.scores, scores.max_n_valid);
  }

 private:
  bool has_device_reads() const {
    return kernel_ == gpu::ReadKernel::kCanonical && !fault_.has_value() && !indexer_only_;
  }
  /// The family's own form: ascending ids (canonical), best first (fast); token-major, exact keys.
  static TopkForm family_form(gpu::ReadKernel kernel) {
    return {kernel == gpu::ReadKernel::kCanonical ? TopkOrder::kAscendingIds
                                                  : TopkOrder::kDescendingScore};
  }

  std::string name_;
  gpu::ReadKernel kernel_;
  gpu::AttentionPath attention_path_;
  std::optional<gpu::testing::ReadFault> fault_;
  TopkForm written_, declared_;
  bool indexer_only_;  ///< a form variant of the family: its attention is the family's own
};

/// The flash family (kvo/gpu/read.hpp: flash_attention_host), attention only, foreign, profile
/// bf16_p; `fault` plants one of its bugs (a kFlash ReadFault).
class CudaFlashSubject final : public Subject {
 public:
  CudaFlashSubject(std::string name, std::optional<gpu::testing::ReadFault> fault = std::nullopt)
      : name_(std::move(name)), fault_(fault) {}
  std::string name() const override { return name_; }
  std::string unavailable_reason() const override { return no_device_reason(); }
  bool implements(spec::Op op) const override { return op == spec::Op::kAttention; }
  spec::Ordering ordering() const override { return spec::Ordering::kForeign; }
  spec::AttentionProfile attention_profile() const override {
    return spec::AttentionProfile::kBf16P;
  }
  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* sel) override {
    const std::vector<std::int32_t> ids = sel != nullptr ? sel->ids : std::vector<std::int32_t>{};
    const std::int64_t topk = sel != nullptr ? sel->topk : 0;
    if (fault_.has_value()) {
      return gpu::testing::flash_attention_host_faulty(*fault_, c.config, c.attention, c.batch, c.q,
                                                       c.caches, c.k_scale, c.v_scale, ids, topk);
    }
    return gpu::flash_attention_host(c.config, c.attention, c.batch, c.q, c.caches, c.k_scale,
                                     c.v_scale, ids, topk);
  }

 private:
  std::string name_;
  std::optional<gpu::testing::ReadFault> fault_;
};

/// The dense-layer fused insert kernel (kvo/gpu/write.hpp): canonical (cuda-dense-qknorm-rope),
/// or in vLLM's arithmetic (cuda-dense-engine, foreign: SPEC 4's admissible sets judge it).
class CudaDenseSubject final : public Subject {
 public:
  explicit CudaDenseSubject(bool engine, std::string name = {},
                            std::optional<gpu::testing::DenseFault> fault = std::nullopt)
      : engine_(engine),
        name_(!name.empty() ? std::move(name)
              : engine      ? "cuda-dense-engine"
                            : "cuda-dense-qknorm-rope"),
        fault_(fault) {}
  std::string name() const override { return name_; }
  std::string unavailable_reason() const override { return no_device_reason(); }
  bool implements(spec::Op op) const override { return op == spec::Op::kDense; }
  spec::Ordering ordering() const override {
    return engine_ ? spec::Ordering::kForeign : spec::Ordering::kCanonical;
  }
  spec::HostTensor dense_insert(const spec::ModelConfig& config, const spec::DenseInsert& in,
                                spec::LayerCaches& caches) override {
    if (fault_.has_value())
      return gpu::testing::dense_insert_host_faulty(*fault_, engine_, config, in, caches);
    return engine_ ? gpu::dense_insert_engine_host(config, in, caches)
                   : gpu::dense_insert_host(config, in, caches);
  }

 private:
  bool engine_;
  std::string name_;
  std::optional<gpu::testing::DenseFault> fault_;
};

}  // namespace

SubjectList make_cuda_subjects() {
  SubjectList out;
  out.push_back(std::make_unique<CudaWriteSubject>("cuda-fused", gpu::WritePath::kFused));
  out.push_back(std::make_unique<CudaWriteSubject>("cuda-unfused", gpu::WritePath::kUnfused));
  out.push_back(
      std::make_unique<CudaWriteSubject>("cuda-fused-generic", gpu::WritePath::kFusedGeneric));
  out.push_back(std::make_unique<CudaDenseSubject>(false));
  out.push_back(std::make_unique<CudaDenseSubject>(true));
  out.push_back(std::make_unique<CudaReadSubject>("cuda-canonical", gpu::ReadKernel::kCanonical));
  // The GPU tier's read answerer (reference_tier.hpp): the canonical family through its baseline
  // paths (two-launch indexer, generic attention), so that cuda-canonical's production paths are
  // judged against it.
  out.push_back(std::make_unique<CudaReadSubject>(
      "cuda-canonical-generic", gpu::ReadKernel::kCanonical, std::nullopt, std::nullopt,
      std::nullopt, gpu::AttentionPath::kGeneric));
  out.push_back(std::make_unique<CudaReadSubject>("cuda-fast", gpu::ReadKernel::kFast));
  for (const auto& [name, form] : kCudaFastIndexerForms)
    out.push_back(
        std::make_unique<CudaReadSubject>(name, gpu::ReadKernel::kFast, std::nullopt, form));
  out.push_back(std::make_unique<CudaFlashSubject>("cuda-flash-bf16"));
  return out;
}

std::unique_ptr<Subject> make_cuda_head_major_as_token_major_subject(const std::string& name) {
  const TopkForm written{TopkOrder::kDescendingScore, spec::TopkLayout::kHeadMajor};
  return std::make_unique<CudaReadSubject>(name, gpu::ReadKernel::kFast, std::nullopt, written,
                                           TopkForm{TopkOrder::kDescendingScore});
}

std::unique_ptr<Subject> make_cuda_dense_fault_subject(const std::string& name,
                                                       gpu::testing::DenseFault fault,
                                                       bool engine) {
  return std::make_unique<CudaDenseSubject>(engine, name, fault);
}

/// The fast (or canonical) read kernels with a planted bug (for the mutation catalogue).
std::unique_ptr<Subject> make_cuda_read_fault_subject(const std::string& name,
                                                      gpu::testing::ReadFault fault,
                                                      bool canonical) {
  return std::make_unique<CudaReadSubject>(
      name, canonical ? gpu::ReadKernel::kCanonical : gpu::ReadKernel::kFast, fault);
}

/// The flash family with a planted bug (for the mutation catalogue).
std::unique_ptr<Subject> make_cuda_flash_fault_subject(const std::string& name,
                                                       gpu::testing::ReadFault fault) {
  return std::make_unique<CudaFlashSubject>(name, fault);
}

/// The fused kernel with a planted bug (for the mutation catalogue).
std::unique_ptr<Subject> make_cuda_fault_subject(const std::string& name,
                                                 gpu::testing::WriteFault fault) {
  return std::make_unique<CudaWriteSubject>(name, gpu::WritePath::kFused, fault);
}

std::unique_ptr<Subject> make_cuda_div_approx_beyond_subject(const std::string& name) {
  return make_cuda_fault_subject(name, gpu::testing::WriteFault::kDivApproxOneCodeBeyond);
}

std::unique_ptr<Subject> make_cuda_e4m3_into_e5m2_subject(const std::string& name) {
  return make_cuda_fault_subject(name, gpu::testing::WriteFault::kE4m3IntoE5m2);
}

std::unique_ptr<Subject> make_cuda_trunc_div_negative_slot_subject(const std::string& name) {
  return make_cuda_fault_subject(name, gpu::testing::WriteFault::kTruncDivNegativeSlot);
}

}  // namespace kvo::oracle
