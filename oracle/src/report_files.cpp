#include "kvo/oracle/report_files.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <system_error>

#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

using spec::Outcome;

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 admits no control characters but tab, newline and carriage return.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t' && c != '\r') {
          out += '?';
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string json_escape(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x",
                        static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(v));
  return buf;
}

/// A subject's failures as one text: its classes with their counts, the first failure, then a
/// merged report's later ones.
std::string failures_text(const SubjectSummary& s) {
  std::string text;
  for (const FailureClassCount& c : s.failure_classes) {
    text += std::to_string(c.cases) + " cases: " + c.name + " (first: case " +
            std::to_string(c.first_case) + ", seed " + hex64(c.first_seed) + ")\n";
  }
  if (!text.empty()) text += "\n";
  text += s.first_failure;
  for (const std::string& f : s.more_failures) text += "\n\n" + f;
  return text;
}

}  // namespace

std::string outcome_count_key(spec::Outcome outcome) {
  std::string key(spec::name_of(outcome));
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

std::string junit_xml(const CheckReport& r) {
  std::int64_t failures = 0, errors = 0, skipped = 0;
  for (const auto& s : r.subjects) {
    if (!s.skipped.empty())
      ++skipped;
    else if (s.count(Outcome::kFailedToRun) || s.count(Outcome::kInvalidInput))
      ++errors;
    else if (s.count(Outcome::kMismatch))
      ++failures;
  }
  std::ostringstream x;
  x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  x << "<testsuites name=\"kvoracle check\" tests=\"" << r.subjects.size() << "\" failures=\""
    << failures << "\" errors=\"" << errors << "\" skipped=\"" << skipped << "\" time=\""
    << r.seconds << "\">\n";
  x << "  <testsuite name=\"kvoracle.check\" tests=\"" << r.subjects.size() << "\" failures=\""
    << failures << "\" errors=\"" << errors << "\" skipped=\"" << skipped << "\" time=\""
    << r.seconds << "\">\n";
  x << "    <properties>\n      <property name=\"seed\" value=\"" << hex64(r.seed)
    << "\"/>\n      <property name=\"cases\" value=\"" << r.cases_run
    << "\"/>\n    </properties>\n";
  for (const auto& s : r.subjects) {
    x << "    <testcase classname=\"kvoracle.check." << xml_escape(std::string(spec::name_of(s.op)))
      << "\" name=\"" << xml_escape(s.name) << "\">\n";
    const std::string counts =
        std::to_string(s.count(Outcome::kPass)) + " of " + std::to_string(s.cases) + " cases pass";
    if (!s.blind_spots.empty()) {
      // SPEC principle 4: the bug classes this subject's declared profile could not see.
      x << "      <properties>\n";
      for (const auto& [bug, cases] : s.blind_spots) {
        x << "        <property name=\"blind_spot." << xml_escape(bug) << "\" value=\"" << cases
          << " of " << s.cases << " cases\"/>\n";
      }
      x << "      </properties>\n";
    }
    if (!s.skipped.empty()) {
      x << "      <skipped message=\"" << xml_escape(s.skipped) << "\"/>\n";
    } else if (s.count(Outcome::kFailedToRun) || s.count(Outcome::kInvalidInput)) {
      x << "      <error type=\""
        << (s.count(Outcome::kFailedToRun) ? "failed-to-run" : "invalid-input") << "\" message=\""
        << xml_escape(counts) << "\">" << xml_escape(failures_text(s)) << "</error>\n";
    } else if (s.count(Outcome::kMismatch)) {
      x << "      <failure type=\"mismatch\" message=\"" << xml_escape(counts) << "\">"
        << xml_escape(failures_text(s)) << "</failure>\n";
    }
    x << "    </testcase>\n";
  }
  x << "  </testsuite>\n</testsuites>\n";
  return x.str();
}

std::string report_json(const CheckReport& r) {
  std::ostringstream j;
  j << "{\n  \"seed\": " << json_escape(hex64(r.seed))
    << ",\n  \"total_shards\": " << r.total_shards << ",\n  \"shard_index\": " << r.shard_index
    << ",\n  \"cases_run\": " << r.cases_run << ",\n  \"seconds\": " << r.seconds
    << ",\n  \"cache_bytes_compared\": " << r.bytes_compared
    << ",\n  \"result\": " << json_escape(std::string(spec::name_of(r.worst)))
    << ",\n  \"reference\": {\"tier\": " << json_escape(std::string(spec::name_of(r.tier)))
    << ", \"answerers\": " << json_escape(r.tier_answerers) << ", \"tier_cases\": " << r.tier_cases
    << ", \"cpu_cases\": " << r.cpu_cases << ", \"tier_checks\": " << r.tier_checks
    << ", \"resident_cases\": " << r.resident_cases
    << ", \"resident_checks\": " << r.resident_checks
    << ", \"disagreement\": " << json_escape(r.tier_disagreement) << "}"
    << ",\n  \"subjects\": [";
  for (std::size_t i = 0; i < r.subjects.size(); ++i) {
    const auto& s = r.subjects[i];
    j << (i ? "," : "") << "\n    {\"name\": " << json_escape(s.name)
      << ", \"op\": " << json_escape(std::string(spec::name_of(s.op)))
      << ", \"skipped\": " << json_escape(s.skipped) << ", \"cases\": " << s.cases;
    for (const auto& f : spec::kOutcomeFacts)
      j << ", \"" << outcome_count_key(f.outcome) << "\": " << s.count(f.outcome);
    j << ", \"first_failure\": " << json_escape(s.first_failure) << ", \"more_failures\": [";
    for (std::size_t k = 0; k < s.more_failures.size(); ++k)
      j << (k ? ", " : "") << json_escape(s.more_failures[k]);
    j << "], \"failure_classes\": [";
    for (std::size_t k = 0; k < s.failure_classes.size(); ++k) {
      const FailureClassCount& c = s.failure_classes[k];
      j << (k ? ", " : "") << "{\"class\": " << json_escape(c.name) << ", \"cases\": " << c.cases
        << ", \"first_case\": " << c.first_case
        << ", \"first_seed\": " << json_escape(hex64(c.first_seed)) << "}";
    }
    j << "], \"blind_spots\": {";
    bool first_spot = true;
    for (const auto& [bug, cases] : s.blind_spots) {
      j << (first_spot ? "" : ", ") << json_escape(bug) << ": " << cases;
      first_spot = false;
    }
    j << "}}";
  }
  j << "\n  ],\n  \"coverage\": [";
  for (std::size_t i = 0; i < r.coverage.size(); ++i) {
    const CoverageRow& c = r.coverage[i];
    j << (i ? "," : "") << "\n    {\"op\": " << json_escape(std::string(spec::name_of(c.op)))
      << ", \"condition\": " << json_escape(c.condition) << ", \"means\": " << json_escape(c.means)
      << ", \"cases\": " << c.cases << ", \"reached\": " << c.reached
      << ", \"first_case\": " << c.first_case << "}";
  }
  j << "\n  ]\n}\n";
  return j.str();
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw spec::FailedToRun("cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw spec::FailedToRun("cannot rename " + tmp + " to " + path);
  }
}

}  // namespace kvo::oracle
