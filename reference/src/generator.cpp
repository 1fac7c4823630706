#include "kvo/reference/generator.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "kvo/reference/numbers.hpp"

namespace kvo::reference {
namespace {

constexpr std::uint64_t kGamma = 0x9E3779B97F4A7C15ull;

}  // namespace

std::uint64_t SplitMix64::next() { return mix64(state_ += kGamma); }

std::int64_t SplitMix64::uniform(std::int64_t lo, std::int64_t hi) {
  const auto span = static_cast<std::uint64_t>(hi - lo) + 1;
  return lo + static_cast<std::int64_t>(next() % span);
}

bool SplitMix64::chance(std::uint32_t num, std::uint32_t den) { return next() % den < num; }

namespace {
constexpr std::uint64_t chain(std::uint64_t h, std::int64_t field) {
  return spec::key_chain(h, field);
}
}  // namespace

std::uint64_t value_key(std::uint64_t seed, std::int64_t layer, GenTensor tensor,
                        std::int64_t request, std::int64_t position, std::int64_t head,
                        std::int64_t dim) {
  std::uint64_t h = mix64(seed);
  for (std::int64_t f : {layer, static_cast<std::int64_t>(tensor), request, position, head, dim})
    h = chain(h, f);
  return h;
}

std::uint64_t ValueGenerator::row_key(std::int64_t layer, GenTensor tensor, std::int64_t request,
                                      std::int64_t position) const {
  return spec::row_key(seed, layer, static_cast<std::int64_t>(tensor), request, position);
}

float ValueGenerator::value_in_row(std::uint64_t key, std::int64_t head, std::int64_t dim) const {
  return value_of_key(chain(chain(key, head), dim));
}

void ValueGenerator::fill_row(std::uint64_t key, std::int64_t heads, std::int64_t dim,
                              float* out) const {
  // mix64(d + 1) for the dims of every realistic row, computed once per process.
  static const std::vector<std::uint64_t> kDimMix = [] {
    std::vector<std::uint64_t> t(4096);
    for (std::size_t d = 0; d < t.size(); ++d) t[d] = mix64(d + 1);
    return t;
  }();
  const auto dim_mix = [&](std::int64_t d) {
    const auto du = static_cast<std::uint64_t>(d);
    return du < kDimMix.size() ? kDimMix[du] : mix64(du + 1);
  };
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::uint64_t head_key = chain(key, h);
    if (edge_values) {
      for (std::int64_t d = 0; d < dim; ++d) *out++ = value_of_key(mix64(head_key ^ dim_mix(d)));
      continue;
    }
    // value_of_key without the edge table, in two passes over the row: the hashes, then one
    // rounding loop over it (a loop without calls, which the compiler vectorises), round_to's
    // dtype switch taken once per row (an ordinary value is finite: bf16 needs no NaN case).
    for (std::int64_t d = 0; d < dim; ++d) out[d] = ordinary_value(mix64(head_key ^ dim_mix(d)));
    switch (act) {
      case spec::DType::kF32:
        break;  // round_to(x, f32) is x
      case spec::DType::kBF16:
        for (std::int64_t d = 0; d < dim; ++d) out[d] = bf16_to_f32(f32_to_bf16(out[d]));
        break;
      default:
        for (std::int64_t d = 0; d < dim; ++d) out[d] = round_to(out[d], act);
        break;
    }
    out += dim;
  }
}

float ValueGenerator::value(std::int64_t layer, GenTensor tensor, std::int64_t request,
                            std::int64_t position, std::int64_t head, std::int64_t dim) const {
  return value_of_key(value_key(seed, layer, tensor, request, position, head, dim));
}

float ValueGenerator::value_of_key(std::uint64_t key) const {
  const spec::GeneratedValueRule rule{range, edge_values, allow_nonfinite};
  return spec::generated_value(
      key, rule, [this](float x) { return round_to(x, act); }, float_of);
}

spec::HostTensor generated_rows(const ValueGenerator& gen, std::int64_t layer, GenTensor which,
                                std::span<const RowKey> keys, std::int64_t heads, std::int64_t dim,
                                std::optional<float> bias) {
  static_assert(std::endian::native == std::endian::little, "codes are stored with memcpy");
  spec::HostTensor t;
  t.dtype = gen.act;
  const auto rows = static_cast<std::int64_t>(keys.size());
  t.shape = heads > 0 ? std::vector<std::int64_t>{rows, heads, dim}
                      : std::vector<std::int64_t>{rows, dim};
  const std::int64_t nh = std::max<std::int64_t>(heads, 1);
  const std::size_t eb = spec::dtype_bytes(gen.act);
  t.bytes.resize(static_cast<std::size_t>(rows * nh * dim) * eb);
  std::uint8_t* out = t.bytes.data();
  std::vector<float> row(static_cast<std::size_t>(nh * dim));
  for (const RowKey& k : keys) {
    gen.fill_row(gen.row_key(layer, which, k.request, k.position), nh, dim, row.data());
    if (bias) {
      for (float& x : row) x = round_to(x + *bias, gen.act);
    }
    // A value rounded to the activation dtype has an exact code. The common bf16 case calls the
    // codec itself, without encode's and store_code's dtype switches (the same code: encode of a
    // bf16 value is f32_to_bf16 of it, stored little-endian).
    if (gen.act == spec::DType::kBF16) {
      for (const float x : row) {
        const std::uint16_t code = f32_to_bf16(x);
        std::memcpy(out, &code, sizeof code);
        out += sizeof code;
      }
    } else {
      for (const float x : row) {
        store_code(encode(x, gen.act, spec::Saturation::kSatFinite), gen.act, out);
        out += eb;
      }
    }
  }
  return t;
}

std::vector<float> rope_cos_sin(std::int64_t rotary_dim, std::int64_t positions) {
  const std::int64_t half = rotary_dim / 2;
  std::vector<double> inv_freq(static_cast<std::size_t>(half));  // 10000^(-2i / rotary_dim)
  for (std::int64_t i = 0; i < half; ++i) {
    inv_freq[static_cast<std::size_t>(i)] =
        std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
  }
  std::vector<float> table(static_cast<std::size_t>(positions * rotary_dim));
  for (std::int64_t p = 0; p < positions; ++p) {
    float* row = table.data() + p * rotary_dim;
    for (std::int64_t i = 0; i < half; ++i) {
      const double theta = static_cast<double>(p) * inv_freq[static_cast<std::size_t>(i)];
      row[i] = static_cast<float>(std::cos(theta));
      row[half + i] = static_cast<float>(std::sin(theta));
    }
  }
  return table;
}

}  // namespace kvo::reference
