// A read case resident on the device (resident_reads.hpp): ResidentWrites with two copies of the
// case's sparse layer, both written by the canonical fused write, read through kvo::gpu's resident
// read runners.
#include "kvo/oracle/resident_reads.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "kvo/gpu/device_calls.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/reference_tier.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/outcome.hpp"
#ifdef KVO_HAVE_CUDA
#include "kvo/gpu/write.hpp"
#endif

namespace kvo::oracle {

std::string ResidentRead::unavailable(const Subject& s, spec::Op op) {
  if (s.ordering() != spec::Ordering::kCanonical) {
    return s.name() + " is foreign (judged against the float64 truth over host caches)";
  }
  const bool has = op == spec::Op::kIndexer     ? static_cast<bool>(s.device_indexer())
                   : op == spec::Op::kAttention ? static_cast<bool>(s.device_attention())
                                                : false;
  if (!has) {
    return s.name() + " has no device " + std::string(spec::name_of(op)) +
           " (Subject::device_indexer, Subject::device_attention)";
  }
  return {};
}

/// Past this many bytes a copy's buffers are a huge cache's: only the pages the case's block table
/// names (and the guard bands) are poisoned, written and compared, not gigabytes no read names.
constexpr std::int64_t kWholeCopyBytes = std::int64_t{1} << 30;

ResidentRead::Plan ResidentRead::plan(const ReadCase& c) {
  const reference::PagedCacheLayout layout(c.config);
  Plan p;
  // Both copies start poisoned on the device (nothing held here), whatever c.caches hold.
  p.initial.push_back(make_layer_caches(layout, 0, spec::LayerKind::kSparse, /*lazy=*/true,
                                        /*hold_guards=*/false));
  std::int64_t bytes = 0;
  for (const spec::CacheBuffer& b : p.initial.front().buffers) bytes += b.storage.size();
  p.whole = bytes <= kWholeCopyBytes;
  if (p.whole) return p;
  // A huge cache's defined bytes: the guard bands and every block the table names.
  std::vector<std::int64_t> blocks;
  for (const std::int32_t blk : c.batch.block_table) {
    if (blk >= 0 && blk < c.config.geometry.num_blocks) blocks.push_back(blk);
  }
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  p.defined = step_bytes(layout, spec::LayerKind::kSparse, blocks);
  return p;
}

#ifdef KVO_HAVE_CUDA

namespace {

/// `inner`'s device reads on one resident copy.
class ResidentReader final : public Subject {
 public:
  ResidentReader(Subject& inner, const ResidentWrites& device, std::size_t copy, bool own_stream)
      : inner_(inner), device_(device), copy_(copy), own_stream_(own_stream) {}
  std::string name() const override { return inner_.name(); }
  bool implements(spec::Op op) const override { return inner_.implements(op); }
  spec::Ordering ordering() const override { return inner_.ordering(); }
  TopkForm topk_form() const override { return inner_.topk_form(); }
  spec::AttentionProfile attention_profile() const override { return inner_.attention_profile(); }

  std::vector<std::int32_t> indexer(const ReadCase& c) override { return ids(c, nullptr); }
  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* sel) override {
    const DeviceAttentionFn fn = inner_.device_attention();
    if (!fn) throw spec::Unsupported(ResidentRead::unavailable(inner_, spec::Op::kAttention));
    return gpu::run_resident_attention(fn, c.config, c.attention, c.batch, c.q,
                                       device_.views(0, copy_), c.k_scale, c.v_scale,
                                       sel != nullptr ? sel->ids : std::vector<std::int32_t>{},
                                       sel != nullptr ? sel->topk : 0, stream());
  }
  reference::TopkSelection indexer_selection(const ReadCase& c) override {
    std::vector<float> scores;
    std::vector<std::int32_t> got = ids(c, &scores);
    // The table is [Tq, nkv * lanes, max_n_valid] (DeviceIndexerCall::scores).
    const std::int64_t nkv = c.config.geometry.num_kv_heads;
    const std::int64_t rows = c.batch.num_queries() * nkv * spec::selection_lanes(c.indexer, nkv);
    const std::int64_t max_n_valid =
        rows > 0 ? static_cast<std::int64_t>(scores.size()) / rows : std::int64_t{1};
    return selection_from_scores(c, std::move(got), scores, max_n_valid);
  }

 private:
  std::vector<std::int32_t> ids(const ReadCase& c, std::vector<float>* scores) {
    const DeviceIndexerFn fn = inner_.device_indexer();
    if (!fn) throw spec::Unsupported(ResidentRead::unavailable(inner_, spec::Op::kIndexer));
    return gpu::run_resident_indexer(fn, c.config, c.indexer, c.batch, c.index_q,
                                     device_.views(0, copy_), stream(), scores);
  }
  void* stream() const { return own_stream_ ? gpu::calling_thread_stream() : device_.stream(); }

  Subject& inner_;
  const ResidentWrites& device_;
  std::size_t copy_;
  bool own_stream_;
};

}  // namespace

struct ResidentRead::Impl {
  std::unique_ptr<ResidentWrites> writes;
  bool whole = true;  ///< compared over every byte of the allocations (else the table's pages)
};

ResidentRead::ResidentRead(const ReadCase& c, Plan plan) : impl_(std::make_unique<Impl>()) {
  const ReadCaseValues& v = c.values;
  impl_->whole = plan.whole;
  const DeviceWriteFn fused = gpu::device_write_function(gpu::WritePath::kFused);
  const float bias[3] = {0.0f, v.v_bias, 0.0f};
  impl_->writes = std::make_unique<ResidentWrites>(
      c.config, std::vector<std::int64_t>{0}, plan.initial,
      std::vector<DeviceWriteFn>{fused, fused}, v.gen, std::vector<std::vector<float>>{c.k_scale},
      std::vector<std::vector<float>>{c.v_scale},
      std::max<std::int64_t>(1, static_cast<std::int64_t>(v.keys.size())), bias, plan.defined);
  std::vector<gpu::SourcePatch> patches;
  for (const ReadCaseValues::Patch& p : v.distinct_patches())
    patches.push_back({p.tensor, p.row, p.element, p.code});
  impl_->writes->stage_step(v.keys, v.slots, nullptr, plan.defined, {}, patches);
  if (v.keys.empty()) return;
  impl_->writes->write(0, 0);
  impl_->writes->write(0, 1);
}

std::unique_ptr<Subject> ResidentRead::reader(Subject& inner, std::size_t copy, bool own_stream) {
  return std::make_unique<ResidentReader>(inner, *impl_->writes, copy, own_stream);
}

void ResidentRead::synchronize() { impl_->writes->synchronize(); }

LayerDifference ResidentRead::compare() { return impl_->writes->compare(1, impl_->whole).at(0); }

void ResidentRead::resync() { impl_->writes->resync(0, 1); }

void ResidentRead::download(std::span<const BufferBytes> bytes, spec::LayerCaches& into) {
  impl_->writes->download(0, 0, bytes, into);
}

#else  // built without CUDA: never available

struct ResidentRead::Impl {};
ResidentRead::ResidentRead(const ReadCase&, Plan) {
  throw spec::Unsupported("reads resident on the device: kvoracle was built without CUDA");
}
std::unique_ptr<Subject> ResidentRead::reader(Subject&, std::size_t, bool) { return nullptr; }
void ResidentRead::synchronize() {}
LayerDifference ResidentRead::compare() { return {}; }
void ResidentRead::resync() {}
void ResidentRead::download(std::span<const BufferBytes>, spec::LayerCaches&) {}

#endif

ResidentRead::~ResidentRead() = default;

OneThread& ResidentRead::side_thread() {
  // One per calling thread (the main thread, each device lane), so that the lanes' cases never
  // wait for each other's side reads. Never destroyed: its thread's CUDA stream, pool and staging
  // block live as long as the process (CUDA may be gone by the time static objects are destroyed);
  // the threads that call this live as long (the campaign's lanes are the process's too).
  thread_local OneThread* const side = new OneThread;
  return *side;
}

}  // namespace kvo::oracle
