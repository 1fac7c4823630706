#pragma once
/// \file types.hpp
/// The enumerations of the contract (SPEC sections 2-4) and their one table of names each. The CLI,
/// the reference, the GPU launchers and the reports all spell an enumerator through these tables.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvo::spec {

/// Element types of activations and caches (SPEC 2). Activations are kF32, kBF16 or kF16.
enum class DType : std::uint8_t { kF32, kBF16, kF16, kFp8E4M3, kFp8E5M2 };

/// What a float32 -> fp8 conversion does with overflow and NaN (fp8_spec.md 4a). 16-bit targets
/// ignore it: they always round to nearest even with overflow to infinity, NaN -> 0x7FFF.
enum class Saturation : std::uint8_t { kSatFinite, kNoSat, kTorch };

/// How a KV scale s is applied before the cast (SPEC 2): x / s correctly rounded, x * fl(1/s), x,
/// or x / s by an approximate fp32 division within 2 ulp (Triton's `/`; judged by admissible sets).
enum class ScaleMode : std::uint8_t { kDivide, kMulRecip, kNone, kDivApprox };

/// How the index-K block scale is formed from the group's amax (SPEC 2): fl(amax / 448) (vLLM,
/// TensorRT-LLM) or fl(amax * fl(1 / 448)) (SGLang, DeepSeek's reference).
enum class BlockScaleFormula : std::uint8_t { kDivide, kMulRecip };

/// Main K/V cache layouts (SPEC 3). Element offsets: b block, o offset in block, h KV head, d dim.
enum class KvLayout : std::uint8_t {
  kNhd,        ///< K and V separate, each [nb, bs, nkv, hd]
  kHnd,        ///< K and V separate, each [nb, nkv, bs, hd]
  kPackedHnd,  ///< one tensor [nb, nkv, bs, 2*hd], K at d, V at hd + d (vLLM MiniMax-M3)
  kPackedNhd,  ///< one tensor [nb, bs, nkv, 2*hd]
  kSplitNhd,   ///< one tensor [nb, 2, bs, nkv, hd] (vLLM M3 sparse backend, TRT-LLM NHD)
  kSplitHnd,   ///< one tensor [nb, 2, nkv, bs, hd] (TRT-LLM HND pool)
};

/// Index-K cache layouts of sparse layers (SPEC 3).
enum class IndexLayout : std::uint8_t {
  kFlat,        ///< [nb, bs, index_dim] of bf16 or fp8 e4m3, no scale
  kBlockScale,  ///< per block: bs*index_dim fp8 bytes token-major, then bs*(index_dim/128) fp32
};

/// What a negative slot means (SPEC 3).
enum class SlotMode : std::uint8_t {
  kStrict,      ///< slot < 0 is padding and writes nothing
  kLegacyWrap,  ///< slot < 0 indexes from the end, as torch indexing does (vllm#43810)
};

/// Storage type of a slot mapping.
enum class SlotType : std::uint8_t { kI32, kI64 };

/// Layer kinds of a layer mix: dense layers write K and V; sparse (MSA) layers also index-K.
enum class LayerKind : std::uint8_t { kDense, kSparse };

/// The buffers of one layer's caches. kKv is the single tensor of the packed and split layouts.
enum class BufferKind : std::uint8_t { kK, kV, kKv, kIndexK };

/// One row of an enum's name table.
template <class E>
struct EnumName {
  E value;
  std::string_view name;
};

/// Name table and noun of each enum; specialised once per enum below.
template <class E>
struct EnumInfo;

template <>
struct EnumInfo<DType> {
  static constexpr std::string_view kNoun = "dtype";
  static constexpr std::array<EnumName<DType>, 5> kNames{{{DType::kF32, "f32"},
                                                          {DType::kBF16, "bf16"},
                                                          {DType::kF16, "fp16"},
                                                          {DType::kFp8E4M3, "fp8_e4m3"},
                                                          {DType::kFp8E5M2, "fp8_e5m2"}}};
};
template <>
struct EnumInfo<Saturation> {
  static constexpr std::string_view kNoun = "saturation";
  static constexpr std::array<EnumName<Saturation>, 3> kNames{
      {{Saturation::kSatFinite, "satfinite"},
       {Saturation::kNoSat, "nosat"},
       {Saturation::kTorch, "torch"}}};
};
template <>
struct EnumInfo<ScaleMode> {
  static constexpr std::string_view kNoun = "scale mode";
  static constexpr std::array<EnumName<ScaleMode>, 4> kNames{
      {{ScaleMode::kDivide, "divide"},
       {ScaleMode::kMulRecip, "mul_recip"},
       {ScaleMode::kNone, "none"},
       {ScaleMode::kDivApprox, "div_approx"}}};
};
template <>
struct EnumInfo<BlockScaleFormula> {
  static constexpr std::string_view kNoun = "blockscale scale";
  static constexpr std::array<EnumName<BlockScaleFormula>, 2> kNames{
      {{BlockScaleFormula::kDivide, "divide"}, {BlockScaleFormula::kMulRecip, "mul_recip"}}};
};
template <>
struct EnumInfo<KvLayout> {
  static constexpr std::string_view kNoun = "layout";
  static constexpr std::array<EnumName<KvLayout>, 6> kNames{{{KvLayout::kNhd, "nhd"},
                                                             {KvLayout::kHnd, "hnd"},
                                                             {KvLayout::kPackedHnd, "packed_hnd"},
                                                             {KvLayout::kPackedNhd, "packed_nhd"},
                                                             {KvLayout::kSplitNhd, "split_nhd"},
                                                             {KvLayout::kSplitHnd, "split_hnd"}}};
};
template <>
struct EnumInfo<IndexLayout> {
  static constexpr std::string_view kNoun = "index layout";
  static constexpr std::array<EnumName<IndexLayout>, 2> kNames{
      {{IndexLayout::kFlat, "flat"}, {IndexLayout::kBlockScale, "blockscale"}}};
};
template <>
struct EnumInfo<SlotMode> {
  static constexpr std::string_view kNoun = "slot mode";
  static constexpr std::array<EnumName<SlotMode>, 2> kNames{
      {{SlotMode::kStrict, "strict"}, {SlotMode::kLegacyWrap, "legacy_wrap"}}};
};
template <>
struct EnumInfo<SlotType> {
  static constexpr std::string_view kNoun = "slot type";
  static constexpr std::array<EnumName<SlotType>, 2> kNames{
      {{SlotType::kI32, "i32"}, {SlotType::kI64, "i64"}}};
};
template <>
struct EnumInfo<LayerKind> {
  static constexpr std::string_view kNoun = "layer kind";
  static constexpr std::array<EnumName<LayerKind>, 2> kNames{
      {{LayerKind::kDense, "dense"}, {LayerKind::kSparse, "sparse"}}};
};
template <>
struct EnumInfo<BufferKind> {
  static constexpr std::string_view kNoun = "buffer";
  static constexpr std::array<EnumName<BufferKind>, 4> kNames{{{BufferKind::kK, "k"},
                                                               {BufferKind::kV, "v"},
                                                               {BufferKind::kKv, "kv"},
                                                               {BufferKind::kIndexK, "index_k"}}};
};

/// The name of an enumerator, from its table.
template <class E>
constexpr std::string_view name_of(E value) {
  for (const auto& entry : EnumInfo<E>::kNames) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

/// The enumerator named `name`, or nothing.
template <class E>
constexpr std::optional<E> parse_enum(std::string_view name) {
  for (const auto& entry : EnumInfo<E>::kNames) {
    if (entry.name == name) return entry.value;
  }
  return std::nullopt;
}

/// All names of an enum joined by '|', for usage and error messages.
template <class E>
std::string enum_choices() {
  std::string out;
  for (const auto& entry : EnumInfo<E>::kNames) {
    if (!out.empty()) out += '|';
    out += entry.name;
  }
  return out;
}

/// How a format spells NaN (SPEC 2): kIeee the exponent field all ones with a non-zero mantissa
/// (f32, bf16, f16, e5m2); kAllOnes only S.1111.111 (OCP e4m3fn: no infinity); kNegativeZero the
/// code 0x80 alone (the fnuz formats: no -0, no infinity); kNone no NaN at all (e2m1).
enum class NanEncoding : std::uint8_t { kIeee, kAllOnes, kNegativeZero, kNone };

/// Which float32 -> code rounding routine a format uses: kF32 the bits themselves; kBf16 and kF16
/// their own (16-bit NaN rule 0x7FFF); kSmallFloat the generic narrow-float codec driven by the
/// row (every 8-bit format, and any narrower one).
enum class Codec : std::uint8_t { kF32, kBf16, kF16, kSmallFloat };

/// A number format: one row per DType of kNumberFormats, the only place its bits are described.
/// The reference's codecs, the CUDA conversions' constants, the diffs' code ordering, case files
/// and traces read their facts from it; a new format is a new row (and its DType enumerator).
struct NumberFormat {
  DType dtype;
  Codec codec;
  std::size_t bytes;  ///< storage per element
  int bits;           ///< code width: sign, exponent and mantissa
  int exponent_bits;
  int mantissa_bits;
  int bias;  ///< a normal code's value is (1.m) * 2^(field - bias); subnormals 2^(1 - bias)
  NanEncoding nan;
  bool has_infinity;
  bool has_negative_zero;
  std::uint32_t max_finite_code;  ///< magnitude code of the largest finite value
  std::uint32_t overflow_code;    ///< magnitude code of an overflow without saturation
  std::uint32_t nan_code;         ///< the NaN code written for a NaN input (positive)
  float max_finite;
  bool is_activation;                 ///< may be an input activation type
  std::string_view safetensors_name;  ///< its case-file and safetensors dtype ("F8_E4M3")
  /// The case generators draw it as a K/V cache dtype, uniformly among the rows that say so (in
  /// table order). A new row starts false, so that every recorded seed keeps its case; it is drawn
  /// through a stream of its own once it is (docs/extending.md).
  bool drawn_as_cache;
};
inline constexpr std::array<NumberFormat, 5> kNumberFormats{{
    {DType::kF32, Codec::kF32, 4, 32, 8, 23, 127, NanEncoding::kIeee, true, true, 0x7F7FFFFFu,
     0x7F800000u, 0x7FFFFFFFu, 3.40282347e38f, true, "F32", true},
    {DType::kBF16, Codec::kBf16, 2, 16, 8, 7, 127, NanEncoding::kIeee, true, true, 0x7F7Fu, 0x7F80u,
     0x7FFFu, 3.38953139e38f, true, "BF16", true},
    {DType::kF16, Codec::kF16, 2, 16, 5, 10, 15, NanEncoding::kIeee, true, true, 0x7BFFu, 0x7C00u,
     0x7FFFu, 65504.0f, true, "F16", true},
    {DType::kFp8E4M3, Codec::kSmallFloat, 1, 8, 4, 3, 7, NanEncoding::kAllOnes, false, true, 0x7Eu,
     0x7Fu, 0x7Fu, 448.0f, false, "F8_E4M3", true},
    {DType::kFp8E5M2, Codec::kSmallFloat, 1, 8, 5, 2, 15, NanEncoding::kIeee, true, true, 0x7Bu,
     0x7Cu, 0x7Fu, 57344.0f, false, "F8_E5M2", true},
}};

/// The row of `t`: rows are kept in enum order (checked below), so the lookup is an index.
constexpr const NumberFormat& format_of(DType t) {
  return kNumberFormats[static_cast<std::size_t>(t)];
}
static_assert([] {
  for (std::size_t i = 0; i < kNumberFormats.size(); ++i)
    if (static_cast<std::size_t>(kNumberFormats[i].dtype) != i) return false;
  return kNumberFormats.size() == EnumInfo<DType>::kNames.size();
}());
constexpr std::size_t dtype_bytes(DType t) { return format_of(t).bytes; }
constexpr bool is_fp8(DType t) { return format_of(t).bits == 8; }
/// The rows drawn as K/V cache dtypes, in table order.
inline std::vector<DType> drawn_cache_formats() {
  std::vector<DType> out;
  for (const NumberFormat& f : kNumberFormats)
    if (f.drawn_as_cache) out.push_back(f.dtype);
  return out;
}
/// The sign bit of a code of `t`.
constexpr std::uint32_t sign_bit(DType t) { return 1u << (format_of(t).bits - 1); }

/// Per-layout facts: whether K and V share one tensor, and the layout of the same buffer sizes with
/// the head and token axes exchanged (what a kernel that mixes up HND and NHD strides writes; the
/// planted stride-swap bugs use it). Offsets are each implementation's own code.
struct LayoutFacts {
  KvLayout layout;
  bool one_tensor;
  KvLayout stride_swapped;
};
inline constexpr std::array<LayoutFacts, 6> kLayoutFacts{
    {{KvLayout::kNhd, false, KvLayout::kHnd},
     {KvLayout::kHnd, false, KvLayout::kNhd},
     {KvLayout::kPackedHnd, true, KvLayout::kPackedNhd},
     {KvLayout::kPackedNhd, true, KvLayout::kPackedHnd},
     {KvLayout::kSplitNhd, true, KvLayout::kSplitHnd},
     {KvLayout::kSplitHnd, true, KvLayout::kSplitNhd}}};
constexpr bool kv_in_one_tensor(KvLayout l) {
  return kLayoutFacts[static_cast<std::size_t>(l)].one_tensor;
}
constexpr KvLayout stride_swapped(KvLayout l) {
  return kLayoutFacts[static_cast<std::size_t>(l)].stride_swapped;
}

/// The axes of a K/V cache tensor (SPEC 3): block, token (offset in the block), KV head, the K/V
/// part of the one-tensor layouts, and dim (innermost, contiguous).
enum class KvAxis : std::uint8_t { kBlock, kToken, kHead, kKv, kDim };
template <>
struct EnumInfo<KvAxis> {
  static constexpr std::string_view kNoun = "kv axis";
  static constexpr std::array<EnumName<KvAxis>, 5> kNames{{{KvAxis::kBlock, "block"},
                                                           {KvAxis::kToken, "token"},
                                                           {KvAxis::kHead, "head"},
                                                           {KvAxis::kKv, "kv_part"},
                                                           {KvAxis::kDim, "dim"}}};
};

/// The axes of each layout's tensor, outermost first (plain data: the stride checks and the
/// harness's inverse offsets read it; each implementation writes its own offsets). The packed
/// layouts' 2*hd rows are kKv then kDim: K and V the two halves of a row.
struct LayoutAxes {
  KvLayout layout;
  std::array<KvAxis, 5> axes;
  int rank;
};
inline constexpr std::array<LayoutAxes, 6> kLayoutAxes{{
    {KvLayout::kNhd, {KvAxis::kBlock, KvAxis::kToken, KvAxis::kHead, KvAxis::kDim}, 4},
    {KvLayout::kHnd, {KvAxis::kBlock, KvAxis::kHead, KvAxis::kToken, KvAxis::kDim}, 4},
    {KvLayout::kPackedHnd,
     {KvAxis::kBlock, KvAxis::kHead, KvAxis::kToken, KvAxis::kKv, KvAxis::kDim},
     5},
    {KvLayout::kPackedNhd,
     {KvAxis::kBlock, KvAxis::kToken, KvAxis::kHead, KvAxis::kKv, KvAxis::kDim},
     5},
    {KvLayout::kSplitNhd,
     {KvAxis::kBlock, KvAxis::kKv, KvAxis::kToken, KvAxis::kHead, KvAxis::kDim},
     5},
    {KvLayout::kSplitHnd,
     {KvAxis::kBlock, KvAxis::kKv, KvAxis::kHead, KvAxis::kToken, KvAxis::kDim},
     5},
}};
constexpr const LayoutAxes& layout_axes(KvLayout l) {
  return kLayoutAxes[static_cast<std::size_t>(l)];
}

/// Elements per block-scale group of the index-K blockscale layout (SPEC 2).
inline constexpr std::int64_t kScaleGroup = 128;
/// Divisor of the block scale: the e4m3 maximum.
inline constexpr float kFp8E4M3Max = format_of(DType::kFp8E4M3).max_finite;
/// Lower clamp of a block's amax (SPEC 2).
inline constexpr float kBlockScaleAmaxFloor = 1e-4f;

}  // namespace kvo::spec
