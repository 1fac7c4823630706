// Layer writes resident on the device (resident_writes.hpp) over kvo/gpu/resident.hpp.
#include "kvo/oracle/resident_writes.hpp"

#include <algorithm>
#include <tuple>
#include <utility>

#include "kvo/oracle/harness.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {

std::vector<BufferBytes> step_bytes(const reference::PagedCacheLayout& layout, spec::LayerKind kind,
                                    const std::vector<std::int64_t>& blocks) {
  std::vector<BufferBytes> out;
  const std::vector<spec::BufferKind> buffers = layout.buffers(kind);
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const auto b = static_cast<std::int32_t>(i);
    const std::int64_t size = layout.buffer_bytes(buffers[i]) + 2 * spec::kGuardBytes;
    out.push_back({b, 0, spec::kGuardBytes});
    out.push_back({b, size - spec::kGuardBytes, size});
    for (const std::int64_t blk : blocks) {
      for (const auto& [from, to] : block_byte_ranges(layout, buffers[i], blk))
        out.push_back({b, spec::kGuardBytes + from, spec::kGuardBytes + to});
    }
  }
  // Disjoint: in a strided view one block's bytes span another's (SPEC 3), and a comparison that
  // read a byte twice would count its difference twice.
  std::sort(out.begin(), out.end(), [](const BufferBytes& x, const BufferBytes& y) {
    return std::tie(x.buffer, x.begin) < std::tie(y.buffer, y.begin);
  });
  std::size_t kept = 0;
  for (const BufferBytes& r : out) {
    if (kept > 0 && out[kept - 1].buffer == r.buffer && r.begin <= out[kept - 1].end) {
      out[kept - 1].end = std::max(out[kept - 1].end, r.end);
    } else {
      out[kept++] = r;
    }
  }
  out.resize(kept);
  return out;
}

std::vector<std::int64_t> touched_blocks(
    const spec::CacheGeometry& geometry,
    std::initializer_list<std::span<const std::int64_t>> mappings) {
  const std::int64_t cap = geometry.capacity(), bs = geometry.block_size;
  std::vector<std::int64_t> blocks;
  for (const std::span<const std::int64_t> slots : mappings) {
    for (std::int64_t s : slots) {
      if (s < 0) s += cap;
      if (s >= 0 && s < cap) blocks.push_back(s / bs);
    }
  }
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  return blocks;
}

std::vector<BufferBytes> whole_bytes(const reference::PagedCacheLayout& layout,
                                     spec::LayerKind kind) {
  std::vector<BufferBytes> out;
  const std::vector<spec::BufferKind> buffers = layout.buffers(kind);
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    out.push_back(
        {static_cast<std::int32_t>(i), 0, layout.buffer_bytes(buffers[i]) + 2 * spec::kGuardBytes});
  }
  return out;
}

std::string ResidentWrites::config_blocker(const spec::ModelConfig& c) {
  if (c.slot_mode != spec::SlotMode::kStrict) {
    return "slot mode " + std::string(spec::name_of(c.slot_mode)) +
           " (colliding slots admit several answers)";
  }
  if (c.kv.scale_mode == spec::ScaleMode::kDivApprox) {
    return "scale mode div_approx admits several codes";
  }
  return {};
}

#ifdef KVO_HAVE_CUDA

struct ResidentWrites::Impl {
  std::vector<DeviceWriteFn> writers;
  std::unique_ptr<gpu::ResidentReplay> device;
};

std::string ResidentWrites::unavailable(const std::vector<Subject*>& writers) {
  for (const Subject* s : writers) {
    if (!s->device_write()) return s->name() + " has no device write (Subject::device_write)";
  }
  return {};
}

std::int64_t ResidentWrites::device_bytes_needed(const spec::ModelConfig& config,
                                                 const std::vector<spec::LayerCaches>& initial,
                                                 std::size_t copies) {
  return gpu::ResidentReplay::device_bytes_needed(config, initial, copies);
}

namespace {
/// The writers' device writes; spec::Unsupported where one has none.
std::vector<DeviceWriteFn> device_writes(const std::vector<Subject*>& writers) {
  if (const std::string why = ResidentWrites::unavailable(writers); !why.empty()) {
    throw spec::Unsupported("writes resident on the device: " + why);
  }
  std::vector<DeviceWriteFn> out;
  for (const Subject* s : writers) out.push_back(s->device_write());
  return out;
}
}  // namespace

ResidentWrites::ResidentWrites(const spec::ModelConfig& config, std::vector<std::int64_t> layers,
                               const std::vector<spec::LayerCaches>& initial,
                               std::vector<Subject*> writers, const reference::ValueGenerator& gen,
                               const std::vector<std::vector<float>>& k_scale,
                               const std::vector<std::vector<float>>& v_scale,
                               std::int64_t max_tokens)
    : ResidentWrites(config, std::move(layers), initial, device_writes(writers), gen, k_scale,
                     v_scale, max_tokens, {}) {}

ResidentWrites::ResidentWrites(const spec::ModelConfig& config, std::vector<std::int64_t> layers,
                               const std::vector<spec::LayerCaches>& initial,
                               std::vector<Subject*> writers, const reference::ValueGenerator& gen,
                               const std::vector<std::vector<float>>& k_scale,
                               const std::vector<std::vector<float>>& v_scale,
                               std::int64_t max_tokens, std::span<const BufferBytes> tier_defined)
    : ResidentWrites(config, std::move(layers), initial, device_writes(writers), gen, k_scale,
                     v_scale, max_tokens, {}, tier_defined, gpu::DefinedCopies::kFirst) {}

ResidentWrites::ResidentWrites(const spec::ModelConfig& config, std::vector<std::int64_t> layers,
                               const std::vector<spec::LayerCaches>& initial,
                               std::vector<DeviceWriteFn> writers,
                               const reference::ValueGenerator& gen,
                               const std::vector<std::vector<float>>& k_scale,
                               const std::vector<std::vector<float>>& v_scale,
                               std::int64_t max_tokens, std::span<const float> bias,
                               std::span<const BufferBytes> defined, gpu::DefinedCopies limits)
    : impl_(std::make_unique<Impl>()) {
  impl_->writers = std::move(writers);
  gpu::GeneratedValues values;
  values.seed = gen.seed;
  values.rule = {gen.range, gen.edge_values, gen.allow_nonfinite};
  values.act = gen.act;
  values.biased = !bias.empty();
  for (std::size_t t = 0; t < bias.size() && t < 3; ++t) values.bias[t] = bias[t];
  impl_->device = std::make_unique<gpu::ResidentReplay>(config, std::move(layers), initial,
                                                        impl_->writers.size(), values, k_scale,
                                                        v_scale, max_tokens, defined, limits);
}

std::int64_t ResidentWrites::device_bytes() const { return impl_->device->device_bytes(); }

void ResidentWrites::stage_step(std::span<const reference::RowKey> keys,
                                const spec::SlotMapping& slots,
                                const spec::SlotMapping* index_slots,
                                std::span<const BufferBytes> compared,
                                std::span<const std::int64_t> zero_rows,
                                std::span<const gpu::SourcePatch> patches) {
  std::vector<gpu::GeneratedRowKey> device_keys;
  device_keys.reserve(keys.size());
  for (const reference::RowKey& k : keys) device_keys.push_back({k.request, k.position});
  impl_->device->stage_step(device_keys, slots, index_slots, compared, zero_rows, patches);
}

void ResidentWrites::write(std::size_t li, std::size_t writer) {
  impl_->device->write(li, writer, impl_->writers.at(writer));
}

std::vector<LayerDifference> ResidentWrites::compare(std::size_t writer, bool whole) {
  return impl_->device->compare(writer, whole);
}

void ResidentWrites::synchronize() { impl_->device->synchronize(); }

void ResidentWrites::resync(std::size_t li, std::size_t writer) {
  impl_->device->resync(li, writer);
}

void ResidentWrites::download(std::size_t li, std::size_t writer,
                              std::span<const BufferBytes> bytes, spec::LayerCaches& into) {
  impl_->device->download(li, writer, bytes, into);
}

void ResidentWrites::download(std::size_t writer, std::span<const BufferBytes> bytes,
                              std::span<spec::LayerCaches> into) {
  impl_->device->download(writer, bytes, into);
}

std::unique_ptr<gpu::PagesInFlight> ResidentWrites::download_async(
    std::size_t writer, std::span<const BufferBytes> bytes, const gpu::PagesInFlight* like) {
  return impl_->device->download_async(writer, bytes, like);
}

const gpu::DeviceKvCaches& ResidentWrites::views(std::size_t li, std::size_t writer) const {
  return impl_->device->views(li, writer);
}

void* ResidentWrites::stream() const { return impl_->device->stream(); }

#else  // built without CUDA: never available

struct ResidentWrites::Impl {};

std::string ResidentWrites::unavailable(const std::vector<Subject*>&) {
  return "kvoracle was built without CUDA";
}

std::int64_t ResidentWrites::device_bytes_needed(const spec::ModelConfig&,
                                                 const std::vector<spec::LayerCaches>&,
                                                 std::size_t) {
  return 0;
}

ResidentWrites::ResidentWrites(const spec::ModelConfig&, std::vector<std::int64_t>,
                               const std::vector<spec::LayerCaches>&, std::vector<Subject*>,
                               const reference::ValueGenerator&,
                               const std::vector<std::vector<float>>&,
                               const std::vector<std::vector<float>>&, std::int64_t) {
  throw spec::Unsupported("writes resident on the device: " + unavailable({}));
}
ResidentWrites::ResidentWrites(const spec::ModelConfig&, std::vector<std::int64_t>,
                               const std::vector<spec::LayerCaches>&, std::vector<DeviceWriteFn>,
                               const reference::ValueGenerator&,
                               const std::vector<std::vector<float>>&,
                               const std::vector<std::vector<float>>&, std::int64_t,
                               std::span<const float>, std::span<const BufferBytes>,
                               gpu::DefinedCopies) {
  throw spec::Unsupported("writes resident on the device: " + unavailable({}));
}
ResidentWrites::ResidentWrites(const spec::ModelConfig&, std::vector<std::int64_t>,
                               const std::vector<spec::LayerCaches>&, std::vector<Subject*>,
                               const reference::ValueGenerator&,
                               const std::vector<std::vector<float>>&,
                               const std::vector<std::vector<float>>&, std::int64_t,
                               std::span<const BufferBytes>) {
  throw spec::Unsupported("writes resident on the device: " + unavailable({}));
}
std::int64_t ResidentWrites::device_bytes() const { return 0; }
void ResidentWrites::stage_step(std::span<const reference::RowKey>, const spec::SlotMapping&,
                                const spec::SlotMapping*, std::span<const BufferBytes>,
                                std::span<const std::int64_t>, std::span<const gpu::SourcePatch>) {}
void ResidentWrites::write(std::size_t, std::size_t) {}
std::vector<LayerDifference> ResidentWrites::compare(std::size_t, bool) { return {}; }
void ResidentWrites::synchronize() {}
void ResidentWrites::resync(std::size_t, std::size_t) {}
void ResidentWrites::download(std::size_t, std::size_t, std::span<const BufferBytes>,
                              spec::LayerCaches&) {}
void ResidentWrites::download(std::size_t, std::span<const BufferBytes>,
                              std::span<spec::LayerCaches>) {}
std::unique_ptr<gpu::PagesInFlight> ResidentWrites::download_async(std::size_t,
                                                                   std::span<const BufferBytes>,
                                                                   const gpu::PagesInFlight*) {
  throw spec::Unsupported("writes resident on the device: " + unavailable({}));
}
const gpu::DeviceKvCaches& ResidentWrites::views(std::size_t, std::size_t) const {
  throw spec::Unsupported("writes resident on the device: " + unavailable({}));
}
void* ResidentWrites::stream() const { return nullptr; }

#endif

ResidentWrites::~ResidentWrites() = default;

}  // namespace kvo::oracle
