#pragma once
/// \file number_formats.cuh
/// What the kernels take from spec::kNumberFormats: element bytes, sign bit, largest finite code
/// and mantissa width of a format, and the one mapping from a format row to CUDA's hardware fp8
/// conversion (cuda_fp8.h knows OCP e4m3fn and e5m2). A format the hardware cannot convert
/// (a future fnuz or e2m1 row) stops the build where a kernel asks for its conversion, instead
/// of being converted as another format.

#include <cuda_fp8.h>

#include <cstdint>

#include <string>

#include "kvo/spec/outcome.hpp"
#include "kvo/spec/types.hpp"

namespace kvo::gpu::detail {

/// Bytes of one element of dtype D.
template <spec::DType D>
inline constexpr std::int64_t kBytes = static_cast<std::int64_t>(spec::dtype_bytes(D));
/// The sign bit of a code of D.
template <spec::DType D>
inline constexpr std::uint32_t kSignBit = spec::sign_bit(D);
/// The magnitude code of D's largest finite value (satfinite's clamp).
template <spec::DType D>
inline constexpr std::uint32_t kMaxFiniteMagnitude = spec::format_of(D).max_finite_code;
/// Mantissa bits of D (a subnormal code's exponent field is 0).
template <spec::DType D>
inline constexpr int kMantissaBits = spec::format_of(D).mantissa_bits;

/// Whether CUDA's fp8 conversions implement the row of `t` exactly: OCP e4m3fn (4 exponent, 3
/// mantissa bits, bias 7, NaN S.1111.111) or OCP e5m2 (5, 2, bias 15, IEEE NaN and infinity).
constexpr bool has_cuda_fp8(spec::DType t) {
  const spec::NumberFormat& f = spec::format_of(t);
  const bool e4m3fn = f.exponent_bits == 4 && f.mantissa_bits == 3 && f.bias == 7 &&
                      f.nan == spec::NanEncoding::kAllOnes && f.has_negative_zero;
  const bool e5m2 = f.exponent_bits == 5 && f.mantissa_bits == 2 && f.bias == 15 &&
                    f.nan == spec::NanEncoding::kIeee && f.has_negative_zero;
  return f.bits == 8 && (e4m3fn || e5m2);
}
/// CUDA's interpretation of an fp8 row, told apart by its exponent width once has_cuda_fp8 holds.
template <spec::DType C>
constexpr __nv_fp8_interpretation_t cuda_fp8_kind() {
  static_assert(has_cuda_fp8(C), "CUDA has no fp8 conversion for this format's row");
  return spec::format_of(C).exponent_bits == 5 ? __NV_E5M2 : __NV_E4M3;
}
template <spec::DType C>
inline constexpr __nv_fp8_interpretation_t kFp8Kind = cuda_fp8_kind<C>();

/// Calls launch.template operator()<C>() with the cache format C that `t` is: the one list of the
/// formats the write kernels are instantiated for. A row the kernels are not built for (a new
/// format) is spec::Unsupported, so that a CUDA subject declines its cases instead of failing to
/// compile or writing another format's codes.
template <class Launch>
void with_cache_format(spec::DType t, Launch&& launch) {
  using spec::DType;
  switch (t) {
    case DType::kF32:
      return launch.template operator()<DType::kF32>();
    case DType::kBF16:
      return launch.template operator()<DType::kBF16>();
    case DType::kF16:
      return launch.template operator()<DType::kF16>();
    case DType::kFp8E4M3:
      return launch.template operator()<DType::kFp8E4M3>();
    case DType::kFp8E5M2:
      return launch.template operator()<DType::kFp8E5M2>();
    default:
      throw spec::Unsupported("the CUDA writers are not built for the cache format " +
                              std::string(spec::name_of(t)));
  }
}

}  // namespace kvo::gpu::detail
