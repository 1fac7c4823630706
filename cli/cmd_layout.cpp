// kvoracle layout: where an element lives, and what lives at a byte, for debugging a kernel's
// addressing. Offsets are the reference's (SPEC 3); the arena is all layers' buffers back to back.
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/outcome.hpp"
#include "options.hpp"

namespace kvo::cli {
namespace {

struct LayoutFlags {
  oracle::CaseOverrides model;
  std::optional<std::int64_t> layer, block, offset, head, dim, group, at;
  std::optional<spec::BufferKind> buffer;
  std::string kv;
  std::int64_t byte_in_element = 0;
};

void print_buffers(const reference::PagedCacheLayout& layout) {
  const spec::ModelConfig& c = layout.config();
  std::printf("%s\n", spec::describe(c).c_str());
  for (spec::LayerKind kind : {spec::LayerKind::kDense, spec::LayerKind::kSparse}) {
    std::printf("%s layer buffers:\n", std::string(spec::name_of(kind)).c_str());
    for (spec::BufferKind b : layout.buffers(kind)) {
      std::printf("  %-8s %14lld bytes, element %lld bytes\n",
                  std::string(spec::name_of(b)).c_str(),
                  static_cast<long long>(layout.buffer_bytes(b)),
                  static_cast<long long>(layout.element_bytes(b)));
    }
  }
  std::printf("arena: %lld bytes over %zu layers (%s)\n",
              static_cast<long long>(oracle::arena_bytes(layout)), c.layers.size(),
              spec::format_layer_mix(c.layers).c_str());
}

int run_layout(LayoutFlags& f) {
  spec::ModelConfig config;
  config.layers = spec::parse_layer_mix(spec::kDefaultLayerMix);
  oracle::apply_overrides(f.model, config);
  const reference::PagedCacheLayout layout(config);
  const auto nlayers = static_cast<std::int64_t>(config.layers.size());

  if (f.at) {
    oracle::ArenaByte where;
    if (f.buffer) {
      where = {f.layer.value_or(0), *f.buffer, *f.at};
      if (where.layer < 0 || where.layer >= nlayers) {
        throw spec::InvalidInput("layer", -1, std::to_string(where.layer), "outside the layer mix");
      }
      if (!oracle::locate(layout, where.buffer, where.byte)) {
        throw spec::InvalidInput("at", -1, std::to_string(*f.at),
                                 "past the end of buffer " +
                                     std::string(spec::name_of(where.buffer)) + " (" +
                                     std::to_string(layout.buffer_bytes(where.buffer)) + " bytes)");
      }
    } else {
      const auto found = oracle::locate_arena(layout, *f.at);
      if (!found) {
        throw spec::InvalidInput("at", -1, std::to_string(*f.at),
                                 "past the end of the arena (" +
                                     std::to_string(oracle::arena_bytes(layout)) + " bytes)");
      }
      where = *found;
    }
    const auto coord = oracle::locate(layout, where.buffer, where.byte);
    if (!coord) {
      throw spec::InvalidInput(
          "buffer", -1, std::string(spec::name_of(where.buffer)),
          "layer " + std::to_string(where.layer) + " has no such buffer in this layout");
    }
    std::printf(
        "arena byte %lld = layer %lld (%s) %s byte %lld: %s\n",
        static_cast<long long>(oracle::arena_offset(layout, where)),
        static_cast<long long>(where.layer),
        std::string(spec::name_of(config.layers[static_cast<std::size_t>(where.layer)])).c_str(),
        std::string(spec::name_of(where.buffer)).c_str(), static_cast<long long>(where.byte),
        coord->describe().c_str());
    return spec::kExitPass;
  }

  if (!f.block && !f.buffer) {
    print_buffers(layout);
    return spec::kExitPass;
  }
  oracle::ElementCoord c;
  if (!f.buffer) throw spec::InvalidInput("buffer", -1, "none", "give --buffer with --block");
  c.buffer = *f.buffer;
  c.block = f.block.value_or(-1);
  c.offset = f.offset.value_or(-1);
  c.head = f.head.value_or(-1);
  c.dim = f.dim.value_or(-1);
  c.byte_in_element = f.byte_in_element;
  if (f.group) {
    c.is_scale = true;
    c.group = *f.group;
  }
  if (c.buffer == spec::BufferKind::kK || c.buffer == spec::BufferKind::kV) {
    c.kv = c.buffer == spec::BufferKind::kK ? 0 : 1;
  } else if (c.buffer == spec::BufferKind::kKv) {
    if (f.kv != "k" && f.kv != "v")
      throw spec::InvalidInput("kv", -1, "\"" + f.kv + "\"", "give --kv k or --kv v");
    c.kv = f.kv == "k" ? 0 : 1;
  }
  const std::int64_t layer = f.layer.value_or(0);
  const std::int64_t byte = oracle::byte_offset(layout, c);
  const std::int64_t arena = oracle::arena_offset(layout, {layer, c.buffer, byte});
  std::printf("layer %lld %s: buffer byte %lld, arena byte %lld (element %lld bytes)\n",
              static_cast<long long>(layer), c.describe().c_str(), static_cast<long long>(byte),
              static_cast<long long>(arena),
              static_cast<long long>(c.is_scale ? 4 : layout.element_bytes(c.buffer)));
  return spec::kExitPass;
}

}  // namespace

void add_layout(CLI::App& app, int& status) {
  auto f = std::make_shared<LayoutFlags>();
  CLI::App* cmd =
      app.add_subcommand("layout", "byte offset of an element, or what lives at a byte (--at)");
  add_model_flags(*cmd, f->model);
  auto add = [&](const char* flag, std::optional<std::int64_t>& target, const char* help) {
    cmd->add_option_function<std::int64_t>(
        flag, [&target](const std::int64_t& v) { target = v; }, help);
  };
  add("--layer", f->layer, "layer index in the mix (default 0)");
  add("--block", f->block, "physical block");
  add("--offset", f->offset, "token offset within the block");
  add("--head", f->head, "KV head");
  add("--dim", f->dim, "element within the head or index row");
  add("--scale-group", f->group, "blockscale index-K: the scale of this 128-group");
  add("--at", f->at, "what lives at this byte: of the arena, or of --buffer of --layer");
  add_enum_option(*cmd, "--buffer", f->buffer, "buffer");
  cmd->add_option("--kv", f->kv, "k or v, for the one-tensor layouts (--buffer kv)");
  cmd->add_option("--byte-in-element", f->byte_in_element, "byte within a multi-byte element");
  cmd->callback([f, &status] { status = run_layout(*f); });
}

}  // namespace kvo::cli
