#include "kvo/oracle/dense_case.hpp"

#include <array>
#include <cmath>
#include <numeric>
#include <sstream>

#include "kvo/reference/generator.hpp"
#include "kvo/reference/numbers.hpp"
#ifdef KVO_HAVE_CUDA
#include "kvo/gpu/device.hpp"
#include "kvo/gpu/write.hpp"
#endif

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

DenseCase make_case_impl(std::uint64_t seed) {
  reference::SplitMix64 rng(seed);
  DenseCase ic;
  ic.seed = seed;
  spec::ModelConfig& c = ic.config;
  c.layers = {spec::LayerKind::kDense};
  const std::int64_t hd = std::int64_t{32} << rng.uniform(0, 3);
  const std::int64_t nkv =
      std::array<std::int64_t, 3>{1, 2, 4}[static_cast<std::size_t>(rng.uniform(0, 2))];
  const std::int64_t nq =
      nkv * std::array<std::int64_t, 3>{1, 2, 4}[static_cast<std::size_t>(rng.uniform(0, 2))];
  const std::int64_t bs =
      std::array<std::int64_t, 5>{1, 3, 16, 17, 128}[static_cast<std::size_t>(rng.uniform(0, 4))];
  const std::int64_t tokens = rng.uniform(1, 300);
  const std::int64_t padding = rng.chance(1, 2) ? rng.uniform(1, 5) : 0;
  c.geometry = {(tokens + bs - 1) / bs + rng.uniform(0, 8), bs, nkv, hd, 128};
  c.act_dtype = std::array<DType, 3>{DType::kF32, DType::kBF16,
                                     DType::kF16}[static_cast<std::size_t>(rng.uniform(0, 2))];
  c.layout = pick<spec::KvLayout>(rng);
  c.kv.cache_dtype = pick<DType>(rng);
  c.kv.saturation = pick<spec::Saturation>(rng);
  c.kv.scale_mode = pick<spec::ScaleMode>(rng);
  c.kv.per_head_scale = rng.chance(1, 2);
  c.kv.via_model_dtype = rng.chance(1, 4);
  c.slot_type = rng.chance(1, 2) ? spec::SlotType::kI32 : spec::SlotType::kI64;
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
  in.rotary_dim = 2 * rng.uniform(1, hd / 2);
  const std::int64_t max_pos = 4096;
  for (std::int64_t p = 0; p < max_pos; ++p) {
    const std::int64_t half = in.rotary_dim / 2;
    std::vector<float> row(static_cast<std::size_t>(in.rotary_dim));
    for (std::int64_t i = 0; i < half; ++i) {
      const double theta =
          static_cast<double>(p) *
          std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(in.rotary_dim));
      row[static_cast<std::size_t>(i)] = static_cast<float>(std::cos(theta));
      row[static_cast<std::size_t>(half + i)] = static_cast<float>(std::sin(theta));
    }
    in.cos_sin.insert(in.cos_sin.end(), row.begin(), row.end());
  }
  for (std::size_t t = 0; t < in.kv.slots.slots.size(); ++t)
    in.positions.push_back(rng.uniform(0, max_pos - 1));
  return ic;
}

#ifdef KVO_HAVE_CUDA
class CudaDenseSubject final : public DenseSubject {
 public:
  std::string name() const override { return "cuda-dense-qknorm-rope"; }
  std::string unavailable_reason() const override {
    std::string why;
    return gpu::device_count(&why) > 0 ? std::string() : "no CUDA device answers (" + why + ")";
  }
  spec::HostTensor insert(const spec::ModelConfig& config, const spec::DenseInsert& in,
                          spec::LayerCaches& caches) override {
    return gpu::dense_insert_host(config, in, caches);
  }
};
#endif

}  // namespace

std::string DenseCase::describe() const {
  std::ostringstream s;
  s << spec::describe(config) << " q_heads=" << in.q.shape[1] << " rotary_dim=" << in.rotary_dim
    << " tokens=" << in.kv.slots.slots.size();
  return s.str();
}

DenseCase make_dense_case(std::uint64_t seed) { return make_case_impl(seed); }

std::vector<std::unique_ptr<DenseSubject>> make_dense_subjects() {
  std::vector<std::unique_ptr<DenseSubject>> out;
#ifdef KVO_HAVE_CUDA
  out.push_back(std::make_unique<CudaDenseSubject>());
#endif
  return out;
}

}  // namespace kvo::oracle
