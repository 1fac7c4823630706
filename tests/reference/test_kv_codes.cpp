// The tabulated K/V element codes (kvo/reference/layer_write.hpp: unscaled_kv_codes,
// store_kv_codes) against quantize_kv element by element: every 16-bit source code, every cache
// dtype, saturation and via_model_dtype, and scales that must not matter under scale none.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"

namespace kvo::reference {
namespace {

using spec::DType;

TEST(UnscaledKvCodes, AreQuantizeKvOfEverySourceCodeWhateverTheScale) {
  int tables = 0;
  for (DType src : {DType::kBF16, DType::kF16}) {
    for (DType cache : {DType::kBF16, DType::kF16, DType::kF32, DType::kFp8E4M3, DType::kFp8E5M2}) {
      for (spec::Saturation sat :
           {spec::Saturation::kSatFinite, spec::Saturation::kNoSat, spec::Saturation::kTorch}) {
        for (bool via_model : {false, true}) {
          spec::KvQuant q;
          q.cache_dtype = cache;
          q.saturation = sat;
          q.scale_mode = spec::ScaleMode::kNone;
          q.via_model_dtype = via_model;
          const DType act = src;
          const std::uint32_t* table = unscaled_kv_codes(src, q, act);
          ASSERT_NE(table, nullptr);
          ++tables;
          for (std::uint32_t c = 0; c < (1u << 16); ++c) {
            for (float s : {1.0f, 0.37f, 1e-30f, 6.0e4f}) {
              const std::uint32_t want = quantize_kv(decode(c, src), s, q, act);
              ASSERT_EQ(table[c], want)
                  << "source code 0x" << std::hex << c << std::dec << " of " << spec::name_of(src)
                  << " into " << spec::name_of(cache) << ", scale " << s;
            }
          }
        }
      }
    }
  }
  std::printf("[kv-codes] %d tables of 65536 codes, each equal to quantize_kv\n", tables);
}

TEST(UnscaledKvCodes, NoTableWhereTheScaleOrA32BitSourceMatters) {
  spec::KvQuant q;
  for (spec::ScaleMode mode :
       {spec::ScaleMode::kDivide, spec::ScaleMode::kMulRecip, spec::ScaleMode::kDivApprox}) {
    q.scale_mode = mode;
    EXPECT_EQ(unscaled_kv_codes(DType::kBF16, q, DType::kBF16), nullptr);
  }
  q.scale_mode = spec::ScaleMode::kNone;
  EXPECT_EQ(unscaled_kv_codes(DType::kF32, q, DType::kF32), nullptr);
}

// store_kv_codes writes what store_code(kv_element_code(...)) writes element by element, with and
// without a table, for 16-, 8- and 32-bit caches; NaN, inf and subnormal source codes included.
TEST(StoreKvCodes, WritesTheElementByElementCodes) {
  std::mt19937 rng(20261202);
  for (DType cache : {DType::kBF16, DType::kF16, DType::kF32, DType::kFp8E4M3}) {
    for (spec::ScaleMode mode : {spec::ScaleMode::kNone, spec::ScaleMode::kDivide}) {
      spec::KvQuant q;
      q.cache_dtype = cache;
      q.scale_mode = mode;
      spec::HostTensor t;
      t.dtype = DType::kBF16;
      t.shape = {3, 136};
      t.bytes.resize(3 * 136 * 2);
      for (auto& b : t.bytes) b = static_cast<std::uint8_t>(rng());
      t.bytes[2] = 0xC1, t.bytes[3] = 0x7F;  // a NaN with a payload
      const std::uint32_t* table = unscaled_kv_codes(t.dtype, q, DType::kBF16);
      EXPECT_EQ(table != nullptr, mode == spec::ScaleMode::kNone);
      const int eb = spec::dtype_bytes(cache);
      std::vector<std::uint8_t> got(136 * eb), want(136 * eb);
      for (std::int64_t row = 0; row < 3; ++row) {
        store_kv_codes(t, row * 136, 136, 0.37f, q, DType::kBF16, table, got.data());
        for (std::int64_t j = 0; j < 136; ++j)
          store_code(quantize_kv(source_value(t, row * 136 + j), 0.37f, q, DType::kBF16), cache,
                     want.data() + j * eb);
        ASSERT_EQ(got, want) << spec::name_of(cache) << " row " << row;
      }
    }
  }
}

}  // namespace
}  // namespace kvo::reference
