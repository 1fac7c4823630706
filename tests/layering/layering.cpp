#include "layering.hpp"

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <system_error>
#include <tuple>

#include "layering_internal.hpp"

namespace kvo::layering {
namespace fs = std::filesystem;
using detail::files_under;
using detail::may_not;
using detail::rel_path;
namespace {

bool is_source(const fs::path& p) {
  static const std::set<std::string> kExtensions{".hpp", ".cpp", ".cu", ".cuh"};
  return kExtensions.count(p.extension().string()) > 0;
}

bool is_corpus(const std::string& dir_name) {
  return dir_name == "corpus" || dir_name == "corpora";
}

std::vector<fs::path> sources_under(const fs::path& dir) { return files_under(dir, is_source); }

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

/// The top-level folder of a root-relative generic path: the module a file belongs to.
std::string top_of(const std::string& rel) { return rel.substr(0, rel.find('/')); }

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

/// Every module's source and header, root-relative, by file name: what an include path could
/// reach. Only modules' files: a bare include of a tests/ or third-party header is not layering.
using FileIndex = std::map<std::string, std::vector<std::string>>;

/// The other module's file a quoted bare include reaches through an include path, or "" when it
/// reaches none: `path` is not kvo/-qualified, not found next to `file` (a same-folder include
/// is plain C++, not an include path), not relative ("./", "../": rule 1 judges those), and among
/// the files it could mean (same path suffix) none is `self`'s, whose private headers a module
/// may reach through its own include path (gpu/testing -> gpu/src).
std::string bare_target(const fs::path& file, const std::string& self, const std::string& path,
                        const FileIndex& index) {
  if (path.empty() || path.starts_with("kvo/")) return "";
  const fs::path p(path);
  for (const auto& part : p) {
    if (part == "." || part == "..") return "";
  }
  std::error_code ec;
  if (fs::exists(file.parent_path() / p, ec)) return "";
  const auto it = index.find(p.filename().string());
  if (it == index.end()) return "";
  std::string first;
  for (const std::string& rel : it->second) {
    if (rel != path && !rel.ends_with("/" + path)) continue;
    if (top_of(rel) == self) return "";
    if (first.empty()) first = rel;
  }
  return first;
}

/// What to write instead of a bare include of `target` (root-relative) from `file`: its
/// kvo/<module>/ path where the module's include/ folder gives it one, else the relative path.
std::string bare_fix(const fs::path& root, const fs::path& file, const std::string& target) {
  const std::string module = top_of(target);
  const std::string include_dir = module + "/include/";
  if (target.starts_with(include_dir + "kvo/" + module + "/")) {
    return "include it as \"" + target.substr(include_dir.size()) + "\"";
  }
  const std::string relative =
      (root / target).lexically_relative(file.parent_path()).generic_string();
  return "no kvo/" + module + "/ path reaches it (it is not under " + include_dir + "kvo/" +
         module + "/): move it there or include it as \"" + relative + "\"";
}

void scan_module(const fs::path& root, const std::set<std::string>& modules,
                 const std::vector<fs::path>& sources, const FileIndex& index, Module& m,
                 std::vector<Problem>& problems) {
  static const std::regex kInclude(R"(^\s*#\s*include\s*([<"])([^">]*)[">])");
  for (const fs::path& f : sources) {
    ++m.files;
    const std::vector<std::string> lines = read_lines(f);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const std::string& l = lines[i];
      if (l.find("include") == std::string::npos) continue;
      std::smatch match;
      if (!std::regex_search(l, match, kInclude)) continue;
      const char form = match[1].str()[0];
      const std::string path = match[2].str();
      const std::string shown = form == '"' ? "\"" + path + "\"" : "<" + path + ">";
      std::string other = included_module(root, f, m.name, form, path);
      if (other.empty() && form == '"') {
        const std::string target = bare_target(f, m.name, path, index);
        if (!target.empty()) {
          other = top_of(target);
          // Reported whatever the README says: the include compiles only through another module's
          // include directory, so it breaks as soon as the link line that brings that in changes.
          problems.push_back({rel_path(f, root), i + 1,
                              "#include " + shown + " reaches module " + other + "'s " + target +
                                  " through an include path without naming the module: " +
                                  bare_fix(root, f, target)});
        }
      }
      if (other.empty() || other == m.name) continue;
      // A relative include into a folder that is not a module (tests/, shared/) is not layering.
      if (!path.starts_with("kvo/") && modules.count(other) == 0) continue;
      m.included.insert(other);
      // Without a valid line, the README's own problem stands for every include.
      if (!m.declared || m.depends.count(other)) continue;
      problems.push_back(
          {rel_path(f, root), i + 1, "#include " + shown + ": " + may_not(m, "include", other)});
    }
  }
}

}  // namespace

namespace detail {

std::vector<fs::path> files_under(const fs::path& dir, bool (*keep)(const fs::path&)) {
  std::vector<fs::path> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->is_directory(ec)) {
      if (is_corpus(name) || name.starts_with(".")) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec) && keep(it->path())) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string rel_path(const fs::path& p, const fs::path& root) {
  return p.lexically_relative(root).generic_string();
}

std::string may_not(const Module& m, const std::string& verb, const std::string& other) {
  return "module " + m.name + " may not " + verb + " " + other + " (" + m.name +
         "/README.md:" + std::to_string(m.line) + ": Depends on: " + join(m.depends) + ")";
}

}  // namespace detail

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

std::vector<std::vector<std::string>> find_cycles(const Graph& graph) {
  enum class Color { kWhite, kGray, kBlack };
  std::map<std::string, Color> color;
  std::vector<std::string> path;
  std::vector<std::vector<std::string>> cycles;
  const std::function<void(const std::string&)> visit = [&](const std::string& n) {
    color[n] = Color::kGray;
    path.push_back(n);
    for (const std::string& d : graph.at(n)) {
      if (!graph.count(d)) continue;
      if (color[d] == Color::kGray) {  // a back edge: the path from d to here closes a cycle
        std::vector<std::string> c(std::find(path.begin(), path.end(), d), path.end());
        std::rotate(c.begin(), std::min_element(c.begin(), c.end()), c.end());
        cycles.push_back(std::move(c));
      } else if (color[d] == Color::kWhite) {
        visit(d);
      }
    }
    path.pop_back();
    color[n] = Color::kBlack;
  };
  for (const auto& entry : graph) {
    if (color[entry.first] == Color::kWhite) visit(entry.first);
  }
  return cycles;
}

Result check_tree(const fs::path& root_in) {
  fs::path root = fs::absolute(root_in).lexically_normal();
  if (root.filename().empty()) root = root.parent_path();  // "/repo/" -> "/repo"
  Result r;
  const std::vector<std::string> names = discover_modules(root);
  const std::set<std::string> modules(names.begin(), names.end());

  std::map<std::string, std::vector<fs::path>> sources;
  FileIndex index;
  for (const std::string& n : names) {
    sources[n] = sources_under(root / n);
    for (const fs::path& f : sources[n]) {
      index[f.filename().string()].push_back(rel_path(f, root));
    }
  }

  std::vector<std::string> readme_problems;
  for (const std::string& n : names) {
    Module m;
    m.name = n;
    readme_problems.push_back(read_readme(root, m));
    scan_module(root, modules, sources[n], index, m, r.problems);  // no graph check undeclared
    r.modules.push_back(std::move(m));
  }

  // Rule 4 (cmake_links.cpp): fills each module's `linked`, which the README problems below show.
  detail::check_cmake_links(root, r.modules, r.problems);

  for (std::size_t i = 0; i < r.modules.size(); ++i) {
    const Module& m = r.modules[i];
    if (readme_problems[i].empty()) continue;
    std::string uses = " (its sources include: " + join(m.included) + ")";
    if (!m.linked.empty()) uses += " (its CMake files link: " + join(m.linked) + ")";
    r.problems.push_back({m.name + "/README.md", m.line, readme_problems[i] + uses});
  }

  // Rule 3, over the modules whose line is valid (the others have their own problem).
  Graph graph;
  std::map<std::string, const Module*> by_name;
  for (const Module& m : r.modules) {
    by_name[m.name] = &m;
    if (m.declared) graph[m.name] = m.depends;
  }
  for (const auto& cycle : find_cycles(graph)) {
    std::string shown;
    for (const std::string& n : cycle) shown += n + " -> ";
    shown += cycle.front();
    r.problems.push_back({cycle.front() + "/README.md", by_name.at(cycle.front())->line,
                          "the declared module graph has a cycle: " + shown +
                              " (each module's \"Depends on:\" line names the next); the layering "
                              "must be one-way, so one of these dependencies has to go"});
  }

  std::stable_sort(r.problems.begin(), r.problems.end(), [](const Problem& a, const Problem& b) {
    return std::tie(a.file, a.line) < std::tie(b.file, b.line);
  });
  return r;
}

}  // namespace kvo::layering
