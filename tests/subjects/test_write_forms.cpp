// One layer's write (SPEC 4), hand-checked on tiny caches, through all three CPU forms (the
// reference and the cpu-fused and cpu-unfused subjects); and the rejection of bad input before
// anything is written (SPEC principle 5).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "kvo/oracle/harness.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/subjects/cpu_write.hpp"

namespace kvo::subjects {
namespace {

using oracle::make_layer_caches;
using reference::bits_of;
using reference::float_of;
using reference::load_code;
using reference::PagedCacheLayout;
using reference::quantize_kv;
using reference::store_code;
using reference::write_layer;

using spec::BufferKind;
using spec::DType;

using WriteFn =
    std::function<void(const spec::ModelConfig&, const spec::LayerWrite&, spec::LayerCaches&)>;
const std::vector<std::pair<const char*, WriteFn>>& forms() {
  static const std::vector<std::pair<const char*, WriteFn>> f{
      {"reference", write_layer},
      {"fused", write_layer_fused},
      {"unfused", [](const spec::ModelConfig& c, const spec::LayerWrite& w,
                     spec::LayerCaches& caches) { write_layer_unfused(c, w, caches); }}};
  return f;
}

/// An f32 host tensor of the given shape holding `values` (row-major).
spec::HostTensor f32_tensor(std::vector<std::int64_t> shape, const std::vector<float>& values) {
  spec::HostTensor t;
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  t.bytes.resize(values.size() * 4);
  for (std::size_t i = 0; i < values.size(); ++i)
    store_code(bits_of(values[i]), DType::kF32, &t.bytes[i * 4]);
  return t;
}

/// nb = 2 blocks of bs = 2, one KV head of dim 8, f32 activations, bf16 nhd cache, dense.
spec::ModelConfig tiny_config() {
  spec::ModelConfig c;
  c.layers = {spec::LayerKind::kDense};
  c.geometry = {2, 2, 1, 8, 128};
  c.act_dtype = DType::kF32;
  c.kv.cache_dtype = DType::kBF16;
  c.layout = spec::KvLayout::kNhd;
  return c;
}

/// K[t][d] = (t + 1) + d/8 and V = -K, exact in bf16; slots as given.
spec::LayerWrite tiny_write(std::vector<std::int64_t> slots, std::int64_t rows) {
  spec::LayerWrite w;
  std::vector<float> k, v;
  for (std::int64_t t = 0; t < rows; ++t) {
    for (int d = 0; d < 8; ++d) {
      k.push_back(static_cast<float>(t + 1) + static_cast<float>(d) / 8.0f);
      v.push_back(-k.back());
    }
  }
  w.k = f32_tensor({rows, 1, 8}, k);
  w.v = f32_tensor({rows, 1, 8}, v);
  w.slots.slots = std::move(slots);
  w.k_scale = {1.0f};
  w.v_scale = {1.0f};
  return w;
}

std::uint16_t bf16_at(const spec::CacheBuffer& b, std::int64_t element) {
  return static_cast<std::uint16_t>(b.body()[2 * element] | b.body()[2 * element + 1] << 8);
}

TEST(WriteLayer, TinyNhdBf16HandChecked) {
  const spec::ModelConfig c = tiny_config();
  const PagedCacheLayout layout(c);
  // Token 0 -> slot 3 = block 1, offset 1; token 1 is padding; token 2 -> slot 0. A fourth source
  // row (CUDA-graph padding) must stay unread.
  const spec::LayerWrite w = tiny_write({3, -1, 0}, 4);
  for (const auto& [name, fn] : forms()) {
    const spec::LayerCaches before = make_layer_caches(layout, 0, spec::LayerKind::kDense);
    spec::LayerCaches caches = before;
    fn(c, w, caches);
    const spec::CacheBuffer& k = *caches.find(BufferKind::kK);
    const spec::CacheBuffer& v = *caches.find(BufferKind::kV);
    for (int d = 0; d < 8; ++d) {
      // Slot 3: element ((1*2 + 1)*1 + 0)*8 + d = 24 + d; bf16(1 + d/8) = 0x3F80 + 0x10*d.
      EXPECT_EQ(bf16_at(k, 24 + d), 0x3F80 + 0x10 * d) << name << " d=" << d;
      EXPECT_EQ(bf16_at(v, 24 + d), 0xBF80 + 0x10 * d) << name << " d=" << d;
      // Slot 0: element d; bf16(3 + d/8) = 0x4040 + 0x08*d.
      EXPECT_EQ(bf16_at(k, d), 0x4040 + 0x08 * d) << name << " d=" << d;
      EXPECT_EQ(bf16_at(v, d), 0xC040 + 0x08 * d) << name << " d=" << d;
    }
    // Every other byte, guards included, is still the poison.
    for (std::size_t bi = 0; bi < caches.buffers.size(); ++bi) {
      const auto& now = caches.buffers[bi].storage;
      const auto& was = before.buffers[bi].storage;
      for (std::size_t i = 0; i < static_cast<std::size_t>(now.size()); ++i) {
        const std::int64_t body = static_cast<std::int64_t>(i) - spec::kGuardBytes;
        const bool written = (body >= 0 && body < 16) || (body >= 48 && body < 64);
        if (!written) {
          ASSERT_EQ(now[i], was[i]) << name << " buffer " << bi << " storage byte " << i;
        }
      }
    }
  }
}

TEST(WriteLayer, LegacyWrapSendsMinusOneToTheLastSlot) {
  spec::ModelConfig c = tiny_config();
  c.slot_mode = spec::SlotMode::kLegacyWrap;
  const PagedCacheLayout layout(c);
  const spec::LayerWrite w = tiny_write({-1}, 1);
  for (const auto& [name, fn] : forms()) {
    spec::LayerCaches caches = make_layer_caches(layout, 0, spec::LayerKind::kDense);
    fn(c, w, caches);
    // -1 is slot 3: block 1, offset 1 (the vllm#43810 bug class).
    EXPECT_EQ(bf16_at(*caches.find(BufferKind::kK), 24), 0x3F80) << name;
  }
  // Strict mode: the same mapping writes nothing.
  const spec::ModelConfig strict = tiny_config();
  for (const auto& [name, fn] : forms()) {
    const spec::LayerCaches before = make_layer_caches(layout, 0, spec::LayerKind::kDense);
    spec::LayerCaches caches = before;
    fn(strict, w, caches);
    EXPECT_EQ(caches.buffers[0].storage, before.buffers[0].storage) << name;
    EXPECT_EQ(caches.buffers[1].storage, before.buffers[1].storage) << name;
  }
}

/// Writes one element value x through a 1x1x8 fp8 cache and returns the code at element 0.
std::uint8_t fp8_write(const spec::KvQuant& q, float x, float scale) {
  spec::ModelConfig c = tiny_config();
  c.kv = q;
  const PagedCacheLayout layout(c);
  spec::LayerWrite w = tiny_write({0}, 1);
  w.k = f32_tensor({1, 1, 8}, std::vector<float>(8, x));
  w.k_scale = {scale};
  std::uint8_t code = 0;
  for (const auto& [name, fn] : forms()) {
    spec::LayerCaches caches = make_layer_caches(layout, 0, spec::LayerKind::kDense);
    fn(c, w, caches);
    const std::uint8_t got = caches.find(BufferKind::kK)->body()[0];
    if (name == forms().front().first) code = got;
    EXPECT_EQ(got, code) << name;
  }
  return code;
}

TEST(WriteLayer, Fp8ScaleAndSaturationModesHandChecked) {
  spec::KvQuant q;
  q.cache_dtype = DType::kFp8E4M3;
  q.scale_mode = spec::ScaleMode::kDivide;
  EXPECT_EQ(fp8_write(q, 3.0f, 2.0f), 0x3C);  // 1.5
  // fp8_spec.md 6.5: x / s = 0x40A80001 -> 0x4B, but x * fl(1/s) = 0x40A80000, a tie -> 0x4A.
  const float x = float_of(0x3E9C8B04u), s = float_of(0x3D6E8AB0u);
  EXPECT_EQ(fp8_write(q, x, s), 0x4B);
  q.scale_mode = spec::ScaleMode::kMulRecip;
  EXPECT_EQ(fp8_write(q, x, s), 0x4A);
  q.scale_mode = spec::ScaleMode::kNone;
  EXPECT_EQ(fp8_write(q, 500.0f, 1.0f), 0x7E);  // satfinite: 448
  q.saturation = spec::Saturation::kNoSat;
  EXPECT_EQ(fp8_write(q, -500.0f, 1.0f), 0xFF);  // nosat e4m3 overflow: NaN with the sign
  EXPECT_EQ(fp8_write(q, -NAN, 1.0f), 0x7F);     // CUDA drops a NaN's sign
  q.saturation = spec::Saturation::kTorch;
  EXPECT_EQ(fp8_write(q, -NAN, 1.0f), 0xFF);  // torch <= 2.11 keeps it
  q.cache_dtype = DType::kFp8E5M2;
  q.saturation = spec::Saturation::kSatFinite;
  EXPECT_EQ(fp8_write(q, 1e6f, 1.0f), 0x7B);  // 57344
}

TEST(WriteLayer, ViaModelDtypeRoundsTwice) {
  // 1.0625 + 2^-20 rounds directly to e4m3 1.125 (0x39); via fp16 it first becomes the tie 1.0625,
  // then 1.0 (0x38) (fp8_spec.md 2.3).
  spec::KvQuant q;
  q.cache_dtype = DType::kFp8E4M3;
  spec::ModelConfig c = tiny_config();
  c.act_dtype = DType::kF32;
  EXPECT_EQ(fp8_write(q, float_of(0x3F880008u), 1.0f), 0x39);
  EXPECT_EQ(quantize_kv(float_of(0x3F880008u), 1.0f,
                        {DType::kFp8E4M3, spec::Saturation::kSatFinite, spec::ScaleMode::kNone,
                         false, true},
                        DType::kF16),
            0x38);
}

TEST(WriteLayer, BlockScaleIndexKHandChecked) {
  spec::ModelConfig c = tiny_config();
  c.layers = {spec::LayerKind::kSparse};
  c.index.layout = spec::IndexLayout::kBlockScale;
  c.index.ue8m0 = true;
  const PagedCacheLayout layout(c);
  spec::LayerWrite w = tiny_write({2}, 1);  // slot 2: block 1, offset 0
  w.kind = spec::LayerKind::kSparse;
  std::vector<float> idx(128);
  for (int i = 0; i < 128; ++i) idx[static_cast<std::size_t>(i)] = static_cast<float>(i - 64);
  w.index_k = f32_tensor({1, 128}, idx);
  for (const auto& [name, fn] : forms()) {
    spec::LayerCaches caches = make_layer_caches(layout, 0, spec::LayerKind::kSparse);
    fn(c, w, caches);
    const std::uint8_t* block =
        caches.find(BufferKind::kIndexK)->body() + layout.blockscale_block_bytes();
    // amax 64; s = 64/448 = 0x3E124925, rounded up to 0.25 (0x3E800000); q = e4m3(4x).
    EXPECT_EQ(load_code(block + 2 * 128, DType::kF32), 0x3E800000u) << name;
    EXPECT_EQ(block[0], 0xF8) << name;    // -256
    EXPECT_EQ(block[64], 0x00) << name;   // 0
    EXPECT_EQ(block[127], 0x78) << name;  // 252 -> 256
  }
  c.index.ue8m0 = false;
  for (const auto& [name, fn] : forms()) {
    spec::LayerCaches caches = make_layer_caches(layout, 0, spec::LayerKind::kSparse);
    fn(c, w, caches);
    const std::uint8_t* block =
        caches.find(BufferKind::kIndexK)->body() + layout.blockscale_block_bytes();
    EXPECT_EQ(load_code(block + 2 * 128, DType::kF32), 0x3E124925u) << name;
    EXPECT_EQ(block[0], 0xFE) << name;    // -64 / s = -447.99998 -> -448
    EXPECT_EQ(block[127], 0x7E) << name;  // 63 / s = 440.99998 -> 448
  }
}

TEST(WriteLayer, UnfusedPathModelsTwelveOrEightLaunches) {
  spec::ModelConfig c = tiny_config();
  c.layers = {spec::LayerKind::kSparse};
  const PagedCacheLayout layout(c);
  spec::LayerWrite w = tiny_write({1}, 1);
  spec::LayerCaches dense = make_layer_caches(layout, 0, spec::LayerKind::kDense);
  EXPECT_EQ(write_layer_unfused(c, w, dense), 8);
  w.kind = spec::LayerKind::kSparse;
  w.index_k = f32_tensor({1, 128}, std::vector<float>(128, 1.0f));
  spec::LayerCaches sparse = make_layer_caches(layout, 0, spec::LayerKind::kSparse);
  EXPECT_EQ(write_layer_unfused(c, w, sparse), 12);
}

struct BadInput {
  const char* what;
  std::function<void(spec::ModelConfig&, spec::LayerWrite&)> corrupt;
  const char* field;
  std::int64_t index;
};

TEST(WriteLayer, BadInputIsRejectedNamingFieldIndexAndValueAndNothingIsWritten) {
  const std::vector<BadInput> cases{
      {"slot past the end",
       [](auto&, auto& w) {
         w.slots.slots = {0, 4};
       },
       "slot_mapping", 1},
      {"duplicate slot",
       [](auto&, auto& w) {
         w.slots.slots = {2, 1, 2};
       },
       "slot_mapping", 2},
      {"int32 overflow",
       [](auto& c, auto& w) {
         c.slot_type = spec::SlotType::kI32;
         w.slots = {spec::SlotType::kI32, {0, -(1ll << 33)}};
       },
       "slot_mapping", 1},
      {"legacy slot below -capacity",
       [](auto& c, auto& w) {
         c.slot_mode = spec::SlotMode::kLegacyWrap;
         w.slots.slots = {-5};
       },
       "slot_mapping", 0},
      {"zero scale", [](auto&, auto& w) { w.k_scale = {0.0f}; }, "k_scale", 0},
      {"NaN scale", [](auto&, auto& w) { w.v_scale = {NAN}; }, "v_scale", 0},
      {"too few source rows",
       [](auto&, auto& w) {
         w.slots.slots = {0, 1, 2, 3, -1};
       },
       "k.shape", 0},
      {"wrong activation dtype", [](auto&, auto& w) { w.v.dtype = DType::kBF16; }, "v.dtype", -1},
      {"head_dim not a multiple of 8", [](auto& c, auto&) { c.geometry.head_dim = 12; }, "head_dim",
       -1},
      {"block size 0", [](auto& c, auto&) { c.geometry.block_size = 0; }, "block_size", -1},
      {"index on a dense layer",
       [](auto&, auto& w) {
         w.index_k = f32_tensor({4, 128}, std::vector<float>(512));
       },
       "index_k", -1},
  };
  for (const BadInput& bad : cases) {
    spec::ModelConfig c = tiny_config();
    spec::LayerWrite w = tiny_write({0, 1}, 4);
    bad.corrupt(c, w);
    const PagedCacheLayout layout(tiny_config());
    for (const auto& [name, fn] : forms()) {
      const spec::LayerCaches before = make_layer_caches(layout, 0, spec::LayerKind::kDense);
      spec::LayerCaches caches = before;
      try {
        fn(c, w, caches);
        ADD_FAILURE() << name << " accepted: " << bad.what;
      } catch (const spec::InvalidInput& e) {
        EXPECT_EQ(e.field(), bad.field) << name << ": " << bad.what << ": " << e.what();
        EXPECT_EQ(e.index(), bad.index) << name << ": " << bad.what << ": " << e.what();
        EXPECT_FALSE(e.value().empty()) << name << ": " << bad.what;
      }
      for (std::size_t b = 0; b < caches.buffers.size(); ++b) {
        EXPECT_EQ(caches.buffers[b].storage, before.buffers[b].storage)
            << name << " wrote on " << bad.what;
      }
    }
  }
}

TEST(WriteLayer, PerHeadScalesNeedOnePerHead) {
  spec::ModelConfig c = tiny_config();
  c.kv.per_head_scale = true;
  c.geometry.num_kv_heads = 2;
  spec::LayerWrite w = tiny_write({0}, 1);
  w.k = f32_tensor({1, 2, 8}, std::vector<float>(16, 1.0f));
  w.v = w.k;
  w.k_scale = {1.0f, 2.0f};
  w.v_scale = {1.0f};  // one short
  const PagedCacheLayout layout(c);
  spec::LayerCaches caches = make_layer_caches(layout, 0, spec::LayerKind::kDense);
  try {
    write_layer(c, w, caches);
    FAIL() << "accepted one scale for two heads";
  } catch (const spec::InvalidInput& e) {
    EXPECT_EQ(e.field(), "v_scale");
    EXPECT_NE(std::string(e.what()).find("one per KV head"), std::string::npos) << e.what();
  }
}

TEST(LayerMix, ParsesRunLengthAndLetters) {
  const auto m3 = spec::parse_layer_mix(spec::kDefaultLayerMix);
  ASSERT_EQ(m3.size(), 60u);
  EXPECT_EQ(m3[2], spec::LayerKind::kDense);
  EXPECT_EQ(m3[3], spec::LayerKind::kSparse);
  EXPECT_EQ(spec::format_layer_mix(spec::parse_layer_mix("ddSSs")), "2D3S");
  EXPECT_EQ(spec::format_layer_mix(spec::parse_layer_mix("2D1S2D")), "2DS2D");
  for (const char* bad : {"", "3", "3X", "0D", "D-S", "999999999999D"}) {
    EXPECT_THROW(spec::parse_layer_mix(bad), spec::InvalidInput) << bad;
  }
  try {
    spec::parse_layer_mix("3D5Q");
  } catch (const spec::InvalidInput& e) {
    EXPECT_EQ(e.index(), 3);
    EXPECT_NE(std::string(e.what()).find("'Q'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvo::subjects
