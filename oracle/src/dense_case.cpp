#include "kvo/oracle/dense_case.hpp"

#include <array>
#include <cmath>
#include <numeric>
#include <sstream>

#include "kvo/reference/generator.hpp"
#include "kvo/reference/numbers.hpp"

namespace kvo::oracle {
namespace {

using spec::DType;

template <class E>
E pick(reference::SplitMix64& rng) {
  const auto& names = spec::EnumInfo<E>::kNames;
  return names[static_cast<std::size_t>(
                   rng.uniform(0, static_cast<std::int64_t>(names.size()) - 1))]
      .value;
}

float uniform(reference::SplitMix64& rng, float r) {
  return (static_cast<float>(rng.next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * r;
}

spec::HostTensor tensor(reference::SplitMix64& rng, DType act, std::vector<std::int64_t> shape,
                        float r) {
  spec::HostTensor t;
  t.dtype = act;
  t.shape = std::move(shape);
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(act));
  t.bytes.resize(static_cast<std::size_t>(t.numel() * eb));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    reference::store_code(reference::encode(uniform(rng, r), act, spec::Saturation::kSatFinite),
                          act, t.bytes.data() + i * eb);
  }
  return t;
}

/// `value` when set, else `drawn`; `valid` checks a set value, naming `flag` when it fails.
template <class T, class Valid>
T fixed_or(const std::optional<T>& value, T drawn, const char* flag, Valid valid, const char* why) {
  if (!value) return drawn;
  if (!valid(*value)) throw spec::InvalidInput(flag, -1, std::to_string(*value), why);
  return *value;
}
template <class E>
E fixed_or(const std::optional<E>& value, E drawn) {
  return value ? *value : drawn;
}

DenseCase make_case_impl(std::uint64_t seed, const CaseOverrides& o, const DenseOverrides& d) {
  reference::SplitMix64 rng(seed);
  DenseCase ic;
  ic.seed = seed;
  spec::ModelConfig& c = ic.config;
  c.layers = {spec::LayerKind::kDense};
  // Every dimension is drawn first, in a fixed order, so that the overrides change only theirs.
  const auto positive = [](std::int64_t v) { return v >= 1; };
  const std::int64_t hd = fixed_or(
      o.head_dim, std::int64_t{32} << rng.uniform(0, 3), "head-dim",
      [](std::int64_t v) { return v >= 2 && v <= 1024 && v % 2 == 0; },
      "must be even, in [2, 1024]");
  const std::int64_t nkv =
      fixed_or(o.num_kv_heads,
               std::array<std::int64_t, 3>{1, 2, 4}[static_cast<std::size_t>(rng.uniform(0, 2))],
               "num-kv-heads", positive, "must be >= 1");
  const std::int64_t nq = nkv * fixed_or(d.group_size,
                                         std::array<std::int64_t, 3>{
                                             1, 2, 4}[static_cast<std::size_t>(rng.uniform(0, 2))],
                                         "group-size", positive, "must be >= 1");
  const std::int64_t bs = fixed_or(
      o.block_size,
      std::array<std::int64_t, 5>{1, 3, 16, 17, 128}[static_cast<std::size_t>(rng.uniform(0, 4))],
      "block-size", positive, "must be >= 1");
  const std::int64_t tokens =
      fixed_or(o.tokens, rng.uniform(1, 300), "tokens", positive, "must be >= 1");
  const std::int64_t padding = rng.chance(1, 2) ? rng.uniform(1, 5) : 0;
  const std::int64_t drawn_blocks = (tokens + bs - 1) / bs + rng.uniform(0, 8);
  const std::int64_t blocks = fixed_or(
      o.num_blocks, drawn_blocks, "num-blocks",
      [&](std::int64_t v) { return v >= 1 && v * bs >= tokens; },
      "the cache must hold every token (num_blocks * block_size >= tokens)");
  c.geometry = {blocks, bs, nkv, hd, 128};
  c.act_dtype = fixed_or(
      o.act_dtype, std::array<DType, 3>{DType::kF32, DType::kBF16,
                                        DType::kF16}[static_cast<std::size_t>(rng.uniform(0, 2))]);
  if (!spec::format_of(c.act_dtype).is_activation) {
    throw spec::InvalidInput("act-dtype", -1, std::string(spec::name_of(c.act_dtype)),
                             "an activation dtype is f32, bf16 or fp16");
  }
  c.layout = fixed_or(o.layout, pick<spec::KvLayout>(rng));
  const std::vector<DType> cache_formats = spec::drawn_cache_formats();
  const DType drawn_cache = cache_formats[static_cast<std::size_t>(
      rng.uniform(0, static_cast<std::int64_t>(cache_formats.size()) - 1))];
  // Its stress theme (write_case.hpp) needs an fp8 cache.
  c.kv.cache_dtype =
      fixed_or(o.kv_dtype, theme_slot(seed) == kThemeFp8Identity ? DType::kFp8E4M3 : drawn_cache);
  c.kv.saturation = fixed_or(o.saturation, pick<spec::Saturation>(rng));
  c.kv.scale_mode = fixed_or(o.scale_mode, pick<spec::ScaleMode>(rng));
  c.kv.per_head_scale = fixed_or(o.per_head_scale, rng.chance(1, 2));
  c.kv.via_model_dtype = fixed_or(o.via_model_dtype, rng.chance(1, 4));
  // The modes added later draw from their own stream, so every older seed keeps its case.
  reference::SplitMix64 later_modes(reference::mix64(seed ^ 0x4D0DE5ull));
  c.kv.scale_in_model_dtype =
      fixed_or(o.scale_in_model_dtype,
               c.kv.scale_mode != spec::ScaleMode::kNone && later_modes.chance(1, 6));
  if (c.kv.scale_in_model_dtype && c.kv.scale_mode == spec::ScaleMode::kNone && !o.scale_mode)
    c.kv.scale_mode = spec::ScaleMode::kDivide;  // a drawn scale mode yields to the override
  c.slot_mode = fixed_or(o.slot_mode, spec::SlotMode::kStrict);
  c.slot_type =
      fixed_or(o.slot_type, rng.chance(1, 2) ? spec::SlotType::kI32 : spec::SlotType::kI64);
  choose_strides(seed, o.kv_strides, std::nullopt, c);  // dense layers: no index-K
  spec::DenseInsert& in = ic.in;
  const std::int64_t rows = tokens + padding + rng.uniform(0, 2);
  in.q = tensor(rng, c.act_dtype, {rows, nq, hd}, 8.0f);
  in.kv.kind = spec::LayerKind::kDense;
  in.kv.k = tensor(rng, c.act_dtype, {rows, nkv, hd}, 8.0f);
  in.kv.v = tensor(rng, c.act_dtype, {rows, nkv, hd}, 8.0f);
  std::vector<std::int64_t> perm(static_cast<std::size_t>(c.geometry.capacity()));
  std::iota(perm.begin(), perm.end(), 0);
  rng.shuffle(perm);
  in.kv.slots.type = c.slot_type;
  in.kv.slots.slots.assign(perm.begin(), perm.begin() + tokens);
  for (std::int64_t i = 0; i < padding; ++i) in.kv.slots.slots.push_back(-1);
  const std::size_t nscale = c.kv.per_head_scale ? static_cast<std::size_t>(nkv) : 1;
  for (std::size_t i = 0; i < nscale; ++i) {
    in.kv.k_scale.push_back(0.05f + std::fabs(uniform(rng, 2.0f)));
    in.kv.v_scale.push_back(0.05f + std::fabs(uniform(rng, 2.0f)));
  }
  for (std::int64_t d = 0; d < hd; ++d) {
    in.q_norm_weight.push_back(uniform(rng, 0.5f));
    in.k_norm_weight.push_back(uniform(rng, 0.5f));
  }
  in.eps = 1e-6f;
  in.rotary_dim = fixed_or(
      d.rotary_dim, 2 * rng.uniform(1, hd / 2), "rotary-dim",
      [hd](std::int64_t v) { return v >= 2 && v % 2 == 0 && v <= hd; },
      "must be even, in [2, head_dim]");
  const std::int64_t max_pos = 4096;
  in.cos_sin = reference::rope_cos_sin(in.rotary_dim, max_pos);
  for (std::size_t t = 0; t < in.kv.slots.slots.size(); ++t)
    in.positions.push_back(rng.uniform(0, max_pos - 1));
  // Tiny heads (a third of the cases, a quarter of the rows): q and k rows times 2^-11, so that
  // the mean square (about 5e-6) meets eps and a wrong eps moves the result far past any
  // foreign kernel's bound. Its own stream, drawn last: other draws keep their values.
  reference::SplitMix64 tiny(reference::mix64(seed ^ 0x7141E5ull));
  if (tiny.chance(1, 3)) {
    const auto shrink = [&](spec::HostTensor& t) {
      const std::int64_t width = t.shape[2];
      const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(c.act_dtype));
      for (std::int64_t row = 0; row < t.shape[0] * t.shape[1]; ++row) {
        if (!tiny.chance(1, 4)) continue;
        for (std::int64_t i = row * width; i < (row + 1) * width; ++i) {
          std::uint8_t* at = t.bytes.data() + i * eb;
          const spec::DType act = c.act_dtype;
          const float x = reference::decode(reference::load_code(at, act), act) * 0x1p-11f;
          reference::store_code(reference::encode(x, act, spec::Saturation::kSatFinite), act, at);
        }
      }
    };
    shrink(in.q);
    shrink(in.kv.k);
  }
  // SPEC 4's fp8 store mode, from a stream of its own: identity in one case of four.
  reference::SplitMix64 store(reference::mix64(seed ^ 0x5707E5ull));
  const auto drawn_store =
      store.chance(1, 4) ? spec::DenseFp8Store::kIdentity : spec::DenseFp8Store::kScaled;
  in.fp8_store = d.fp8_store.value_or(drawn_store);
  // Its stress theme (write_case.hpp): an fp8 cache stored with scale 1 (dense_fp8_store identity).
  if (theme_slot(seed) == kThemeFp8Identity && !d.fp8_store)
    in.fp8_store = spec::DenseFp8Store::kIdentity;
  return ic;
}

}  // namespace

std::string DenseCase::describe() const {
  std::ostringstream s;
  s << spec::describe(config) << " q_heads=" << in.q.shape[1] << " rotary_dim=" << in.rotary_dim
    << " tokens=" << in.kv.slots.slots.size();
  return s.str();
}

std::string DenseOverrides::to_flags() const {
  std::ostringstream s;
  if (group_size) s << " --group-size " << *group_size;
  if (rotary_dim) s << " --rotary-dim " << *rotary_dim;
  if (fp8_store) s << " --dense-fp8-store " << spec::name_of(*fp8_store);
  return s.str();
}

DenseCase make_dense_case(std::uint64_t seed, const CaseOverrides& shared,
                          const DenseOverrides& dense) {
  return make_case_impl(seed, shared, dense);
}

}  // namespace kvo::oracle
