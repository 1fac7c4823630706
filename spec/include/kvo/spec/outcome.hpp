#pragma once
/// \file outcome.hpp
/// Outcome classes (SPEC 7), the process exit status of each, and the invalid-input error that
/// every validator throws before anything is written (SPEC principle 5).

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kvo::spec {

/// What one subject's run of one case came to. Never folded into each other.
enum class Outcome : std::uint8_t {
  kPass,          ///< bytes identical
  kMismatch,      ///< wrong answer
  kInvalidInput,  ///< rejected with a named reason before anything was written
  kFailedToRun,   ///< launch, allocation or runtime error
  kUnsupported,   ///< configuration the subject does not implement
};

struct OutcomeFacts {
  Outcome outcome;
  std::string_view name;
  int exit_status;  ///< process exit status when this is the worst outcome of a run
  int severity;     ///< which outcome a run reports when several occur
};
/// Exit statuses: 0 pass, 1 mismatch found, 2 invalid input or usage, 3 failed to run. An
/// unsupported configuration is reported but is not a failure.
inline constexpr std::array<OutcomeFacts, 5> kOutcomeFacts{
    {{Outcome::kPass, "pass", 0, 0},
     {Outcome::kMismatch, "mismatch", 1, 3},
     {Outcome::kInvalidInput, "invalid-input", 2, 2},
     {Outcome::kFailedToRun, "failed-to-run", 3, 4},
     {Outcome::kUnsupported, "unsupported", 0, 1}}};

constexpr const OutcomeFacts& facts(Outcome o) {
  return kOutcomeFacts[static_cast<std::size_t>(o)];
}
constexpr int exit_status(Outcome o) { return facts(o).exit_status; }
constexpr std::string_view name_of(Outcome o) { return facts(o).name; }
/// The more severe of two outcomes.
constexpr Outcome worst(Outcome a, Outcome b) {
  return facts(a).severity >= facts(b).severity ? a : b;
}

inline constexpr int kExitPass = 0;
inline constexpr int kExitMismatch = 1;
inline constexpr int kExitInvalidInput = 2;
inline constexpr int kExitFailedToRun = 3;

/// Bad input: names the field, the index within it (-1 when the field is a scalar) and the value.
class InvalidInput : public std::runtime_error {
 public:
  InvalidInput(std::string field, std::int64_t index, std::string value, std::string why)
      : std::runtime_error(compose(field, index, value, why)),
        field_(std::move(field)),
        index_(index),
        value_(std::move(value)) {}
  const std::string& field() const { return field_; }
  std::int64_t index() const { return index_; }
  const std::string& value() const { return value_; }

 private:
  static std::string compose(const std::string& field, std::int64_t index, const std::string& value,
                             const std::string& why) {
    std::string s = "invalid input: " + field;
    if (index >= 0) s += "[" + std::to_string(index) + "]";
    s += " = " + value + ": " + why;
    return s;
  }
  std::string field_;
  std::int64_t index_;
  std::string value_;
};

/// A subject could not run (allocation, launch, runtime error); the message carries the cause.
class FailedToRun : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A subject wrote outside every buffer and its guard bands (into the margin kvoracle keeps around
/// a device copy): a wrong answer found while bringing the result back, judged a mismatch with
/// its location (the message), never the subject's failure to run.
class WroteOutside : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A case needs more device memory than is free (other processes' or threads' allocations hold
/// it): not the subject's failure. Judged as a skipped case (outcome unsupported, its report
/// "skipped: needs N GiB of device memory, M GiB free"), never as a failure to run.
class DeviceMemoryShort : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A subject does not implement a configuration.
class Unsupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace kvo::spec
