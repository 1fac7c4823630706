// Tests of the number conversions of SPEC section 2 (kvo/reference/numbers.hpp) against the
// contract research/fp8_spec.md: the vectors of its section 8 (transcribed from the spec, never
// computed by the code under test), cheap exhaustive round trips over every fp8, bf16 and fp16
// code, and rapidcheck properties of saturation, scale modes and via_model_dtype. The full
// comparison with CUDA's own conversion functions is test_numbers_exhaustive.cpp.

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "kvo/reference/numbers.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/types.hpp"

namespace kvo::reference {
namespace {

using spec::DType;
using spec::KvQuant;
using spec::Saturation;
using spec::ScaleMode;

constexpr std::uint32_t kCanonicalF32NaN = 0x7FFFFFFFu;   // fp8/fp16 -> float32 of any NaN code
constexpr std::uint32_t kCanonicalNarrowNaN16 = 0x7FFFu;  // float32 -> bf16/fp16 of any NaN
constexpr std::uint32_t kCanonicalFp8NaN = 0x7Fu;         // float32 -> fp8 of any NaN (CUDA)

std::string hex(std::uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*X", digits, v);
  return buf;
}

int code_digits(DType t) { return static_cast<int>(2 * spec::dtype_bytes(t)); }

bool is_nan_bits(std::uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

// ---------------------------------------------------------------------------------------------
// fp8_spec.md 8.1: 69 float32 inputs, every column. torch_e5m2 is not a column of the spec's table:
// it is the spec's rule spelled out per row ("Additional e5m2 NaN rows": torch <= 2.11 gives 0x7F /
// 0xFF for +-NaN; "Non-NaN overflow under torch <= 2.11 e5m2 equals the e5m2 NOSAT column"; and
// section 4a: every convention agrees on inputs that are neither NaN nor overflow).

struct Vector81 {
  int row;
  std::uint32_t input;
  std::uint8_t e4m3_satfinite;
  std::uint8_t e4m3_nosat;
  std::uint8_t e5m2_satfinite;
  std::uint8_t e5m2_nosat;
  std::uint16_t bf16;
  std::uint16_t f16;
  std::uint8_t torch_e4m3;
  std::uint8_t torch_e5m2;
};

// clang-format off
constexpr std::array<Vector81, 69> kVectors81{{
    {1, 0x00000000, 0x00, 0x00, 0x00, 0x00, 0x0000, 0x0000, 0x00, 0x00},  // +0
    {2, 0x80000000, 0x80, 0x80, 0x80, 0x80, 0x8000, 0x8000, 0x80, 0x80},  // -0
    {3, 0x3F800000, 0x38, 0x38, 0x3C, 0x3C, 0x3F80, 0x3C00, 0x38, 0x3C},  // 1.0
    {4, 0xBF800000, 0xB8, 0xB8, 0xBC, 0xBC, 0xBF80, 0xBC00, 0xB8, 0xBC},  // -1.0
    {5, 0x3F880000, 0x38, 0x38, 0x3C, 0x3C, 0x3F88, 0x3C40, 0x38, 0x3C},  // 1.0625
    {6, 0x3F980000, 0x3A, 0x3A, 0x3D, 0x3D, 0x3F98, 0x3CC0, 0x3A, 0x3D},  // 1.1875
    {7, 0x3F880008, 0x39, 0x39, 0x3C, 0x3C, 0x3F88, 0x3C40, 0x39, 0x3C},  // 1.0625+2^-20
    {8, 0x3F87FFFF, 0x38, 0x38, 0x3C, 0x3C, 0x3F88, 0x3C40, 0x38, 0x3C},  // 1.0625-2^-23
    {9, 0x41880000, 0x58, 0x58, 0x4C, 0x4C, 0x4188, 0x4C40, 0x58, 0x4C},  // 17
    {10, 0x41980000, 0x5A, 0x5A, 0x4D, 0x4D, 0x4198, 0x4CC0, 0x5A, 0x4D},  // 19
    {11, 0x41780000, 0x58, 0x58, 0x4C, 0x4C, 0x4178, 0x4BC0, 0x58, 0x4C},  // 15.5
    {12, 0x3DCCCCCD, 0x1D, 0x1D, 0x2E, 0x2E, 0x3DCD, 0x2E66, 0x1D, 0x2E},  // 0.1
    {13, 0xC0490FDB, 0xC5, 0xC5, 0xC2, 0xC2, 0xC049, 0xC248, 0xC5, 0xC2},  // -pi
    {14, 0x43700000, 0x77, 0x77, 0x5C, 0x5C, 0x4370, 0x5B80, 0x77, 0x5C},  // 240
    {15, 0x43800000, 0x78, 0x78, 0x5C, 0x5C, 0x4380, 0x5C00, 0x78, 0x5C},  // 256
    {16, 0x3C800000, 0x08, 0x08, 0x24, 0x24, 0x3C80, 0x2400, 0x08, 0x24},  // 2^-6
    {17, 0x3C700000, 0x08, 0x08, 0x24, 0x24, 0x3C70, 0x2380, 0x08, 0x24},  // 7.5*2^-9
    {18, 0x3C600000, 0x07, 0x07, 0x23, 0x23, 0x3C60, 0x2300, 0x07, 0x23},  // 7*2^-9
    {19, 0x3B600000, 0x02, 0x02, 0x1B, 0x1B, 0x3B60, 0x1B00, 0x02, 0x1B},  // 1.75*2^-9
    {20, 0x3B200000, 0x01, 0x01, 0x19, 0x19, 0x3B20, 0x1900, 0x01, 0x19},  // 1.25*2^-9
    {21, 0x3B400000, 0x02, 0x02, 0x1A, 0x1A, 0x3B40, 0x1A00, 0x02, 0x1A},  // 1.5*2^-9
    {22, 0x3BA00000, 0x02, 0x02, 0x1D, 0x1D, 0x3BA0, 0x1D00, 0x02, 0x1D},  // 2.5*2^-9
    {23, 0x3BE00000, 0x04, 0x04, 0x1F, 0x1F, 0x3BE0, 0x1F00, 0x04, 0x1F},  // 3.5*2^-9
    {24, 0x3B000000, 0x01, 0x01, 0x18, 0x18, 0x3B00, 0x1800, 0x01, 0x18},  // 2^-9
    {25, 0x3A800001, 0x01, 0x01, 0x14, 0x14, 0x3A80, 0x1400, 0x01, 0x14},  // 2^-10+ulp
    {26, 0x3A800000, 0x00, 0x00, 0x14, 0x14, 0x3A80, 0x1400, 0x00, 0x14},  // 2^-10
    {27, 0xBA800000, 0x80, 0x80, 0x94, 0x94, 0xBA80, 0x9400, 0x80, 0x94},  // -2^-10
    {28, 0x43E00000, 0x7E, 0x7E, 0x5F, 0x5F, 0x43E0, 0x5F00, 0x7E, 0x5F},  // 448
    {29, 0x43E08000, 0x7E, 0x7E, 0x5F, 0x5F, 0x43E0, 0x5F04, 0x7E, 0x5F},  // 449
    {30, 0x43E80000, 0x7E, 0x7E, 0x5F, 0x5F, 0x43E8, 0x5F40, 0x7E, 0x5F},  // 464
    {31, 0x43E80001, 0x7E, 0x7F, 0x5F, 0x5F, 0x43E8, 0x5F40, 0x7F, 0x5F},  // 464+ulp
    {32, 0x43EE0000, 0x7E, 0x7F, 0x5F, 0x5F, 0x43EE, 0x5F70, 0x7F, 0x5F},  // 476
    {33, 0xC3EE0000, 0xFE, 0xFF, 0xDF, 0xDF, 0xC3EE, 0xDF70, 0xFF, 0xDF},  // -476
    {34, 0x43F00000, 0x7E, 0x7F, 0x60, 0x60, 0x43F0, 0x5F80, 0x7F, 0x60},  // 480
    {35, 0xC3F00000, 0xFE, 0xFF, 0xE0, 0xE0, 0xC3F0, 0xDF80, 0xFF, 0xE0},  // -480
    {36, 0x49742400, 0x7E, 0x7F, 0x7B, 0x7C, 0x4974, 0x7C00, 0x7F, 0x7C},  // 1e6
    {37, 0x47600000, 0x7E, 0x7F, 0x7B, 0x7B, 0x4760, 0x7B00, 0x7F, 0x7B},  // 57344
    {38, 0x476FFFFF, 0x7E, 0x7F, 0x7B, 0x7B, 0x4770, 0x7B80, 0x7F, 0x7B},  // 61439.996
    {39, 0x47700000, 0x7E, 0x7F, 0x7B, 0x7C, 0x4770, 0x7B80, 0x7F, 0x7C},  // 61440
    {40, 0xC7700000, 0xFE, 0xFF, 0xFB, 0xFC, 0xC770, 0xFB80, 0xFF, 0xFC},  // -61440
    {41, 0x37800000, 0x00, 0x00, 0x01, 0x01, 0x3780, 0x0100, 0x00, 0x01},  // 2^-16
    {42, 0x37000001, 0x00, 0x00, 0x01, 0x01, 0x3700, 0x0080, 0x00, 0x01},  // 2^-17+ulp
    {43, 0x37000000, 0x00, 0x00, 0x00, 0x00, 0x3700, 0x0080, 0x00, 0x00},  // 2^-17
    {44, 0xB7000000, 0x80, 0x80, 0x80, 0x80, 0xB700, 0x8080, 0x80, 0x80},  // -2^-17
    {45, 0x38800000, 0x00, 0x00, 0x04, 0x04, 0x3880, 0x0400, 0x00, 0x04},  // 2^-14
    {46, 0x3F808000, 0x38, 0x38, 0x3C, 0x3C, 0x3F80, 0x3C04, 0x38, 0x3C},  // 1+2^-8
    {47, 0x3F818000, 0x38, 0x38, 0x3C, 0x3C, 0x3F82, 0x3C0C, 0x38, 0x3C},  // 1+3*2^-8
    {48, 0x3F808001, 0x38, 0x38, 0x3C, 0x3C, 0x3F81, 0x3C04, 0x38, 0x3C},  // 1+2^-8+ulp
    {49, 0x3F801000, 0x38, 0x38, 0x3C, 0x3C, 0x3F80, 0x3C00, 0x38, 0x3C},  // 1+2^-11
    {50, 0x3F803000, 0x38, 0x38, 0x3C, 0x3C, 0x3F80, 0x3C02, 0x38, 0x3C},  // 1+3*2^-11
    {51, 0x477FE000, 0x7E, 0x7F, 0x7B, 0x7C, 0x4780, 0x7BFF, 0x7F, 0x7C},  // 65504
    {52, 0x477FEFFF, 0x7E, 0x7F, 0x7B, 0x7C, 0x4780, 0x7BFF, 0x7F, 0x7C},  // 65519.996
    {53, 0x477FF000, 0x7E, 0x7F, 0x7B, 0x7C, 0x4780, 0x7C00, 0x7F, 0x7C},  // 65520
    {54, 0x33000000, 0x00, 0x00, 0x00, 0x00, 0x3300, 0x0000, 0x00, 0x00},  // 2^-25
    {55, 0x33000001, 0x00, 0x00, 0x00, 0x00, 0x3300, 0x0001, 0x00, 0x00},  // 2^-25+ulp
    {56, 0x33400000, 0x00, 0x00, 0x00, 0x00, 0x3340, 0x0001, 0x00, 0x00},  // 3*2^-25
    {57, 0x7F7F7FFF, 0x7E, 0x7F, 0x7B, 0x7C, 0x7F7F, 0x7C00, 0x7F, 0x7C},  // bf16 below ovf tie
    {58, 0x7F7F8000, 0x7E, 0x7F, 0x7B, 0x7C, 0x7F80, 0x7C00, 0x7F, 0x7C},  // bf16 tie -> inf
    {59, 0x7F7FFFFF, 0x7E, 0x7F, 0x7B, 0x7C, 0x7F80, 0x7C00, 0x7F, 0x7C},  // FLT_MAX
    {60, 0x00800000, 0x00, 0x00, 0x00, 0x00, 0x0080, 0x0000, 0x00, 0x00},  // FLT_MIN
    {61, 0x00000001, 0x00, 0x00, 0x00, 0x00, 0x0000, 0x0000, 0x00, 0x00},  // smallest f32 subnormal
    {62, 0x80000001, 0x80, 0x80, 0x80, 0x80, 0x8000, 0x8000, 0x80, 0x80},  // -min subnormal
    {63, 0x7F800000, 0x7E, 0x7F, 0x7B, 0x7C, 0x7F80, 0x7C00, 0x7F, 0x7C},  // +inf
    {64, 0xFF800000, 0xFE, 0xFF, 0xFB, 0xFC, 0xFF80, 0xFC00, 0xFF, 0xFC},  // -inf
    {65, 0x7FC00000, 0x7F, 0x7F, 0x7F, 0x7F, 0x7FFF, 0x7FFF, 0x7F, 0x7F},  // +qNaN
    {66, 0xFFC00000, 0x7F, 0x7F, 0x7F, 0x7F, 0x7FFF, 0x7FFF, 0xFF, 0xFF},  // -qNaN
    {67, 0x7F800001, 0x7F, 0x7F, 0x7F, 0x7F, 0x7FFF, 0x7FFF, 0x7F, 0x7F},  // +sNaN
    {68, 0xFF800001, 0x7F, 0x7F, 0x7F, 0x7F, 0x7FFF, 0x7FFF, 0xFF, 0xFF},  // -sNaN
    {69, 0x7FFFFFFF, 0x7F, 0x7F, 0x7F, 0x7F, 0x7FFF, 0x7FFF, 0x7F, 0x7F},  // NaN all-ones payload
}};
// clang-format on

struct Column81 {
  const char* name;
  DType dtype;
  Saturation sat;
  std::uint32_t (*expected)(const Vector81&);
};

const std::array<Column81, 8> kColumns81{{
    {"e4m3_satfinite", DType::kFp8E4M3, Saturation::kSatFinite,
     [](const Vector81& v) -> std::uint32_t { return v.e4m3_satfinite; }},
    {"e4m3_nosat", DType::kFp8E4M3, Saturation::kNoSat,
     [](const Vector81& v) -> std::uint32_t { return v.e4m3_nosat; }},
    {"e5m2_satfinite", DType::kFp8E5M2, Saturation::kSatFinite,
     [](const Vector81& v) -> std::uint32_t { return v.e5m2_satfinite; }},
    {"e5m2_nosat", DType::kFp8E5M2, Saturation::kNoSat,
     [](const Vector81& v) -> std::uint32_t { return v.e5m2_nosat; }},
    {"bf16", DType::kBF16, Saturation::kSatFinite,
     [](const Vector81& v) -> std::uint32_t { return v.bf16; }},
    {"f16", DType::kF16, Saturation::kSatFinite,
     [](const Vector81& v) -> std::uint32_t { return v.f16; }},
    {"torch_e4m3", DType::kFp8E4M3, Saturation::kTorch,
     [](const Vector81& v) -> std::uint32_t { return v.torch_e4m3; }},
    {"torch_e5m2", DType::kFp8E5M2, Saturation::kTorch,
     [](const Vector81& v) -> std::uint32_t { return v.torch_e5m2; }},
}};

/// The dedicated function of each target type (encode() is checked separately: both must agree).
std::uint32_t convert_direct(float x, DType t, Saturation sat) {
  switch (spec::format_of(t).codec) {
    case spec::Codec::kBf16:
      return f32_to_bf16(x);
    case spec::Codec::kF16:
      return f32_to_f16(x);
    case spec::Codec::kSmallFloat:
      return f32_to_fp8(x, t, sat);
    case spec::Codec::kF32:
      break;
  }
  return bits_of(x);
}

TEST(Fp8SpecVectors, Section81RowsAreComplete) {
  for (std::size_t i = 0; i < kVectors81.size(); ++i) {
    EXPECT_EQ(kVectors81[i].row, static_cast<int>(i) + 1) << "transcription of 8.1 out of order";
  }
}

// gtest names the instances 0, 1, ...; ctest's discovery replaces the index with this printed
// value, so the ctest names read ".../EveryRow/e4m3_satfinite".
void PrintTo(const Column81& c, std::ostream* os) { *os << c.name; }

class Section81 : public ::testing::TestWithParam<Column81> {};

TEST_P(Section81, EveryRow) {
  const Column81& col = GetParam();
  const int digits = code_digits(col.dtype);
  for (const Vector81& v : kVectors81) {
    const std::uint32_t want = col.expected(v);
    const float x = float_of(v.input);
    const std::uint32_t via_encode = encode(x, col.dtype, col.sat);
    const std::uint32_t via_direct = convert_direct(x, col.dtype, col.sat);
    if (via_encode != want) {
      ADD_FAILURE() << "fp8_spec.md 8.1 row " << v.row << " input " << hex(v.input, 8) << " column "
                    << col.name << ": expected " << hex(want, digits) << ", encode() gave "
                    << hex(via_encode, digits);
    }
    if (via_direct != want) {
      ADD_FAILURE() << "fp8_spec.md 8.1 row " << v.row << " input " << hex(v.input, 8) << " column "
                    << col.name << ": expected " << hex(want, digits)
                    << ", the direct conversion gave " << hex(via_direct, digits);
    }
    // 16-bit targets ignore the saturation mode (types.hpp): every mode must give the same code.
    if (!spec::is_fp8(col.dtype)) {
      for (const Saturation other : {Saturation::kNoSat, Saturation::kTorch}) {
        const std::uint32_t got = encode(x, col.dtype, other);
        if (got != want) {
          ADD_FAILURE() << "fp8_spec.md 8.1 row " << v.row << " input " << hex(v.input, 8)
                        << " column " << col.name << " with saturation " << spec::name_of(other)
                        << ": expected " << hex(want, digits) << ", encode() gave "
                        << hex(got, digits);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fp8SpecVectors, Section81, ::testing::ValuesIn(kColumns81));

// ---------------------------------------------------------------------------------------------
// fp8_spec.md 8.2: UE8M0 block scales. kvoracle's block scale is DeepGEMM's (amax floor 1e-4,
// /448). The last two columns are hand-derived, not from the spec's table: the e4m3 code of the
// group's amax element without and with ue8m0 (e.g. 1000 / 2^2 = 250 -> 256 = 0x78; 449 / 2 = 224.5
// -> 224 = 0x76; 9.99999975e-06 / 2^-22 = 41.9 -> 40 = 0x62, / 2.23214286e-07 = 44.8 -> 44 = 0x63).

struct Ue8m0Vector {
  std::uint32_t amax;
  std::uint32_t vllm_ys;
  std::uint32_t vllm_ue8m0;
  std::uint32_t vllm_byte;
  std::uint32_t deepgemm_sf;
  std::uint32_t deepgemm_ue8m0;
  std::uint32_t deepgemm_byte;
  std::uint8_t amax_code;        ///< hand-derived: e4m3(amax / deepgemm_sf)
  std::uint8_t amax_code_ue8m0;  ///< hand-derived: e4m3(amax / deepgemm_ue8m0)
};

// clang-format off
constexpr std::array<Ue8m0Vector, 14> kUe8m0Vectors{{
    {0x00000000, 0x2A7B5123, 0x2F000000, 0x5E, 0x346FACAD, 0x34800000, 0x69, 0x00, 0x00},  // 0
    {0x2B8CBCCC, 0x2A7B5123, 0x2F000000, 0x5E, 0x346FACAD, 0x34800000, 0x69, 0x00, 0x00},  // 1e-12
    {0x3727C5AC, 0x32BFBD57, 0x33000000, 0x66, 0x346FACAD, 0x34800000, 0x69, 0x63, 0x62},  // 1e-5
    {0x3F800000, 0x3B124925, 0x3B800000, 0x77, 0x3B124925, 0x3B800000, 0x77, 0x7E, 0x78},  // 1
    {0x40600000, 0x3C000000, 0x3C000000, 0x78, 0x3C000000, 0x3C000000, 0x78, 0x7E, 0x7E},  // 3.5
    {0x40E00000, 0x3C800000, 0x3C800000, 0x79, 0x3C800000, 0x3C800000, 0x79, 0x7E, 0x7E},  // 7
    {0x43DF8000, 0x3F7F6DB7, 0x3F800000, 0x7F, 0x3F7F6DB7, 0x3F800000, 0x7F, 0x7E, 0x7E},  // 447
    {0x43E00000, 0x3F800000, 0x3F800000, 0x7F, 0x3F800000, 0x3F800000, 0x7F, 0x7E, 0x7E},  // 448
    {0x43E08000, 0x3F804925, 0x40000000, 0x80, 0x3F804925, 0x40000000, 0x80, 0x7E, 0x76},  // 449
    {0x44600000, 0x40000000, 0x40000000, 0x80, 0x40000000, 0x40000000, 0x80, 0x7E, 0x7E},  // 896
    {0x447A0000, 0x400EDB6E, 0x40800000, 0x81, 0x400EDB6E, 0x40800000, 0x81, 0x7E, 0x78},  // 1000
    {0x3D600000, 0x39000000, 0x39000000, 0x72, 0x39000000, 0x39000000, 0x72, 0x7E, 0x7E},  // 7/128
    {0x477FE000, 0x431236DB, 0x43800000, 0x87, 0x431236DB, 0x43800000, 0x87, 0x7E, 0x78},  // 65504
    {0x7F61B1E6, 0x7B00F7F1, 0x7B800000, 0xF7, 0x7B00F7F1, 0x7B800000, 0xF7, 0x7E, 0x76},  // 3e38
}};
// clang-format on

constexpr std::size_t kGroup = static_cast<std::size_t>(spec::kScaleGroup);

/// The blockscale index quantization with the plain divide formula, with or without ue8m0.
spec::IndexQuant blockscale(bool ue8m0) {
  spec::IndexQuant q;
  q.layout = spec::IndexLayout::kBlockScale;
  q.ue8m0 = ue8m0;
  return q;
}

TEST(Fp8SpecVectors, Section82DeepGemmBlockScale) {
  for (const Ue8m0Vector& v : kUe8m0Vectors) {
    const float amax = float_of(v.amax);
    // A group whose only non-zero element is the amax, at an arbitrary position.
    std::vector<float> x(kGroup, 0.0f);
    constexpr std::size_t kAt = 37;
    x[kAt] = amax;
    for (const bool ue8m0 : {false, true}) {
      std::vector<std::uint8_t> q(kGroup, 0xAA);
      const float s = quantize_group_blockscale(x, blockscale(ue8m0), q);
      const std::uint32_t want = ue8m0 ? v.deepgemm_ue8m0 : v.deepgemm_sf;
      EXPECT_EQ(hex(bits_of(s), 8), hex(want, 8))
          << "amax " << hex(v.amax, 8) << (ue8m0 ? " ue8m0" : " plain");
      const std::uint8_t want_code = ue8m0 ? v.amax_code_ue8m0 : v.amax_code;
      EXPECT_EQ(hex(q[kAt], 2), hex(want_code, 2))
          << "code of the amax element, amax " << hex(v.amax, 8) << (ue8m0 ? " ue8m0" : " plain");
      for (std::size_t i = 0; i < kGroup; ++i) {
        if (i != kAt && q[i] != 0) {
          ADD_FAILURE() << "element " << i << " of a zero is " << hex(q[i], 2) << ", amax "
                        << hex(v.amax, 8);
        }
      }
    }
    // The bit rule itself, on the spec's plain scale, and the byte it stores.
    EXPECT_EQ(hex(bits_of(ue8m0_ceil(float_of(v.deepgemm_sf))), 8), hex(v.deepgemm_ue8m0, 8));
    EXPECT_EQ(v.deepgemm_ue8m0 >> 23, v.deepgemm_byte);
  }
}

TEST(Fp8SpecVectors, Section82VllmUe8m0Column) {
  // vLLM applies a second clamp, fmaxf(y_s, 1e-10f), before the same bit rule (fp8_spec.md 6.2).
  for (const Ue8m0Vector& v : kUe8m0Vectors) {
    const float ys = std::fmax(float_of(v.vllm_ys), 1e-10f);
    EXPECT_EQ(hex(bits_of(ue8m0_ceil(ys)), 8), hex(v.vllm_ue8m0, 8)) << "y_s " << hex(v.vllm_ys, 8);
    EXPECT_EQ(v.vllm_ue8m0 >> 23, v.vllm_byte);
  }
}

TEST(BlockScale, AllZeroGroup) {
  const std::vector<float> x(kGroup, 0.0f);
  std::vector<std::uint8_t> q(kGroup, 0xAA);
  EXPECT_EQ(hex(bits_of(quantize_group_blockscale(x, blockscale(false), q)), 8),
            "0x346FACAD");  // 1e-4 / 448
  for (std::size_t i = 0; i < kGroup; ++i) EXPECT_EQ(q[i], 0u) << "element " << i;
  std::fill(q.begin(), q.end(), 0xAA);
  EXPECT_EQ(hex(bits_of(quantize_group_blockscale(x, blockscale(true), q)), 8),
            "0x34800000");  // 2^-22
  for (std::size_t i = 0; i < kGroup; ++i) EXPECT_EQ(q[i], 0u) << "element " << i;
}

/// A group with NaN elements (quiet or signalling, per `nan_bits`) and amax 1 elsewhere.
void check_nan_group(std::uint32_t nan_bits) {
  std::vector<float> x(kGroup, 0.0f);
  x[0] = float_of(nan_bits);                // first: a naive "amax = x[0]" would poison the scale
  x[5] = float_of(nan_bits | 0x80000000u);  // -NaN: the sign is dropped under satfinite
  x[64] = float_of(nan_bits);               // after the amax
  x[10] = 1.0f;                             // the amax
  x[11] = -0.5f;
  x[127] = -0.0f;
  struct Want {
    bool ue8m0;
    std::uint32_t scale;
    std::uint8_t one, minus_half;
  };
  // amax 1: plain scale 0x3B124925 (8.2), 1/s ~ 448 -> 0x7E, -0.5/s ~ -224 -> 0xF6;
  // ue8m0 scale 2^-8: 1 -> 256 = 0x78, -0.5 -> -128 = 0xF0.
  for (const Want& w :
       {Want{false, 0x3B124925u, 0x7E, 0xF6}, Want{true, 0x3B800000u, 0x78, 0xF0}}) {
    SCOPED_TRACE(std::string("NaN ") + hex(nan_bits, 8) + (w.ue8m0 ? " ue8m0" : " plain"));
    std::vector<std::uint8_t> q(kGroup, 0xAA);
    EXPECT_EQ(hex(bits_of(quantize_group_blockscale(x, blockscale(w.ue8m0), q)), 8),
              hex(w.scale, 8));
    EXPECT_EQ(hex(q[0], 2), "0x7F");
    EXPECT_EQ(hex(q[5], 2), "0x7F");
    EXPECT_EQ(hex(q[64], 2), "0x7F");
    EXPECT_EQ(hex(q[10], 2), hex(w.one, 2));
    EXPECT_EQ(hex(q[11], 2), hex(w.minus_half, 2));
    EXPECT_EQ(hex(q[127], 2), "0x80");
    for (std::size_t i : {1u, 6u, 12u, 100u, 126u}) EXPECT_EQ(q[i], 0u) << "element " << i;
  }
}

TEST(BlockScale, QuietNaNIsIgnoredForAmaxAndEncodesAs7F) { check_nan_group(0x7FC00000u); }

// fmaxf semantics (CUDA, SPEC 2) ignore every NaN. glibc's std::fmax does not ignore a signalling
// NaN (it returns NaN, IEEE 754-2008 maxNum), and bf16 data can hold one (0x7F81 widens to the
// float32 sNaN 0x7F810000).
TEST(BlockScale, SignallingNaNIsIgnoredForAmaxAndEncodesAs7F) {
  check_nan_group(0x7F800001u);
  check_nan_group(0x7F810000u);
}

// ---------------------------------------------------------------------------------------------
// fp8_spec.md 8.3: the E4M3FN decode table (magnitudes, code 0x00..0x7E) and the decode vectors.

// clang-format off
constexpr std::array<double, 127> kE4M3Magnitude{{
    0, 0.001953125, 0.00390625, 0.005859375, 0.0078125, 0.009765625, 0.01171875, 0.013671875,
    0.015625, 0.017578125, 0.01953125, 0.021484375, 0.0234375, 0.025390625, 0.02734375, 0.029296875,
    0.03125, 0.03515625, 0.0390625, 0.04296875, 0.046875, 0.05078125, 0.0546875, 0.05859375,
    0.0625, 0.0703125, 0.078125, 0.0859375, 0.09375, 0.1015625, 0.109375, 0.1171875,
    0.125, 0.140625, 0.15625, 0.171875, 0.1875, 0.203125, 0.21875, 0.234375,
    0.25, 0.28125, 0.3125, 0.34375, 0.375, 0.40625, 0.4375, 0.46875,
    0.5, 0.5625, 0.625, 0.6875, 0.75, 0.8125, 0.875, 0.9375,
    1, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875,
    2, 2.25, 2.5, 2.75, 3, 3.25, 3.5, 3.75,
    4, 4.5, 5, 5.5, 6, 6.5, 7, 7.5,
    8, 9, 10, 11, 12, 13, 14, 15,
    16, 18, 20, 22, 24, 26, 28, 30,
    32, 36, 40, 44, 48, 52, 56, 60,
    64, 72, 80, 88, 96, 104, 112, 120,
    128, 144, 160, 176, 192, 208, 224, 240,
    256, 288, 320, 352, 384, 416, 448,
}};
// clang-format on

TEST(Fp8SpecVectors, Section83E4M3DecodeTable) {
  for (std::uint32_t c = 0; c < 0x7F; ++c) {
    const float mag = static_cast<float>(kE4M3Magnitude[c]);
    EXPECT_EQ(hex(bits_of(fp8_to_f32(static_cast<std::uint8_t>(c), DType::kFp8E4M3)), 8),
              hex(bits_of(mag), 8))
        << "code " << hex(c, 2);
    EXPECT_EQ(hex(bits_of(fp8_to_f32(static_cast<std::uint8_t>(c | 0x80), DType::kFp8E4M3)), 8),
              hex(bits_of(-mag), 8))
        << "code " << hex(c | 0x80, 2);
    EXPECT_EQ(bits_of(decode(c, DType::kFp8E4M3)), bits_of(mag)) << "decode() of " << hex(c, 2);
  }
  EXPECT_EQ(bits_of(fp8_to_f32(0x7F, DType::kFp8E4M3)), kCanonicalF32NaN);
  EXPECT_EQ(bits_of(fp8_to_f32(0xFF, DType::kFp8E4M3)), kCanonicalF32NaN);
}

TEST(Fp8SpecVectors, Section83E5M2DecodeFormula) {
  // Section 1: E=0: M*2^-16; E=1..30: (4+M)*2^(E-17); E=31: inf (M=0) or NaN. Evaluated in double.
  for (std::uint32_t c = 0; c < 256; ++c) {
    const int e = static_cast<int>((c >> 2) & 0x1F);
    const int m = static_cast<int>(c & 3);
    const double sign = (c & 0x80) ? -1.0 : 1.0;
    std::uint32_t want;
    if (e == 31) {
      want = m == 0 ? bits_of(static_cast<float>(sign * HUGE_VAL)) : kCanonicalF32NaN;
    } else {
      want = bits_of(
          static_cast<float>(sign * (e == 0 ? std::ldexp(m, -16) : std::ldexp(4 + m, e - 17))));
    }
    EXPECT_EQ(hex(bits_of(fp8_to_f32(static_cast<std::uint8_t>(c), DType::kFp8E5M2)), 8),
              hex(want, 8))
        << "code " << hex(c, 2);
  }
}

struct DecodeVector {
  DType format;
  std::uint8_t code;
  std::uint16_t f16;  ///< from the spec
  std::uint32_t f32;  ///< the float32 of that f16 (hand-derived; spec where it gives it)
};

TEST(Fp8SpecVectors, Section83DecodeVectors) {
  const DecodeVector vectors[] = {
      {DType::kFp8E4M3, 0x01, 0x1800, 0x3B000000},  // 2^-9
      {DType::kFp8E4M3, 0x07, 0x2300, 0x3C600000},  // 7*2^-9
      {DType::kFp8E4M3, 0x08, 0x2400, 0x3C800000},  // 2^-6
      {DType::kFp8E4M3, 0x38, 0x3C00, 0x3F800000},  // 1
      {DType::kFp8E4M3, 0x7E, 0x5F00, 0x43E00000},  // 448 (spec gives the float32 too)
      {DType::kFp8E4M3, 0xFE, 0xDF00, 0xC3E00000},  // -448
      {DType::kFp8E4M3, 0x80, 0x8000, 0x80000000},  // -0
      {DType::kFp8E4M3, 0x7F, 0x7FFF, 0x7FFFFFFF},  // NaN (spec gives the float32 too)
      {DType::kFp8E4M3, 0xFF, 0x7FFF, 0x7FFFFFFF},  // NaN, sign dropped
      {DType::kFp8E5M2, 0x7B, 0x7B00, 0x47600000},  // 57344
      {DType::kFp8E5M2, 0xFC, 0xFC00, 0xFF800000},  // -inf
      {DType::kFp8E5M2, 0x7D, 0x7FFF, 0x7FFFFFFF},  // NaN
      {DType::kFp8E5M2, 0xFE, 0x7FFF, 0x7FFFFFFF},  // NaN, sign dropped
  };
  for (const DecodeVector& v : vectors) {
    const std::string what = std::string(spec::name_of(v.format)) + " code " + hex(v.code, 2);
    const float f = fp8_to_f32(v.code, v.format);
    EXPECT_EQ(hex(bits_of(f), 8), hex(v.f32, 8)) << what << " to float32";
    // fp8 -> f16 is exact, so the f16 CUDA produces is the f16 of the float32 value.
    EXPECT_EQ(hex(f32_to_f16(f), 4), hex(v.f16, 4)) << what << " to f16";
    EXPECT_EQ(hex(bits_of(f16_to_f32(v.f16)), 8), hex(v.f32, 8)) << "f16 " << hex(v.f16, 4);
  }
}

// ---------------------------------------------------------------------------------------------
// Cheap exhaustive checks: every code of every narrow type.

bool is_fp8_nan_code(std::uint32_t c, DType format) {
  // Section 1: e4m3 NaN is only S.1111.111; e5m2 NaN is S.11111.{01,10,11}.
  return format == DType::kFp8E4M3 ? (c & 0x7F) == 0x7F : (c & 0x7F) > 0x7C;
}

TEST(Exhaustive, Fp8AllCodesRoundTrip) {
  for (const DType format : {DType::kFp8E4M3, DType::kFp8E5M2}) {
    for (std::uint32_t c = 0; c < 256; ++c) {
      const std::string what = std::string(spec::name_of(format)) + " code " + hex(c, 2);
      const float x = decode(c, format);
      if (is_fp8_nan_code(c, format)) {
        EXPECT_EQ(hex(bits_of(x), 8), hex(kCanonicalF32NaN, 8)) << what;
        // The canonical NaN is positive, so even torch (NaN keeps its sign) gives 0x7F.
        for (const Saturation sat :
             {Saturation::kSatFinite, Saturation::kNoSat, Saturation::kTorch}) {
          EXPECT_EQ(hex(encode(x, format, sat), 2), hex(kCanonicalFp8NaN, 2))
              << what << " " << spec::name_of(sat);
        }
        continue;
      }
      EXPECT_FALSE(std::isnan(x)) << what;
      const bool is_inf = format == DType::kFp8E5M2 && (c & 0x7F) == 0x7C;
      // satfinite clamps +-inf to +-57344 (0x7B | sign); everything else is its own code.
      EXPECT_EQ(hex(encode(x, format, Saturation::kSatFinite), 2), hex(is_inf ? c - 1 : c, 2))
          << what << " satfinite";
      EXPECT_EQ(hex(encode(x, format, Saturation::kNoSat), 2), hex(c, 2)) << what << " nosat";
      EXPECT_EQ(hex(encode(x, format, Saturation::kTorch), 2), hex(c, 2)) << what << " torch";
    }
  }
}

// The format table (spec::kNumberFormats) describes each format's bits once; every row's facts are
// checked through the codecs that read them, so that a row and its format cannot disagree.
TEST(NumberFormats, EveryRowAgreesWithItsCodec) {
  std::vector<std::string_view> names;
  for (const spec::NumberFormat& f : spec::kNumberFormats) {
    const std::string what(spec::name_of(f.dtype));
    names.push_back(f.safetensors_name);
    EXPECT_EQ(f.bits, 1 + f.exponent_bits + f.mantissa_bits) << what;
    EXPECT_EQ(f.bytes * 8, static_cast<std::size_t>(f.bits)) << what;
    EXPECT_EQ(spec::is_fp8(f.dtype), f.bits == 8) << what;
    EXPECT_EQ(decode(f.max_finite_code, f.dtype), f.max_finite) << what;
    EXPECT_TRUE(std::isnan(decode(f.nan_code, f.dtype))) << what;
    const float overflow = decode(f.overflow_code, f.dtype);
    EXPECT_TRUE(f.has_infinity ? std::isinf(overflow) : std::isnan(overflow)) << what;
    EXPECT_EQ(encode(f.max_finite, f.dtype, Saturation::kSatFinite), f.max_finite_code) << what;
    EXPECT_EQ(encode(INFINITY, f.dtype, Saturation::kNoSat), f.overflow_code) << what;
    // f32 stores a NaN as it is; nan_code is the canonical NaN of GPU arithmetic there.
    if (f.codec != spec::Codec::kF32) {
      EXPECT_EQ(encode(NAN, f.dtype, Saturation::kSatFinite), f.nan_code) << what;
    }
    EXPECT_EQ(encode(-0.0f, f.dtype, Saturation::kSatFinite),
              f.has_negative_zero ? spec::sign_bit(f.dtype) : 0u)
        << what;
    // The smallest subnormal is 2^(1 - bias - M).
    EXPECT_EQ(decode(1, f.dtype), std::ldexp(1.0f, 1 - f.bias - f.mantissa_bits)) << what;
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
}

// The generic narrow-float codec on rows that are not (yet) in the table: ROCm's fnuz formats,
// defined here by their definition (no -0, no infinity, 0x80 the only NaN, bias one more than the
// OCP format's). Every code decodes to its definition's value and encodes back; overflow saturates
// to the largest code or becomes the NaN; -0 becomes +0.
struct FnuzCase {
  spec::NumberFormat row;
  float max;
  int min_subnormal_exp;
};
TEST(NumberFormats, FnuzRowsFollowTheirDefinition) {
  const std::array<FnuzCase, 2> cases{{
      {{DType::kFp8E4M3, spec::Codec::kSmallFloat, 1, 8, 4, 3, 8, spec::NanEncoding::kNegativeZero,
        false, false, 0x7Fu, 0x80u, 0x80u, 240.0f, false, "F8_E4M3FNUZ", false},
       240.0f,
       -10},
      {{DType::kFp8E5M2, spec::Codec::kSmallFloat, 1, 8, 5, 2, 16, spec::NanEncoding::kNegativeZero,
        false, false, 0x7Fu, 0x80u, 0x80u, 57344.0f, false, "F8_E5M2FNUZ", false},
       57344.0f,
       -17},
  }};
  for (const FnuzCase& c : cases) {
    const spec::NumberFormat& f = c.row;
    const std::string what(f.safetensors_name);
    for (std::uint32_t code = 0; code < 256; ++code) {
      const float v = detail::small_float_value(code, f);
      if (code == 0x80) {
        EXPECT_TRUE(std::isnan(v)) << what;
        continue;
      }
      // The definition: sign, then e == 0 ? m * 2^(1 - bias - M) : (2^M + m) * 2^(e - bias - M).
      const int e = static_cast<int>(code >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1);
      const int m = static_cast<int>(code) & ((1 << f.mantissa_bits) - 1);
      float want = e == 0 ? std::ldexp(static_cast<float>(m), c.min_subnormal_exp)
                          : std::ldexp(static_cast<float>((1 << f.mantissa_bits) + m),
                                       e + c.min_subnormal_exp - 1);
      if (code & 0x80) want = -want;
      EXPECT_EQ(v, want) << what << " code " << hex(code, 2);
      for (const Saturation sat : {Saturation::kSatFinite, Saturation::kNoSat}) {
        EXPECT_EQ(hex(f32_to_small_float(v, f, sat), 2), hex(code == 0x80 || v == 0 ? 0 : code, 2))
            << what << " code " << hex(code, 2);
      }
    }
    EXPECT_EQ(detail::small_float_value(0x7F, f), c.max) << what;
    EXPECT_EQ(f32_to_small_float(-0.0f, f, Saturation::kSatFinite), 0u) << what;
    EXPECT_EQ(f32_to_small_float(1e30f, f, Saturation::kSatFinite), 0x7Fu) << what;
    EXPECT_EQ(f32_to_small_float(-1e30f, f, Saturation::kSatFinite), 0xFFu) << what;
    EXPECT_EQ(f32_to_small_float(-1e30f, f, Saturation::kNoSat), 0x80u) << what;
    EXPECT_EQ(f32_to_small_float(-INFINITY, f, Saturation::kNoSat), 0x80u) << what;
    EXPECT_EQ(f32_to_small_float(NAN, f, Saturation::kTorch), 0x80u) << what;
    EXPECT_EQ(f32_to_small_float(-NAN, f, Saturation::kTorch), 0x80u) << what;
    // Half the smallest subnormal is a tie to even: +0; just above it rounds up to code 1.
    const float half = std::ldexp(1.0f, c.min_subnormal_exp - 1);
    EXPECT_EQ(f32_to_small_float(half, f, Saturation::kSatFinite), 0u) << what;
    EXPECT_EQ(f32_to_small_float(std::nextafter(half, 1.0f), f, Saturation::kSatFinite), 1u)
        << what;
    EXPECT_EQ(f32_to_small_float(-half, f, Saturation::kSatFinite), 0u) << what << " -0 is +0";
  }
}

TEST(Exhaustive, Bf16AllCodesRoundTrip) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const float x = bf16_to_f32(static_cast<std::uint16_t>(b));
    // bf16 -> float32 is a shift: the NaN sign and payload survive (fp8_spec.md 4).
    ASSERT_EQ(bits_of(x), b << 16) << "bf16 " << hex(b, 4);
    const std::uint32_t want = is_nan_bits(b << 16) ? kCanonicalNarrowNaN16 : b;
    ASSERT_EQ(hex(f32_to_bf16(x), 4), hex(want, 4)) << "bf16 " << hex(b, 4);
    ASSERT_EQ(bits_of(round_to(x, DType::kBF16)), is_nan_bits(b << 16) ? 0x7FFF0000u : b << 16);
  }
}

TEST(Exhaustive, F16AllCodesRoundTrip) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float x = f16_to_f32(static_cast<std::uint16_t>(h));
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    if (nan) {
      ASSERT_EQ(hex(bits_of(x), 8), hex(kCanonicalF32NaN, 8)) << "f16 " << hex(h, 4);
      ASSERT_EQ(hex(f32_to_f16(x), 4), hex(kCanonicalNarrowNaN16, 4)) << "f16 " << hex(h, 4);
      continue;
    }
#ifdef __FLT16_MAX__
    // An independent decoder: the compiler's own _Float16 (libgcc / hardware) widening.
    const _Float16 native = std::bit_cast<_Float16>(static_cast<std::uint16_t>(h));
    ASSERT_EQ(hex(bits_of(static_cast<float>(native)), 8), hex(bits_of(x), 8))
        << "f16 " << hex(h, 4);
#endif
    ASSERT_EQ(hex(f32_to_f16(x), 4), hex(h, 4)) << "f16 " << hex(h, 4);
  }
}

#ifdef __FLT16_MAX__
TEST(Exhaustive, F32ToF16SampledAgainstCompilerFloat16) {
  // The compiler's float -> _Float16 is an IEEE RNE narrowing too; it differs only in NaN payloads.
  constexpr std::uint64_t kStride = 257;
  std::uint64_t mismatches = 0;
  for (std::uint64_t i = 0; i < (std::uint64_t{1} << 32); i += kStride) {
    const auto u = static_cast<std::uint32_t>(i);
    if (is_nan_bits(u)) continue;
    const float x = float_of(u);
    const auto native = std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
    const std::uint16_t ours = f32_to_f16(x);
    if (ours != native && ++mismatches <= 5) {
      ADD_FAILURE() << "input " << hex(u, 8) << ": _Float16 " << hex(native, 4) << ", f32_to_f16 "
                    << hex(ours, 4);
    }
  }
  EXPECT_EQ(mismatches, 0u);
}
#endif

// ---------------------------------------------------------------------------------------------
// Properties.

constexpr std::array<DType, 4> kNarrow{DType::kFp8E4M3, DType::kFp8E5M2, DType::kBF16, DType::kF16};
constexpr std::array<Saturation, 3> kSats{Saturation::kSatFinite, Saturation::kNoSat,
                                          Saturation::kTorch};

/// Uniform 32-bit patterns regardless of rapidcheck's size (which would favour tiny integers).
rc::Gen<std::uint32_t> gen_bits() {
  return rc::gen::resize(rc::kNominalSize, rc::gen::arbitrary<std::uint32_t>());
}

/// Float32 values concentrated where the narrow formats round: random sign and mantissa with an
/// exponent between 2^-27 and 2^18, half of them with few mantissa bits set (ties and near ties).
rc::Gen<float> gen_interesting_float() {
  return rc::gen::map(
      rc::gen::tuple(gen_bits(), rc::gen::inRange(100, 145), rc::gen::element(0, 1)),
      [](const std::tuple<std::uint32_t, int, int>& t) {
        auto [r, e, sparse] = t;
        std::uint32_t m = r & 0x7FFFFFu;
        if (sparse) m &= 0x7F0001u;  // ties at every narrow precision, +1 ulp
        return float_of((r & 0x80000000u) | (static_cast<std::uint32_t>(e) << 23) | m);
      });
}

rc::Gen<float> gen_finite_float() {
  return rc::gen::oneOf(rc::gen::map(rc::gen::suchThat(gen_bits(),
                                                       [](std::uint32_t u) {
                                                         return (u & 0x7F800000u) != 0x7F800000u;
                                                       }),
                                     float_of),
                        gen_interesting_float());
}

rc::Gen<float> gen_any_float() {
  return rc::gen::oneOf(rc::gen::map(gen_bits(), float_of), gen_interesting_float());
}

/// A positive finite scale: uniform positive finite patterns or values around 1.
rc::Gen<float> gen_scale() {
  return rc::gen::oneOf(
      rc::gen::map(rc::gen::suchThat(gen_bits(),
                                     [](std::uint32_t u) {
                                       const std::uint32_t a = u & 0x7FFFFFFFu;
                                       return a != 0 && a < 0x7F800000u;
                                     }),
                   [](std::uint32_t u) { return float_of(u & 0x7FFFFFFFu); }),
      rc::gen::map(gen_interesting_float(), [](float x) { return std::fabs(x); }));
}

RC_GTEST_PROP(Properties, EncodeIsMonotoneUnderSatfinite, ()) {
  const float a = *gen_finite_float();
  // The second value is either unrelated or a few ulps away (where rounding decisions flip).
  const float b =
      *rc::gen::oneOf(gen_finite_float(), rc::gen::map(rc::gen::inRange(-64, 65), [a](int d) {
                        const float y = float_of(bits_of(a) + static_cast<std::uint32_t>(d));
                        return std::isfinite(y) ? y : a;
                      }));
  const float lo = a < b ? a : b;
  const float hi = a < b ? b : a;
  for (const DType t : kNarrow) {
    const float qlo = decode(encode(lo, t, Saturation::kSatFinite), t);
    const float qhi = decode(encode(hi, t, Saturation::kSatFinite), t);
    RC_ASSERT(qlo <= qhi);
  }
}

RC_GTEST_PROP(Properties, SaturationModesAgreeWithoutOverflow, ()) {
  const float x = *gen_finite_float();
  const std::uint32_t a = bits_of(x) & 0x7FFFFFFFu;
  // Thresholds of fp8_spec.md section 1: e4m3 overflows iff |x| > 464, e5m2 iff |x| >= 61440.
  const std::uint32_t sign = (bits_of(x) >> 24) & 0x80u;
  for (const DType t : {DType::kFp8E4M3, DType::kFp8E5M2}) {
    const bool overflow = t == DType::kFp8E4M3 ? a > 0x43E80000u : a >= 0x47700000u;
    const std::uint32_t sat = encode(x, t, Saturation::kSatFinite);
    const std::uint32_t nosat = encode(x, t, Saturation::kNoSat);
    const std::uint32_t torch = encode(x, t, Saturation::kTorch);
    if (!overflow) {
      RC_ASSERT(sat == nosat);
      RC_ASSERT(sat == torch);
    } else {
      RC_ASSERT(sat == (sign | (t == DType::kFp8E4M3 ? 0x7Eu : 0x7Bu)));
      RC_ASSERT(nosat == (sign | (t == DType::kFp8E4M3 ? 0x7Fu : 0x7Cu)));
      RC_ASSERT(torch == nosat);
    }
  }
}

RC_GTEST_PROP(Properties, ScaleModesAreTheirFormulas, ()) {
  const float x = *gen_any_float();
  const float s = *gen_scale();
  RC_ASSERT(bits_of(apply_scale(x, s, ScaleMode::kNone)) == bits_of(x));
  const float quotient = x / s;
  RC_ASSERT(bits_of(apply_scale(x, s, ScaleMode::kDivide)) == bits_of(quotient));
  const float recip = 1.0f / s;
  const float product = x * recip;
  RC_ASSERT(bits_of(apply_scale(x, s, ScaleMode::kMulRecip)) == bits_of(product));
}

RC_GTEST_PROP(Properties, PowerOfTwoScaleDivideEqualsMulRecip, ()) {
  const float x = *gen_any_float();
  // 2^k with 1/2^k representable exactly (normal or subnormal): k in [-126, 127].
  const float s = std::ldexp(1.0f, *rc::gen::inRange(-126, 128));
  for (const DType t : kNarrow) {
    for (const Saturation sat : kSats) {
      const KvQuant divide{t, sat, ScaleMode::kDivide, false, false};
      const KvQuant mul_recip{t, sat, ScaleMode::kMulRecip, false, false};
      RC_ASSERT(quantize_kv(x, s, divide, DType::kF32) ==
                quantize_kv(x, s, mul_recip, DType::kF32));
    }
  }
}

/// Narrowing to the activation type and back, spelled with the dedicated functions.
float through_act(float v, DType act) {
  switch (act) {
    case DType::kBF16:
      return bf16_to_f32(f32_to_bf16(v));
    case DType::kF16:
      return f16_to_f32(f32_to_f16(v));
    default:
      return v;
  }
}

RC_GTEST_PROP(Properties, ViaModelDtypeRoundsTheScaledValueFirst, ()) {
  const float x = *gen_any_float();
  const float s = *gen_scale();
  const auto mode = *rc::gen::element(ScaleMode::kDivide, ScaleMode::kMulRecip, ScaleMode::kNone);
  const auto act = *rc::gen::element(DType::kF32, DType::kBF16, DType::kF16);
  const float scaled = mode == ScaleMode::kDivide     ? x / s
                       : mode == ScaleMode::kMulRecip ? x * (1.0f / s)
                                                      : x;
  RC_ASSERT(bits_of(round_to(scaled, act)) == bits_of(through_act(scaled, act)));
  for (const DType t : kNarrow) {
    for (const Saturation sat : kSats) {
      const KvQuant direct{t, sat, mode, false, false};
      const KvQuant via{t, sat, mode, false, true};
      RC_ASSERT(quantize_kv(x, s, direct, act) == encode(scaled, t, sat));
      RC_ASSERT(quantize_kv(x, s, via, act) == encode(through_act(scaled, act), t, sat));
    }
  }
}

struct TrapVector {
  std::uint32_t input;
  DType act;
  DType cache;
  std::uint8_t direct;
  std::uint8_t via;
};

TEST(ViaModelDtype, DoubleRoundingTrapsOfSection23) {
  const TrapVector traps[] = {
      {0x3F880008, DType::kF16, DType::kFp8E4M3, 0x39, 0x38},
      {0x3CB78680, DType::kBF16, DType::kFp8E4M3, 0x0B, 0x0C},
      {0x38AFF8E0, DType::kF16, DType::kFp8E5M2, 0x05, 0x06},
  };
  for (const TrapVector& t : traps) {
    const std::string what = hex(t.input, 8) + " via " + std::string(spec::name_of(t.act)) +
                             " to " + std::string(spec::name_of(t.cache));
    for (const Saturation sat : kSats) {
      const float x = float_of(t.input);
      const KvQuant direct{t.cache, sat, ScaleMode::kNone, false, false};
      const KvQuant via{t.cache, sat, ScaleMode::kNone, false, true};
      EXPECT_EQ(hex(quantize_kv(x, 1.0f, direct, t.act), 2), hex(t.direct, 2)) << what;
      EXPECT_EQ(hex(quantize_kv(x, 1.0f, via, t.act), 2), hex(t.via, 2)) << what;
      // The same trap behind an exact scale: x * 2 / 2 lands on the same value.
      const KvQuant via_divide{t.cache, sat, ScaleMode::kDivide, false, true};
      EXPECT_EQ(hex(quantize_kv(x * 2.0f, 2.0f, via_divide, t.act), 2), hex(t.via, 2)) << what;
      // An f32 activation has nothing to round: via_model_dtype changes nothing.
      EXPECT_EQ(hex(quantize_kv(x, 1.0f, via, DType::kF32), 2), hex(t.direct, 2)) << what;
    }
  }
}

TEST(ScaleModes, DivideAndMulRecipDifferForTheSection65Example) {
  // x = 0x3E9C8B04, s = 0x3D6E8AB0: x/s = 0x40A80001 -> 0x4B; x*(1/s) = 0x40A80000 -> 0x4A (tie).
  const float x = float_of(0x3E9C8B04u);
  const float s = float_of(0x3D6E8AB0u);
  EXPECT_EQ(hex(bits_of(apply_scale(x, s, ScaleMode::kDivide)), 8), "0x40A80001");
  EXPECT_EQ(hex(bits_of(apply_scale(x, s, ScaleMode::kMulRecip)), 8), "0x40A80000");
  const KvQuant divide{DType::kFp8E4M3, Saturation::kSatFinite, ScaleMode::kDivide, false, false};
  const KvQuant mul_recip{DType::kFp8E4M3, Saturation::kSatFinite, ScaleMode::kMulRecip, false,
                          false};
  EXPECT_EQ(hex(quantize_kv(x, s, divide, DType::kF32), 2), "0x4B");
  EXPECT_EQ(hex(quantize_kv(x, s, mul_recip, DType::kF32), 2), "0x4A");
}

RC_GTEST_PROP(Properties, DequantizeIsOneRoundedProduct, ()) {
  const auto format =
      *rc::gen::element(DType::kFp8E4M3, DType::kFp8E5M2, DType::kBF16, DType::kF16);
  const std::uint32_t code =
      *gen_bits() & (format == DType::kBF16 || format == DType::kF16 ? 0xFFFFu : 0xFFu);
  const float s = *gen_scale();
  const float product = decode(code, format) * s;
  RC_ASSERT(bits_of(dequantize(code, format, s)) == bits_of(product));
}

TEST(StoreLoad, LittleEndianCodes) {
  std::uint8_t buf[4] = {0xEE, 0xEE, 0xEE, 0xEE};
  store_code(0x3F80, DType::kBF16, buf);
  EXPECT_EQ(buf[0], 0x80);
  EXPECT_EQ(buf[1], 0x3F);
  EXPECT_EQ(buf[2], 0xEE) << "a 2-byte code wrote past its element";
  EXPECT_EQ(load_code(buf, DType::kBF16), 0x3F80u);
  store_code(0x7E, DType::kFp8E4M3, buf);
  EXPECT_EQ(buf[0], 0x7E);
  EXPECT_EQ(buf[1], 0x3F) << "a 1-byte code wrote past its element";
  store_code(0x3F880008u, DType::kF32, buf);
  EXPECT_EQ(buf[0], 0x08);
  EXPECT_EQ(buf[3], 0x3F);
  EXPECT_EQ(load_code(buf, DType::kF32), 0x3F880008u);
}

// ---------------------------------------------------------------------------------------------
// The real-kernel modes of SPEC 2 (issue 11), hand-checked.

KvQuant e4m3_quant(ScaleMode mode, Saturation sat = Saturation::kSatFinite) {
  KvQuant q;
  q.cache_dtype = DType::kFp8E4M3;
  q.saturation = sat;
  q.scale_mode = mode;
  return q;
}

TEST(NanThroughArithmetic, ScaledNanIsTheCanonicalNanWhateverItsSign) {
  // CUDA's fp32 arithmetic returns 0x7FFFFFFF for any NaN operand; the sign survives only a plain
  // cast, where the torch saturation mode shows it (0xFF).
  const float minus_nan = float_of(0xFFC00001u);
  for (const ScaleMode mode : {ScaleMode::kDivide, ScaleMode::kMulRecip, ScaleMode::kDivApprox}) {
    SCOPED_TRACE(std::string(spec::name_of(mode)));
    EXPECT_EQ(hex(bits_of(apply_scale(minus_nan, 0.37f, mode)), 8), "0x7FFFFFFF");
    EXPECT_EQ(
        hex(quantize_kv(minus_nan, 0.37f, e4m3_quant(mode, Saturation::kTorch), DType::kF32), 2),
        "0x7F");
  }
  EXPECT_EQ(hex(bits_of(apply_scale(minus_nan, 0.37f, ScaleMode::kNone)), 8), "0xFFC00001");
  EXPECT_EQ(hex(quantize_kv(minus_nan, 0.37f, e4m3_quant(ScaleMode::kNone, Saturation::kTorch),
                            DType::kF32),
                2),
            "0xFF");
  // Blockscale: x / s of a -NaN is canonical too, 0x7F under satfinite.
  std::vector<float> x(128, 0.5f);
  x[3] = minus_nan;
  std::vector<std::uint8_t> q(128);
  spec::IndexQuant bs;
  bs.layout = spec::IndexLayout::kBlockScale;
  quantize_group_blockscale(x, bs, q);
  EXPECT_EQ(hex(q[3], 2), "0x7F");
}

TEST(ScaleInModelDtype, TheScaleIsRoundedToTheActivationDtypeFirst) {
  // 0.37 = 0x3EBD70A4; bf16 0x3EBD0000 (0.369140625), fp16 0x3EBD8000 (0.3701171875).
  KvQuant q = e4m3_quant(ScaleMode::kDivide);
  q.scale_in_model_dtype = true;
  EXPECT_EQ(hex(bits_of(effective_scale(0.37f, q, DType::kBF16)), 8), "0x3EBD0000");
  EXPECT_EQ(hex(bits_of(effective_scale(0.37f, q, DType::kF16)), 8), "0x3EBD8000");
  EXPECT_EQ(hex(bits_of(effective_scale(0.37f, q, DType::kF32)), 8), "0x3EBD70A4");
  // The bf16 scale moves a quotient across the e4m3 midpoint 2.875 (between 0x43 and 0x44).
  const float x = 1.0625f;  // / 0.37 = 2.87162 (below 2.875: 0x43); / 0.36914 = 2.87831 (0x44)
  KvQuant plain = e4m3_quant(ScaleMode::kDivide);
  EXPECT_EQ(hex(quantize_kv(x, 0.37f, plain, DType::kBF16), 2), "0x43");
  EXPECT_EQ(hex(quantize_kv(x, 0.37f, q, DType::kBF16), 2), "0x44");
}

TEST(BlockScaleFormula, MulRecipDiffersFromDivideByOneUlpWhereItShould) {
  // amax 0x3F800004: amax / 448 = 0x3B124929, amax * fl(1/448) = 0x3B12492A.
  std::vector<float> x(128, 0.0f);
  x[0] = float_of(0x3F800004u);
  std::vector<std::uint8_t> q(128);
  spec::IndexQuant bs;
  bs.layout = spec::IndexLayout::kBlockScale;
  EXPECT_EQ(hex(bits_of(quantize_group_blockscale(x, bs, q)), 8), "0x3B124929");
  bs.blockscale_scale = spec::BlockScaleFormula::kMulRecip;
  EXPECT_EQ(hex(bits_of(quantize_group_blockscale(x, bs, q)), 8), "0x3B12492A");
}

TEST(DivApprox, AdmissibleCodesAreTheCastsOfTheTwoUlpWindow) {
  const KvQuant q = e4m3_quant(ScaleMode::kDivApprox);
  // 0x3F8828F5 / 0.37 = 0x4037FFFF (2.8749998), 1 ulp below the e4m3 midpoint 2.875 between 0x43
  // (2.75) and 0x44 (3.0): the correctly rounded quotient gives 0x43, 1 ulp up is the midpoint
  // (ties to the even 0x44): both admissible; the reference picks 0x43.
  const float x = float_of(0x3F8828F5u);
  EXPECT_EQ(hex(quantize_kv(x, 0.37f, q, DType::kF32), 2), "0x43");
  const std::vector<std::uint32_t> codes = admissible_kv_codes(x, 0.37f, q, DType::kF32);
  ASSERT_EQ(codes.size(), 2u);
  EXPECT_EQ(hex(codes[0], 2), "0x43");
  EXPECT_EQ(hex(codes[1], 2), "0x44");
  // Far from a midpoint: one code. A zero quotient admits only its own sign's neighbours (all
  // code 0x00 or 0x80 in e4m3); a NaN stays NaN.
  EXPECT_EQ(admissible_kv_codes(1.0f, 0.37f, q, DType::kF32).size(), 1u);
  EXPECT_EQ(admissible_kv_codes(0.0f, 0.37f, q, DType::kF32), std::vector<std::uint32_t>{0x00});
  EXPECT_EQ(admissible_kv_codes(-0.0f, 0.37f, q, DType::kF32), std::vector<std::uint32_t>{0x80});
  EXPECT_EQ(admissible_kv_codes(float_of(0xFFC00000u), 0.37f, q, DType::kF32),
            std::vector<std::uint32_t>{0x7F});
  // In an f32 cache the window is visible bit for bit: div.full.f32 on the H200 gives 0x00000001
  // for 0x000000E0 / 448 (correctly rounded: +0) and 0x7F7FFFFF for 0x7436893F / 1.7e-7 (+inf).
  KvQuant f32 = e4m3_quant(ScaleMode::kDivApprox);
  f32.cache_dtype = DType::kF32;
  const auto from_zero = admissible_kv_codes(float_of(0x000000E0u), 448.0f, f32, DType::kF32);
  EXPECT_EQ(from_zero, (std::vector<std::uint32_t>{0x00000000u, 0x00000001u, 0x00000002u}));
  const auto from_inf = admissible_kv_codes(float_of(0x7436893Fu), 1.7e-7f, f32, DType::kF32);
  EXPECT_EQ(from_inf, (std::vector<std::uint32_t>{0x7F7FFFFEu, 0x7F7FFFFFu, 0x7F800000u}));
  // Exact division admits nothing else.
  EXPECT_EQ(admissible_kv_codes(x, 0.37f, e4m3_quant(ScaleMode::kDivide), DType::kF32).size(), 1u);
}

// Property: every admissible code of div_approx is the cast of a quotient within 2 ulp, and the
// reference's own code is always in the set.
TEST(DivApprox, SetHoldsThePickAndOnlyNearbyCodes) {
  std::uint64_t z = 0xD1FA;
  const KvQuant q = e4m3_quant(ScaleMode::kDivApprox);
  for (int i = 0; i < 200000; ++i) {
    z += 0x9E3779B97F4A7C15ull;
    const std::uint64_t h = (z ^ (z >> 29)) * 0xBF58476D1CE4E5B9ull;
    const float x = float_of(static_cast<std::uint32_t>(h) & 0xBFFFFFFFu);  // |x| < 2
    const float s = 0.05f + static_cast<float>((h >> 40) & 0xFFFF) / 4096.0f;
    const auto codes = admissible_kv_codes(x, s, q, DType::kF32);
    const std::uint32_t pick = quantize_kv(x, s, q, DType::kF32);
    ASSERT_TRUE(std::find(codes.begin(), codes.end(), pick) != codes.end())
        << "x " << hex(bits_of(x), 8) << " s " << hex(bits_of(s), 8);
    ASSERT_LE(codes.size(), 2u) << "x " << hex(bits_of(x), 8) << " s " << hex(bits_of(s), 8);
  }
}

}  // namespace
}  // namespace kvo::reference
