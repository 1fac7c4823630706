// Host side of the GPU writes (the layout strides and buffer sizes are call_inputs.cpp's):
// parameter checks, the unfused workspace, and the host-memory convenience that validates a call,
// moves it to the device, writes and moves the caches back.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_set>
#include <vector>

#include "kvo/gpu/device_caches.hpp"
#include "kvo/spec/outcome.hpp"
#include "launch.cuh"
#include "staging.cuh"

namespace kvo::gpu {
namespace detail {

using spec::KvLayout;

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw spec::FailedToRun(std::string(what) + ": " + cudaGetErrorString(err) + " (" +
                            cudaGetErrorName(err) + ")");
  }
}

int sm_count() {
  static const int count = [] {
    int dev = 0;
    int n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
      return 132;  // H200; only the tile heuristic depends on it
    }
    return n;
  }();
  return count;
}

namespace {

void require_ptr(const void* p, const char* field) {
  if (p == nullptr) throw spec::InvalidInput(field, -1, "null", "a device pointer is required");
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) {
    throw spec::InvalidInput(field, -1, "misaligned", "must be 16-byte aligned");
  }
}

}  // namespace

FusedParams make_params(const spec::ModelConfig& c, spec::LayerKind kind,
                        const DeviceWriteInputs& in, const DeviceLayerCaches& caches) {
  spec::validate(c);
  const spec::CacheGeometry& g = c.geometry;
  if (in.num_tokens < 0) {
    throw spec::InvalidInput("num_tokens", -1, std::to_string(in.num_tokens), "must be >= 0");
  }
  const bool sparse = kind == spec::LayerKind::kSparse;
  const bool one_tensor = spec::kv_in_one_tensor(c);
  require_ptr(in.k, "k");
  require_ptr(in.v, "v");
  require_ptr(in.slots, "slot_mapping");
  if (in.k_scale == nullptr || in.v_scale == nullptr) {
    throw spec::InvalidInput("k_scale/v_scale", -1, "null", "device scales are required");
  }
  require_ptr(caches.k, "caches.k");
  if (!one_tensor) require_ptr(caches.v, "caches.v");
  if (sparse) {
    require_ptr(in.index_k, "index_k");
    require_ptr(caches.index_k, "caches.index_k");
    if (c.separate_index_slots) require_ptr(in.index_slots, "index_slot_mapping");
  }
  // Every element index inside a block tile is a 32-bit quantity for FastDiv.
  const std::int64_t row = g.num_kv_heads * g.head_dim;
  if (row / kVec * 2 + g.index_dim / kVec > (std::int64_t{1} << 24)) {
    throw spec::Unsupported("a token row of more than 2^27 elements");
  }

  FusedParams p;
  p.k = in.k;
  p.v = in.v;
  p.index_k = in.index_k;
  p.slots = in.slots;
  p.index_slots = sparse && c.separate_index_slots ? in.index_slots : in.slots;
  p.k_scale = in.k_scale;
  p.v_scale = in.v_scale;
  p.st = kv_strides(c);
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  // caches.k/v point at the views' first elements (a strided view's offset is the caller's);
  // V's part of a one-tensor layout folded in.
  p.k_cache = caches.k;
  p.v_cache = one_tensor
                  ? static_cast<void*>(static_cast<std::uint8_t*>(caches.k) + p.st.kv_part * eb)
                  : caches.v;
  p.st.kv_part = 0;
  p.st.offset = 0;
  p.index_cache = static_cast<std::uint8_t*>(caches.index_k);
  p.num_tokens = in.num_tokens;
  p.block_size = g.block_size;
  p.capacity = g.capacity();
  p.nkv = static_cast<std::int32_t>(g.num_kv_heads);
  p.hd = static_cast<std::int32_t>(g.head_dim);
  p.idim = static_cast<std::int32_t>(sparse ? g.index_dim : 0);
  p.groups = static_cast<std::int32_t>(sparse ? g.index_dim / spec::kScaleGroup : 0);
  const spec::IndexStrides index_view = spec::index_view(c);
  p.index_block = index_view.block;
  p.index_token = index_view.token;
  if (sparse) {
    // The index-K stores: flat rows as 8-element vectors, blockscale values and scales as 4-byte
    // words; a view (SPEC 3) whose rows break that alignment is not one this kernel takes.
    const std::int64_t unit = spec::index_stride_bytes(c);
    const std::int64_t align = c.index.layout == spec::IndexLayout::kBlockScale ? 4 : 8 * unit;
    if ((p.index_block * unit) % align != 0 || (p.index_token * unit) % align != 0) {
      throw spec::Unsupported("an index-K view whose rows are not " + std::to_string(align) +
                              "-byte aligned (index_strides " +
                              spec::index_strides_text(c.index_strides) + ")");
    }
  }
  p.row_items = make_fast_div(static_cast<std::uint32_t>(row / kVec));
  p.head_items = make_fast_div(static_cast<std::uint32_t>(g.head_dim / kVec));
  p.groups_div = make_fast_div(static_cast<std::uint32_t>(p.groups > 0 ? p.groups : 1));
  p.kv_items = static_cast<std::int32_t>(2 * row / kVec);
  p.bs_fast = g.capacity() <= 0x7FFFFFFF;
  if (p.bs_fast) p.bs_div = make_fast_div(static_cast<std::uint32_t>(g.block_size));
  p.slots_i64 = c.slot_type == spec::SlotType::kI64;
  p.legacy_wrap = c.slot_mode == spec::SlotMode::kLegacyWrap;
  p.per_head_scale = c.kv.per_head_scale;
  p.via_model = c.kv.via_model_dtype;
  p.scale_in_model = c.kv.scale_in_model_dtype;
  p.ue8m0 = c.index.ue8m0;
  p.blockscale_mul_recip = c.index.blockscale_scale == spec::BlockScaleFormula::kMulRecip;
  p.scale_mode = c.kv.scale_mode;
  p.sat = c.kv.saturation;
  if (!sparse) {
    p.index_mode = IndexMode::kNone;
  } else if (c.index.layout == spec::IndexLayout::kBlockScale) {
    p.index_mode = IndexMode::kBlockScale;
  } else {
    p.index_mode =
        c.index.flat_dtype == spec::DType::kBF16 ? IndexMode::kFlatBf16 : IndexMode::kFlatFp8;
  }
  const std::int32_t flat_items =
      p.index_mode == IndexMode::kFlatBf16 || p.index_mode == IndexMode::kFlatFp8 ? p.idim / kVec
                                                                                  : 0;
  p.items_per_token = make_fast_div(static_cast<std::uint32_t>(p.kv_items + flat_items));
  return p;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Unfused workspace: 3 tensors x 4 vectors x [max_tokens] int64.

std::int64_t UnfusedWorkspace::bytes_for(std::int64_t max_tokens) {
  return 12 * std::max<std::int64_t>(max_tokens, 1) * 8;
}

UnfusedWorkspace::UnfusedWorkspace(std::int64_t max_tokens)
    : max_tokens_(max_tokens), owned_(true) {
  void* p = nullptr;
  detail::check_cuda(cudaMalloc(&p, static_cast<std::size_t>(bytes_for(max_tokens))),
                     "cudaMalloc(unfused workspace)");
  base_ = static_cast<std::int64_t*>(p);
}

UnfusedWorkspace::UnfusedWorkspace(std::int64_t max_tokens, void* memory)
    : max_tokens_(max_tokens), base_(static_cast<std::int64_t*>(memory)), owned_(false) {}

UnfusedWorkspace::~UnfusedWorkspace() {
  if (owned_ && base_ != nullptr) cudaFree(base_);
}

std::int64_t* UnfusedWorkspace::vec(int tensor, int which) const {
  return base_ +
         (static_cast<std::int64_t>(tensor) * 4 + which) * std::max<std::int64_t>(max_tokens_, 1);
}

// ---------------------------------------------------------------------------------------------
// Host-memory convenience.

namespace {

/// True when two tokens of a legacy_wrap mapping resolve to one slot.
bool wrap_collides(const spec::SlotMapping& m, std::int64_t capacity) {
  std::unordered_set<std::int64_t> seen;
  seen.reserve(m.slots.size());
  for (std::int64_t s : m.slots) {
    if (!seen.insert(s < 0 ? s + capacity : s).second) return true;
  }
  return false;
}

/// legacy_wrap resolved on the host: negative slots wrap, and of the tokens that land on one slot
/// only the last keeps it (torch's index_put on the CPU: last writer wins); the others become
/// padding (-1) of a strict-mode call. The kernels do not order their writes, so a colliding
/// mapping is never handed to them as is.
spec::SlotMapping resolve_wrap(const spec::SlotMapping& m, std::int64_t capacity) {
  spec::SlotMapping out = m;
  std::unordered_set<std::int64_t> taken;
  taken.reserve(m.slots.size());
  for (std::size_t i = m.slots.size(); i-- > 0;) {
    const std::int64_t s = m.slots[i] < 0 ? m.slots[i] + capacity : m.slots[i];
    out.slots[i] = taken.insert(s).second ? s : -1;
  }
  return out;
}

}  // namespace

DeviceWriteFunction device_write_function(WritePath path) {
  // A call's tensors as the device-pointer API takes them (the caches' first elements: a strided
  // view's offset is in the views already).
  const auto inputs = [](const DeviceWriteCall& call) {
    DeviceWriteInputs in;
    in.k = call.k.data;
    in.v = call.v.data;
    in.index_k = call.index_k.data;
    in.slots = call.slot_mapping.data;
    in.index_slots = call.index_slot_mapping.data;
    in.k_scale = call.k_scale.as<const float>();
    in.v_scale = call.v_scale.as<const float>();
    in.num_tokens = call.slot_mapping.shape.at(0);
    return in;
  };
  const auto caches = [](const DeviceWriteCall& call) {
    return DeviceLayerCaches{call.caches.k_cache.data, call.caches.v_cache.data,
                             call.caches.index_cache.data};
  };
  switch (path) {
    case WritePath::kFused:
      return [=](const DeviceWriteCall& call) {
        launch_fused_write(*call.config, call.kind, inputs(call), caches(call), call.stream);
      };
    case WritePath::kFusedGeneric:
      return [=](const DeviceWriteCall& call) {
        launch_fused_write_generic(*call.config, call.kind, inputs(call), caches(call),
                                   call.stream);
      };
    case WritePath::kUnfused:
      break;
  }
  return [=](const DeviceWriteCall& call) {
    // One workspace per host thread and stream, so that threads writing on streams of their own
    // at once (a campaign's device lanes: Subject::device_concurrent) never share one; the calls
    // on one stream share it in stream order. The thread's pool is made first, so that it is
    // destroyed after the workspaces at thread exit (thread_locals go in reverse order) and takes
    // their blocks back alive.
    static_cast<void>(detail::pool_idle_bytes());
    thread_local std::map<void*, detail::DeviceBuffer> workspaces;
    detail::DeviceBuffer& workspace = workspaces[call.stream];
    const DeviceWriteInputs in = inputs(call);
    const auto bytes = static_cast<std::size_t>(UnfusedWorkspace::bytes_for(in.num_tokens));
    if (workspace.size() < bytes) {
      // The kernels of earlier calls may still read the old workspace.
      detail::check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(call.stream)),
                         "the unfused write's stream");
      workspace = detail::DeviceBuffer(bytes);
    }
    UnfusedWorkspace ws(in.num_tokens, workspace.data());
    launch_unfused_write(*call.config, call.kind, in, caches(call), ws, call.stream);
  };
}

void write_layer_host(WritePath path, const spec::ModelConfig& c, const spec::LayerWrite& w,
                      spec::LayerCaches& caches) {
  if (path == WritePath::kFusedGeneric) {
    detail::write_layer_host_via(launch_fused_write_generic, WritePath::kFused, c, w, caches);
    return;
  }
  detail::write_layer_host_via(launch_fused_write, path, c, w, caches);
}

void detail::write_layer_host_via(FusedLaunch fused, WritePath path, const spec::ModelConfig& c,
                                  const spec::LayerWrite& w, spec::LayerCaches& caches,
                                  bool resolve_collisions) {
  // 1. Everything is validated before any byte moves (SPEC principle 5).
  spec::validate(c);
  spec::validate_write(c, w);
  if (caches.kind != w.kind) {
    throw spec::InvalidInput("caches.kind", -1, std::string(spec::name_of(caches.kind)),
                             "the write is for a " + std::string(spec::name_of(w.kind)) + " layer");
  }
  const bool sparse = w.kind == spec::LayerKind::kSparse;
  // legacy_wrap collisions: resolved here, then run as a strict call (see resolve_wrap).
  spec::ModelConfig cfg = c;
  const bool separate = sparse && c.separate_index_slots;
  spec::SlotMapping main_slots = w.slots;
  spec::SlotMapping idx_slots = separate ? w.index_slots : spec::SlotMapping{};
  const std::int64_t cap = c.geometry.capacity();
  if (resolve_collisions && c.slot_mode == spec::SlotMode::kLegacyWrap &&
      (wrap_collides(w.slots, cap) || (separate && wrap_collides(w.index_slots, cap)))) {
    cfg.slot_mode = spec::SlotMode::kStrict;
    main_slots = resolve_wrap(w.slots, cap);
    if (separate) idx_slots = resolve_wrap(w.index_slots, cap);
  }
  const std::int64_t tokens = static_cast<std::int64_t>(main_slots.slots.size());

  // 2. The caches (guards included) in the device mirror, which checks their buffers; the inputs
  // in pooled buffers.
  const DeviceCacheMirror mirror(c, caches);
  using detail::DeviceBuffer;
  const DeviceBuffer k(w.k.bytes), v(w.v.bytes), index_k(w.index_k.bytes);
  const DeviceBuffer slots(detail::slot_storage(main_slots));
  const DeviceBuffer index_slots(separate ? detail::slot_storage(idx_slots)
                                          : std::vector<std::uint8_t>{});
  const DeviceBuffer k_scale(w.k_scale), v_scale(w.v_scale);
  DeviceWriteInputs in;
  in.k = k.data();
  in.v = v.data();
  in.index_k = sparse ? index_k.data() : nullptr;
  in.slots = slots.data();
  in.index_slots = separate ? index_slots.data() : nullptr;
  in.k_scale = k_scale.as<const float>();
  in.v_scale = v_scale.as<const float>();
  in.num_tokens = tokens;
  DeviceLayerCaches dc;  // the views' first elements (SPEC 3: a strided view's offset in)
  const std::int64_t first =
      detail::kv_strides(c).offset * static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  const auto at = [&](spec::BufferKind b) {
    return static_cast<void*>(static_cast<std::uint8_t*>(mirror.body(b)) + first);
  };
  dc.k = at(spec::kv_in_one_tensor(c) ? spec::BufferKind::kKv : spec::BufferKind::kK);
  dc.v = spec::kv_in_one_tensor(c) ? nullptr : at(spec::BufferKind::kV);
  dc.index_k = static_cast<std::uint8_t*>(mirror.body(spec::BufferKind::kIndexK)) +
               spec::index_view(c).offset * spec::index_stride_bytes(c);

  // 3. Write, then bring every byte of every buffer back (guards too: a stray write shows).
  DeviceBuffer workspace;  // the unfused path's, alive until the kernels are done
  if (path == WritePath::kFused) {
    fused(cfg, w.kind, in, dc, nullptr, false);
  } else {
    workspace = DeviceBuffer(static_cast<std::size_t>(UnfusedWorkspace::bytes_for(tokens)));
    UnfusedWorkspace ws(tokens, workspace.data());
    launch_unfused_write(cfg, w.kind, in, dc, ws, nullptr);
  }
  detail::check_cuda(cudaDeviceSynchronize(), "layer write kernel");
  mirror.download(caches);
}

}  // namespace kvo::gpu
