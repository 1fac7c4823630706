// kvoracle's conversions (kvo/reference/numbers.hpp) against CUDA's own HOST conversion functions
// (cuda_fp8.h, cuda_bf16.h, cuda_fp16.h compile as plain C++: no GPU and no nvcc needed). The
// CUDA host path equals the sm_90 hardware for every input (research/fp8_spec.md section 0), so
// zero mismatches here means kvoracle writes the bytes a CUDA kernel writes.
//
// Domains: every float32 input for the six float32 conversions (fp8 e4m3/e5m2 x satfinite/nosat,
// bf16, fp16); every bf16 and fp16 code to fp8 (both formats, both modes) and to float32; every fp8
// code to float32 (and to fp16).
//
// Two forms of the same binary:
//   * sampled (default): the 2^32 float32 sweeps visit every 97th input plus every input whose
//     low 12 bits are 0x000, 0x001, 0x7FF, 0x800, 0x801 or 0xFFF (all rounding ties of every
//     target and their neighbours one ulp away, which a plain stride almost never hits); about a
//     second. The 16- and 8-bit domains are always complete. ctest label `cpu`.
//   * full sweep: set KVO_NUMBERS_FULL_SWEEP=1 and every float32 input is checked. ctest registers
//     it as the same tests with the suffix `.full`, labels `exhaustive` and `cpu` (measured on 2
//     cores: 56 s wall, 111 s CPU for 2^32 inputs x 6 conversions). Run it alone with
//       ctest --test-dir <build> -L exhaustive --output-on-failure
//     or directly
//       KVO_NUMBERS_FULL_SWEEP=1 <build>/tests/numbers/test_numbers_exhaustive
// Work is split over std::thread::hardware_concurrency() threads.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kvo/reference/numbers.hpp"
#include "kvo/spec/types.hpp"

namespace kvo::reference {
namespace {

using spec::DType;
using spec::Saturation;

constexpr std::uint64_t kSampleStride = 97;  // prime, so every exponent and mantissa pattern moves
constexpr std::size_t kReportFirst = 8;

bool full_sweep() {
  const char* v = std::getenv("KVO_NUMBERS_FULL_SWEEP");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

/// Expected (CUDA) and actual (kvoracle) codes of one input.
struct Pair {
  std::uint32_t expected;
  std::uint32_t actual;
};

/// One conversion: its input domain (2^bits inputs) and the function giving both results.
struct Conversion {
  const char* name;
  int input_bits;  ///< 32, 16 or 8
  int input_digits;
  int output_digits;
  Pair (*run)(std::uint32_t input);
};

// ---- float32 inputs ----------------------------------------------------------------------------

template <__nv_fp8_interpretation_t kCudaFormat, __nv_saturation_t kCudaSat, DType kFormat,
          Saturation kSat>
Pair f32_to_fp8_pair(std::uint32_t u) {
  const float x = float_of(u);
  return {__nv_cvt_float_to_fp8(x, kCudaSat, kCudaFormat), f32_to_fp8(x, kFormat, kSat)};
}

Pair f32_to_bf16_pair(std::uint32_t u) {
  const float x = float_of(u);
  const __nv_bfloat16_raw raw = __float2bfloat16(x);
  return {raw.x, f32_to_bf16(x)};
}

Pair f32_to_f16_pair(std::uint32_t u) {
  const float x = float_of(u);
  const __half_raw raw = __float2half(x);
  return {raw.x, f32_to_f16(x)};
}

// ---- bf16 / fp16 inputs ------------------------------------------------------------------------

template <__nv_fp8_interpretation_t kCudaFormat, __nv_saturation_t kCudaSat, DType kFormat,
          Saturation kSat>
Pair bf16_to_fp8_pair(std::uint32_t u) {
  __nv_bfloat16_raw raw;
  raw.x = static_cast<unsigned short>(u);
  return {__nv_cvt_bfloat16raw_to_fp8(raw, kCudaSat, kCudaFormat),
          f32_to_fp8(bf16_to_f32(static_cast<std::uint16_t>(u)), kFormat, kSat)};
}

template <__nv_fp8_interpretation_t kCudaFormat, __nv_saturation_t kCudaSat, DType kFormat,
          Saturation kSat>
Pair f16_to_fp8_pair(std::uint32_t u) {
  __half_raw raw;
  raw.x = static_cast<unsigned short>(u);
  return {__nv_cvt_halfraw_to_fp8(raw, kCudaSat, kCudaFormat),
          f32_to_fp8(f16_to_f32(static_cast<std::uint16_t>(u)), kFormat, kSat)};
}

Pair bf16_to_f32_pair(std::uint32_t u) {
  __nv_bfloat16_raw raw;
  raw.x = static_cast<unsigned short>(u);
  return {bits_of(__bfloat162float(__nv_bfloat16(raw))),
          bits_of(bf16_to_f32(static_cast<std::uint16_t>(u)))};
}

Pair f16_to_f32_pair(std::uint32_t u) {
  __half_raw raw;
  raw.x = static_cast<unsigned short>(u);
  return {bits_of(__half2float(__half(raw))), bits_of(f16_to_f32(static_cast<std::uint16_t>(u)))};
}

// ---- fp8 inputs --------------------------------------------------------------------------------

template <__nv_fp8_interpretation_t kCudaFormat, DType kFormat>
Pair fp8_to_f32_pair(std::uint32_t u) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(u), kCudaFormat);
  return {bits_of(__half2float(__half(h))),
          bits_of(fp8_to_f32(static_cast<std::uint8_t>(u), kFormat))};
}

/// fp8 -> fp16 is exact in CUDA; kvoracle spells it as fp8 -> float32 -> fp16.
template <__nv_fp8_interpretation_t kCudaFormat, DType kFormat>
Pair fp8_to_f16_pair(std::uint32_t u) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(u), kCudaFormat);
  return {h.x, f32_to_f16(fp8_to_f32(static_cast<std::uint8_t>(u), kFormat))};
}

constexpr DType kE4 = DType::kFp8E4M3;
constexpr DType kE5 = DType::kFp8E5M2;
constexpr Saturation kSatF = Saturation::kSatFinite;
constexpr Saturation kNoSat = Saturation::kNoSat;

const Conversion kConversions[] = {
    {"f32_to_e4m3_satfinite", 32, 8, 2, f32_to_fp8_pair<__NV_E4M3, __NV_SATFINITE, kE4, kSatF>},
    {"f32_to_e4m3_nosat", 32, 8, 2, f32_to_fp8_pair<__NV_E4M3, __NV_NOSAT, kE4, kNoSat>},
    {"f32_to_e5m2_satfinite", 32, 8, 2, f32_to_fp8_pair<__NV_E5M2, __NV_SATFINITE, kE5, kSatF>},
    {"f32_to_e5m2_nosat", 32, 8, 2, f32_to_fp8_pair<__NV_E5M2, __NV_NOSAT, kE5, kNoSat>},
    {"f32_to_bf16", 32, 8, 4, f32_to_bf16_pair},
    {"f32_to_f16", 32, 8, 4, f32_to_f16_pair},
    {"bf16_to_e4m3_satfinite", 16, 4, 2, bf16_to_fp8_pair<__NV_E4M3, __NV_SATFINITE, kE4, kSatF>},
    {"bf16_to_e4m3_nosat", 16, 4, 2, bf16_to_fp8_pair<__NV_E4M3, __NV_NOSAT, kE4, kNoSat>},
    {"bf16_to_e5m2_satfinite", 16, 4, 2, bf16_to_fp8_pair<__NV_E5M2, __NV_SATFINITE, kE5, kSatF>},
    {"bf16_to_e5m2_nosat", 16, 4, 2, bf16_to_fp8_pair<__NV_E5M2, __NV_NOSAT, kE5, kNoSat>},
    {"f16_to_e4m3_satfinite", 16, 4, 2, f16_to_fp8_pair<__NV_E4M3, __NV_SATFINITE, kE4, kSatF>},
    {"f16_to_e4m3_nosat", 16, 4, 2, f16_to_fp8_pair<__NV_E4M3, __NV_NOSAT, kE4, kNoSat>},
    {"f16_to_e5m2_satfinite", 16, 4, 2, f16_to_fp8_pair<__NV_E5M2, __NV_SATFINITE, kE5, kSatF>},
    {"f16_to_e5m2_nosat", 16, 4, 2, f16_to_fp8_pair<__NV_E5M2, __NV_NOSAT, kE5, kNoSat>},
    {"bf16_to_f32", 16, 4, 8, bf16_to_f32_pair},
    {"f16_to_f32", 16, 4, 8, f16_to_f32_pair},
    {"e4m3_to_f32", 8, 2, 8, fp8_to_f32_pair<__NV_E4M3, kE4>},
    {"e5m2_to_f32", 8, 2, 8, fp8_to_f32_pair<__NV_E5M2, kE5>},
    {"e4m3_to_f16", 8, 2, 4, fp8_to_f16_pair<__NV_E4M3, kE4>},
    {"e5m2_to_f16", 8, 2, 4, fp8_to_f16_pair<__NV_E5M2, kE5>},
};

struct Mismatch {
  std::uint32_t input;
  Pair pair;
};

struct SweepResult {
  std::uint64_t checked = 0;
  std::uint64_t mismatches = 0;
  std::vector<Mismatch> first;  ///< the lowest inputs that differ, ascending
};

/// A set of inputs: input(k) for k < count.
struct Plan {
  const char* what;
  std::uint64_t count;
  std::uint32_t (*input)(std::uint64_t k);
};

constexpr std::uint64_t kFloat32Domain = std::uint64_t{1} << 32;
// Ties of every narrowing have their low 12 bits zero (fp16 normal: 13 bits cut; bf16: 16; fp8 and
// every subnormal target: more), so these patterns cover every tie and its 1-ulp neighbours.
constexpr std::uint32_t kTieLowBits[] = {0x000, 0x001, 0x7FF, 0x800, 0x801, 0xFFF};
constexpr std::uint64_t kTiePatterns = std::size(kTieLowBits);

const Plan kAll{"all", 0, [](std::uint64_t k) { return static_cast<std::uint32_t>(k); }};
const Plan kStrided{"every 97th", (kFloat32Domain + kSampleStride - 1) / kSampleStride,
                    [](std::uint64_t k) { return static_cast<std::uint32_t>(k * kSampleStride); }};
const Plan kTies{
    "ties", (kFloat32Domain >> 12) * kTiePatterns, [](std::uint64_t k) {
      return static_cast<std::uint32_t>(((k / kTiePatterns) << 12) | kTieLowBits[k % kTiePatterns]);
    }};

/// Visits plan.input(k) for every k, split into one contiguous range of k per thread; ranges are
/// merged in order, so `first` holds the earliest mismatches of the plan.
SweepResult sweep(const Conversion& conv, const Plan& plan) {
  const std::uint64_t count = plan.count != 0 ? plan.count : std::uint64_t{1} << conv.input_bits;
  const unsigned threads = count < 4096 ? 1u : std::max(1u, std::thread::hardware_concurrency());
  std::vector<SweepResult> parts(threads);
  auto work = [&](unsigned t) {
    SweepResult& r = parts[t];
    const std::uint64_t begin = count * t / threads;
    const std::uint64_t end = count * (t + 1) / threads;
    for (std::uint64_t k = begin; k < end; ++k) {
      const std::uint32_t input = plan.input(k);
      const Pair p = conv.run(input);
      if (p.expected != p.actual) {
        ++r.mismatches;
        if (r.first.size() < kReportFirst) r.first.push_back({input, p});
      }
    }
    r.checked = end - begin;
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& th : pool) th.join();
  SweepResult total;
  for (const SweepResult& r : parts) {
    total.checked += r.checked;
    total.mismatches += r.mismatches;
    for (const Mismatch& m : r.first) {
      if (total.first.size() < kReportFirst) total.first.push_back(m);
    }
  }
  return total;
}

std::string hex(std::uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*X", digits, v);
  return buf;
}

// gtest names the instances 0, 1, ...; ctest's discovery replaces the index with this printed
// value, so the ctest names read ".../Matches/f32_to_e4m3_satfinite".
void PrintTo(const Conversion& c, std::ostream* os) { *os << c.name; }

class CudaHost : public ::testing::TestWithParam<Conversion> {};

TEST_P(CudaHost, Matches) {
  const Conversion& conv = GetParam();
  // Only the 2^32 domains are sampled; 2^16 and 2^8 inputs are always all checked.
  std::vector<Plan> plans{kAll};
  if (conv.input_bits == 32 && !full_sweep()) plans = {kStrided, kTies};
  for (const Plan& plan : plans) {
    const auto start = std::chrono::steady_clock::now();
    const SweepResult r = sweep(conv, plan);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s [%s]: %llu inputs, %llu mismatches, %.2f s\n", conv.name, plan.what,
                static_cast<unsigned long long>(r.checked),
                static_cast<unsigned long long>(r.mismatches), seconds);
    RecordProperty(std::string("inputs_") + plan.what, std::to_string(r.checked));
    RecordProperty(std::string("mismatches_") + plan.what, std::to_string(r.mismatches));
    EXPECT_EQ(r.checked, plan.count != 0 ? plan.count : std::uint64_t{1} << conv.input_bits);
    std::string report;
    for (const Mismatch& m : r.first) {
      report += "  input " + hex(m.input, conv.input_digits) + ": CUDA " +
                hex(m.pair.expected, conv.output_digits) + ", kvoracle " +
                hex(m.pair.actual, conv.output_digits) + "\n";
    }
    EXPECT_EQ(r.mismatches, 0u) << conv.name << " [" << plan.what << "]: " << r.mismatches
                                << " mismatches; the first (input: expected, actual):\n"
                                << report;
  }
}

INSTANTIATE_TEST_SUITE_P(Numbers, CudaHost, ::testing::ValuesIn(kConversions));

}  // namespace
}  // namespace kvo::reference
