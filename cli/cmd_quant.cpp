// `kvoracle quant`: float32 values through kvoracle's own conversions (SPEC section 2): the same
// reference functions the cache model and the tests use, so what this prints is what the
// reference writes. Values come from the arguments or, when there are none, from stdin (one per
// line, blank lines ignored). Every value is validated before anything is printed (SPEC principle
// 5): one bad value means no output at all and exit status 2.

#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "commands.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/spec/types.hpp"

namespace kvo::cli {
namespace {

using spec::DType;
using spec::InvalidInput;
using spec::Saturation;
using spec::ScaleMode;

constexpr std::string_view kTargets = "fp8_e4m3|fp8_e5m2|bf16|fp16";
constexpr std::string_view kActivations = "f32|bf16|fp16";
constexpr std::string_view kWhitespace = " \t\r\v\f";
// Table column widths: the longest shortest-form float32 ("-1.17549435e-38") and "rounded_bits".
constexpr std::size_t kValueWidth = 15;
constexpr std::size_t kBitsWidth = 12;
constexpr std::size_t kCodeWidth = 6;

struct QuantArgs {
  std::string to;
  std::string sat = "satfinite";
  std::string scale;
  std::string scale_mode;
  std::string via;
  std::string scale_act;
  std::string format = "table";
  std::vector<std::string> values;
  CLI::Option* scale_opt = nullptr;
  CLI::Option* scale_mode_opt = nullptr;
  CLI::Option* via_opt = nullptr;
  CLI::Option* scale_act_opt = nullptr;
};

/// One value's text and where it came from, for error messages.
struct Source {
  std::string_view field;  ///< "VALUES" (argument position) or "stdin line"
  std::int64_t index;      ///< 1-based
};

std::string_view trim(std::string_view s) {
  const std::size_t begin = s.find_first_not_of(kWhitespace);
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(kWhitespace) - begin + 1);
}

[[noreturn]] void reject(const Source& src, std::string_view text, std::string why) {
  throw InvalidInput(std::string(src.field), src.index, "'" + std::string(text) + "'",
                     std::move(why));
}

/// A float32 written as a decimal (1.0625, -464, 1e-30, inf, -nan: std::from_chars, correctly
/// rounded) or as its bit pattern (0x3F800000). Decimals that would round to 0 or infinity are
/// rejected rather than silently flushed: 0, inf or a bit pattern say that unambiguously.
float parse_value(std::string_view text, const Source& src) {
  const std::string_view t = trim(text);
  if (t.empty()) reject(src, text, "empty value");
  if (t.size() >= 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) {
    const std::string_view digits = t.substr(2);
    std::uint64_t bits = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), bits, 16);
    if (digits.empty() || ec == std::errc::invalid_argument ||
        end != digits.data() + digits.size()) {
      reject(src, text, "not a hexadecimal float32 bit pattern");
    }
    if (ec == std::errc::result_out_of_range || bits > 0xFFFFFFFFu) {
      reject(src, text, "a float32 bit pattern has at most 32 bits");
    }
    return reference::float_of(static_cast<std::uint32_t>(bits));
  }
  // from_chars takes no leading '+'; a second sign after it must still fail.
  std::string_view d = t;
  if (d.size() >= 2 && d[0] == '+' && d[1] != '-' && d[1] != '+') d.remove_prefix(1);
  float x = 0.0f;
  const auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), x);
  if (ec == std::errc::invalid_argument || end != d.data() + d.size()) {
    reject(src, text, "not a decimal number, inf, nan or 0x float32 bit pattern");
  }
  if (ec == std::errc::result_out_of_range) {
    reject(src, text,
           "outside the float32 range (it would round to 0 or infinity; write 0, inf or the bits)");
  }
  return x;
}

/// Reads stdin whole: one fread loop instead of per-line stream extraction.
std::string read_all_stdin() {
  std::string data;
  std::array<char, 1 << 16> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), stdin)) > 0) data.append(buf.data(), n);
  if (std::ferror(stdin)) throw spec::FailedToRun("cannot read stdin");
  return data;
}

std::vector<float> collect_values(const std::vector<std::string>& args) {
  std::vector<float> values;
  if (!args.empty()) {
    values.reserve(args.size());
    for (std::size_t i = 0; i < args.size(); ++i) {
      values.push_back(parse_value(args[i], Source{"VALUES", static_cast<std::int64_t>(i) + 1}));
    }
    return values;
  }
  const std::string data = read_all_stdin();
  std::string_view rest = data;
  std::int64_t line_no = 0;
  while (!rest.empty()) {
    const std::size_t nl = rest.find('\n');
    const std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    ++line_no;
    if (trim(line).empty()) continue;
    values.push_back(parse_value(line, Source{"stdin line", line_no}));
  }
  return values;
}

template <class E>
E parse_choice(std::string_view option, const std::string& text, std::string_view choices) {
  const auto parsed = spec::parse_enum<E>(text);
  // `choices` may be a subset of the enum's names (e.g. --to has no f32).
  bool allowed = false;
  if (parsed) {
    std::string_view rest = choices;
    while (!rest.empty() && !allowed) {
      const std::size_t bar = rest.find('|');
      allowed = rest.substr(0, bar) == text;
      rest = bar == std::string_view::npos ? std::string_view{} : rest.substr(bar + 1);
    }
  }
  if (!allowed)
    throw InvalidInput(std::string(option), -1, text, "expected " + std::string(choices));
  return *parsed;
}

/// Fixed-width hex digits: lowercase for --format bits ("7e", "3f80"), uppercase after "0x" in the
/// table, as fp8_spec.md writes codes and bit patterns.
void append_hex(std::string& out, std::uint32_t value, int digits, bool upper) {
  const char* table = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  for (int i = digits - 1; i >= 0; --i) out.push_back(table[(value >> (4 * i)) & 0xFu]);
}

std::string hex_prefixed(std::uint32_t value, int digits) {
  std::string s = "0x";
  append_hex(s, value, digits, true);
  return s;
}

/// The shortest decimal that reads back as the same float32.
std::string shortest(float x) {
  std::array<char, 32> buf;
  const auto res = std::to_chars(buf.data(), buf.data() + buf.size(), x);
  return std::string(buf.data(), res.ptr);
}

void append_padded(std::string& out, std::string_view s, std::size_t width) {
  out.append(s);
  if (s.size() < width) out.append(width - s.size(), ' ');
  out.push_back(' ');
}

std::string hex32(std::uint32_t bits) { return hex_prefixed(bits, 8); }

void write_stdout(const std::string& out) {
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0) {
    throw spec::FailedToRun("cannot write stdout");
  }
}

void run_quant(const QuantArgs& a, int& status) {
  spec::KvQuant q;
  q.cache_dtype = parse_choice<DType>("--to", a.to, kTargets);
  q.saturation = parse_choice<Saturation>("--sat", a.sat, spec::enum_choices<Saturation>());
  const bool have_scale = a.scale_opt->count() > 0;
  float scale = 1.0f;
  if (have_scale) {
    scale = parse_value(a.scale, Source{"--scale", -1});
    if (!std::isfinite(scale) || !(scale > 0.0f)) {
      throw InvalidInput("--scale", -1, a.scale, "the scale must be finite and > 0");
    }
  }
  q.scale_mode =
      a.scale_mode_opt->count() > 0
          ? parse_choice<ScaleMode>("--scale-mode", a.scale_mode, spec::enum_choices<ScaleMode>())
          : (have_scale ? ScaleMode::kDivide : ScaleMode::kNone);
  if (q.scale_mode != ScaleMode::kNone && !have_scale) {
    throw InvalidInput("--scale-mode", -1, a.scale_mode, "needs --scale");
  }
  DType act = DType::kF32;
  q.via_model_dtype = a.via_opt->count() > 0;
  if (q.via_model_dtype) act = parse_choice<DType>("--via-model-dtype", a.via, kActivations);
  q.scale_in_model_dtype = a.scale_act_opt->count() > 0;
  if (q.scale_in_model_dtype) {
    const DType scale_act =
        parse_choice<DType>("--scale-in-model-dtype", a.scale_act, kActivations);
    if (q.scale_mode == ScaleMode::kNone) {
      throw InvalidInput("--scale-in-model-dtype", -1, a.scale_act,
                         "rounds the scale, but scale mode none applies none (give --scale)");
    }
    if (q.via_model_dtype && scale_act != act) {
      throw InvalidInput("--scale-in-model-dtype", -1, a.scale_act,
                         "the activation dtype is " + a.via +
                             " (--via-model-dtype): one model "
                             "dtype rounds both");
    }
    act = scale_act;
  }
  const bool approx = q.scale_mode == ScaleMode::kDivApprox;
  if (a.format != "table" && a.format != "bits") {
    throw InvalidInput("--format", -1, a.format, "expected table|bits");
  }

  const std::vector<float> values = collect_values(a.values);  // throws before any output
  const int digits = static_cast<int>(2 * spec::dtype_bytes(q.cache_dtype));
  std::string out;
  if (a.format == "bits") {
    out.reserve(values.size() * static_cast<std::size_t>(digits + 1));
    for (const float x : values) {
      append_hex(out, reference::quantize_kv(x, scale, q, act), digits, false);
      out.push_back('\n');
    }
  } else {
    const bool show_scaled = q.scale_mode != ScaleMode::kNone;
    out += "# to=" + std::string(spec::name_of(q.cache_dtype));
    if (spec::is_fp8(q.cache_dtype)) out += " sat=" + std::string(spec::name_of(q.saturation));
    out += " scale_mode=" + std::string(spec::name_of(q.scale_mode));
    if (show_scaled) {
      out += " scale=" + shortest(scale) + " (" + hex32(reference::bits_of(scale)) + ")";
    }
    if (q.via_model_dtype) out += " via_model_dtype=" + std::string(spec::name_of(act));
    if (q.scale_in_model_dtype) {
      const float used = reference::effective_scale(scale, q, act);
      out += " scale_in_model_dtype=" + std::string(spec::name_of(act)) + " (scale used " +
             shortest(used) + " = " + hex32(reference::bits_of(used)) + ")";
    }
    out += '\n';
    append_padded(out, "input", kValueWidth);
    append_padded(out, "input_bits", kBitsWidth);
    if (show_scaled) append_padded(out, "scaled_bits", kBitsWidth);
    if (q.via_model_dtype) append_padded(out, "rounded_bits", kBitsWidth);
    append_padded(out, "code", kCodeWidth);
    out += approx ? "decoded  admissible (div_approx: quotients within 2 ulp)\n" : "decoded\n";
    for (const float x : values) {
      append_padded(out, shortest(x), kValueWidth);
      append_padded(out, hex32(reference::bits_of(x)), kBitsWidth);
      const float scaled =
          reference::apply_scale(x, reference::effective_scale(scale, q, act), q.scale_mode);
      if (show_scaled) append_padded(out, hex32(reference::bits_of(scaled)), kBitsWidth);
      if (q.via_model_dtype) {
        append_padded(out, hex32(reference::bits_of(reference::round_to(scaled, act))), kBitsWidth);
      }
      const std::uint32_t code = reference::quantize_kv(x, scale, q, act);
      append_padded(out, hex_prefixed(code, digits), kCodeWidth);
      out += shortest(reference::decode(code, q.cache_dtype));
      if (approx) {
        out += "  {";
        const auto codes = reference::admissible_kv_codes(x, scale, q, act);
        for (std::size_t i = 0; i < codes.size(); ++i) {
          if (i) out += ", ";
          out += hex_prefixed(codes[i], digits);
        }
        out += '}';
      }
      out += '\n';
    }
  }
  write_stdout(out);
  status = spec::kExitPass;
}

}  // namespace

void add_quant(CLI::App& app, int& status) {
  auto args = std::make_shared<QuantArgs>();
  CLI::App* sub = app.add_subcommand(
      "quant", "Convert float32 values with kvoracle's reference conversions (SPEC section 2)");
  sub->add_option("--to", args->to, "Target type: " + std::string(kTargets))->required();
  sub->add_option("--sat", args->sat,
                  "fp8 overflow/NaN convention: " + spec::enum_choices<Saturation>() +
                      " (default satfinite; ignored for bf16/fp16)");
  args->scale_opt =
      sub->add_option("--scale", args->scale, "Scale S (finite, > 0), decimal or 0x float32 bits");
  args->scale_mode_opt = sub->add_option("--scale-mode", args->scale_mode,
                                         "How S applies: " + spec::enum_choices<ScaleMode>() +
                                             " (default divide with --scale, none without)");
  args->via_opt = sub->add_option(
      "--via-model-dtype", args->via,
      "Round the scaled value to this activation type first: " + std::string(kActivations));
  args->scale_act_opt = sub->add_option(
      "--scale-in-model-dtype", args->scale_act,
      "Round the scale itself to this activation type first (torch's promotion of a 0-dim "
      "scale): " +
          std::string(kActivations));
  sub->add_option("--format", args->format,
                  "table (default) or bits (the code in hex, one a line)");
  sub->add_option("VALUES", args->values,
                  "Decimals (1.0625, -464, inf, nan, 1e-30) or float32 bits (0x3F800000); read "
                  "from stdin, one a line, when none are given. Values such as -inf or -nan need "
                  "-- before the first value (CLI11 reads them as options otherwise).");
  sub->callback([args, &status] { run_quant(*args, status); });
}

}  // namespace kvo::cli
