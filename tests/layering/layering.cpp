#include "layering.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <system_error>

namespace kvo::layering {
namespace fs = std::filesystem;
namespace {

bool is_source(const fs::path& p) {
  static const std::set<std::string> kExtensions{".hpp", ".cpp", ".cu", ".cuh"};
  return kExtensions.count(p.extension().string()) > 0;
}

bool is_corpus(const std::string& dir_name) {
  return dir_name == "corpus" || dir_name == "corpora";
}

/// Sources and headers under `dir`, sorted, corpus folders and hidden folders skipped.
std::vector<fs::path> sources_under(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->is_directory(ec)) {
      if (is_corpus(name) || name.starts_with(".")) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec) && is_source(it->path())) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> read_lines(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  return lines;
}

std::string rel_path(const fs::path& p, const fs::path& root) {
  return p.lexically_relative(root).generic_string();
}

std::string join(const std::set<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : " ") + n;
  return s.empty() ? "none" : s;
}

/// Reads the Depends on: line of `m`'s README.md into `m`. Returns what is wrong with it
/// (missing, malformed, repeated), "" when nothing is.
std::string read_readme(const fs::path& root, Module& m) {
  static const std::regex kLine(R"(^Depends on: ([a-z][a-z0-9_]*( [a-z][a-z0-9_]*)*)$)");
  const std::vector<std::string> lines = read_lines(root / m.name / "README.md");
  std::string problem;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    const auto first = l.find_first_not_of(" \t>");
    if (first == std::string::npos || l.compare(first, 11, "Depends on:") != 0) continue;
    if (m.line != 0) {
      m.declared = false;
      m.depends.clear();
      m.line = i + 1;
      return "a second \"Depends on:\" line; a README holds exactly one";
    }
    m.line = i + 1;
    std::smatch match;
    std::set<std::string> names;
    if (std::regex_match(l, match, kLine)) {
      std::istringstream words(match[1].str());
      for (std::string n; words >> n;) names.insert(n);
    }
    if (names.empty() || (names.count("none") && names.size() > 1)) {
      problem = "malformed \"" + l +
                "\": expected exactly \"Depends on: none\" or \"Depends on: \" followed by "
                "module names separated by single spaces";
      continue;
    }
    m.declared = true;
    if (!names.count("none")) m.depends = std::move(names);
  }
  if (m.line == 0) {
    return "no \"Depends on:\" line: add one line \"Depends on: <modules>\" (module names "
           "separated by single spaces) or \"Depends on: none\"";
  }
  return problem;
}

/// The module an include names, or "" when it names none: "kvo/<name>/..." (either form), or a
/// quoted relative path that leads out of `self`'s folder into another top-level folder.
std::string included_module(const fs::path& root, const fs::path& file, const std::string& self,
                            char form, const std::string& path) {
  if (path.starts_with("kvo/")) {
    const auto slash = path.find('/', 4);
    return slash == std::string::npos ? "" : path.substr(4, slash - 4);
  }
  if (form != '"') return "";
  const fs::path target = (file.parent_path() / path).lexically_normal();
  const fs::path rel = target.lexically_relative(root);
  if (rel.empty()) return "";
  const std::string top = rel.begin()->string();
  if (top == ".." || top == "." || top == self || std::next(rel.begin()) == rel.end()) return "";
  return top;
}

void scan_module(const fs::path& root, const std::set<std::string>& modules, Module& m,
                 std::vector<Problem>& problems) {
  static const std::regex kInclude(R"(^\s*#\s*include\s*([<"])([^">]*)[">])");
  for (const fs::path& f : sources_under(root / m.name)) {
    ++m.files;
    const std::vector<std::string> lines = read_lines(f);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const std::string& l = lines[i];
      if (l.find("include") == std::string::npos) continue;
      std::smatch match;
      if (!std::regex_search(l, match, kInclude)) continue;
      const char form = match[1].str()[0];
      const std::string path = match[2].str();
      const std::string other = included_module(root, f, m.name, form, path);
      if (other.empty() || other == m.name) continue;
      // A relative include into a folder that is not a module (tests/, shared/) is not layering.
      if (!path.starts_with("kvo/") && modules.count(other) == 0) continue;
      m.included.insert(other);
      // Without a valid line, the README's own problem stands for every include.
      if (!m.declared || m.depends.count(other)) continue;
      const std::string shown = form == '"' ? "\"" + path + "\"" : "<" + path + ">";
      problems.push_back({rel_path(f, root), i + 1,
                          "#include " + shown + ": module " + m.name + " may not include " + other +
                              " (" + m.name + "/README.md:" + std::to_string(m.line) +
                              ": Depends on: " + join(m.depends) + ")"});
    }
  }
}

}  // namespace

std::string Problem::describe() const {
  return line ? file + ":" + std::to_string(line) + ": " + what : file + ": " + what;
}

std::vector<std::string> discover_modules(const fs::path& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (!e.is_directory(ec)) continue;
    const std::string name = e.path().filename().string();
    if (name.starts_with(".") || kNotModules.count(name)) continue;
    if (!fs::is_regular_file(e.path() / "README.md", ec)) continue;
    if (fs::is_directory(e.path() / "include" / "kvo" / name, ec) ||
        !sources_under(e.path()).empty()) {
      out.push_back(name);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result check_tree(const fs::path& root_in) {
  fs::path root = fs::absolute(root_in).lexically_normal();
  if (root.filename().empty()) root = root.parent_path();  // "/repo/" -> "/repo"
  Result r;
  const std::vector<std::string> names = discover_modules(root);
  const std::set<std::string> modules(names.begin(), names.end());
  for (const std::string& n : names) {
    Module m;
    m.name = n;
    const std::string readme_problem = read_readme(root, m);
    scan_module(root, modules, m, r.problems);  // reports nothing without a valid line
    if (!readme_problem.empty()) {
      r.problems.push_back({n + "/README.md", m.line,
                            readme_problem + " (its sources include: " + join(m.included) + ")"});
    }
    r.modules.push_back(std::move(m));
  }
  return r;
}

}  // namespace kvo::layering
