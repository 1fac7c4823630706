#pragma once
// Shared helpers of the trace tests: a small valid trace, and a way to rewrite a file's header
// JSON or data section to build each class of malformed file from a valid one.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvo/oracle/subject.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/traces/simulator.hpp"
#include "kvo/traces/trace.hpp"

namespace kvo::traces::testing {

/// The committed traces' folder: KVO_TRACE_DATA_DIR from the environment where set (the device
/// runs this binary in a copy of the tree at another path), else the source tree's.
inline std::filesystem::path trace_data_dir() {
  const char* dir = std::getenv("KVO_TRACE_DATA_DIR");
  return dir != nullptr && *dir != '\0' ? std::filesystem::path(dir)
                                        : std::filesystem::path(KVO_TRACE_DATA_DIR);
}

/// A simulated trace's shape (the simulator's defaults elsewhere).
struct SimShape {
  const char* layers = "DS";
  std::int64_t steps = 12, num_blocks = 32, block_size = 4, num_kv_heads = 2, head_dim = 16;
  std::int64_t prompt_max = 40, output_max = 20;
};

/// A simulated trace of `shape` and `seed`.
inline Trace sim_trace(const SimShape& shape, std::uint64_t seed, bool separate_index = false) {
  SimOptions o;
  o.seed = seed;
  o.steps = shape.steps;
  o.config.layers = spec::parse_layer_mix(shape.layers);
  o.config.geometry.num_blocks = shape.num_blocks;
  o.config.geometry.block_size = shape.block_size;
  o.config.geometry.num_kv_heads = shape.num_kv_heads;
  o.config.geometry.head_dim = shape.head_dim;
  o.config.separate_index_slots = separate_index;
  o.prompt_max = shape.prompt_max;
  o.output_max = shape.output_max;
  return simulate(o);
}

/// A small simulated trace (2 layers, 12 steps) of the given seed.
inline Trace small_trace(std::uint64_t seed = 5, bool separate_index = false) {
  return sim_trace(SimShape{}, seed, separate_index);
}

/// A write subject named `name`: the reference's write, then byte 0 of the first real token's K
/// row flipped wherever the slot mapping is step `step`'s of `t` (`stray_block` >= 0: a byte of
/// that block instead, which a test picks among those the later steps never name). It decides by
/// the call's content alone, so it may be called from any thread, in any order, from any step.
inline std::unique_ptr<oracle::Subject> planted_at(const std::string& name, const Trace& t,
                                                   std::size_t step,
                                                   std::int64_t stray_block = -1) {
  const std::vector<std::int64_t> slots = t.steps[step].slot_mapping.values;
  return oracle::make_function_subject(
      name,
      [slots, stray_block](const spec::ModelConfig& c, const spec::LayerWrite& w,
                           spec::LayerCaches& out) {
        reference::write_layer(c, w, out);
        if (w.slots.slots != slots) return;
        const reference::PagedCacheLayout layout(c);
        spec::CacheBuffer* k = out.find(layout.kv_buffer(0));
        if (stray_block >= 0) {
          k->body()[stray_block * (k->body_bytes() / c.geometry.num_blocks) + 3] ^= 0x20;
          return;
        }
        const std::int64_t slot =
            *std::find_if(slots.begin(), slots.end(), [](std::int64_t s) { return s >= 0; });
        const std::int64_t bs = c.geometry.block_size;
        k->body()[layout.kv_element(0, slot / bs, slot % bs, 0, 0) *
                  static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype))] ^= 0x40;
      },
      true);
}

/// A file split into its header JSON and its data section.
struct FileParts {
  nlohmann::json header;
  std::vector<std::uint8_t> data;
};

inline FileParts split(const std::vector<std::uint8_t>& file) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[static_cast<std::size_t>(i)];
  FileParts p;
  p.header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + static_cast<long>(n));
  p.data.assign(file.begin() + 8 + static_cast<long>(n), file.end());
  return p;
}

/// 8-byte length, header text, data: no padding, so offsets in messages are easy to predict.
inline std::vector<std::uint8_t> join(const std::string& header,
                                      const std::vector<std::uint8_t>& data) {
  const std::uint64_t n = header.size();
  std::vector<std::uint8_t> out(8 + header.size() + data.size());
  for (std::size_t i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(n >> (8 * i));
  for (std::size_t i = 0; i < header.size(); ++i) out[8 + i] = static_cast<std::uint8_t>(header[i]);
  for (std::size_t i = 0; i < data.size(); ++i) out[8 + header.size() + i] = data[i];
  return out;
}

inline std::vector<std::uint8_t> join(const FileParts& p) { return join(p.header.dump(), p.data); }

}  // namespace kvo::traces::testing
