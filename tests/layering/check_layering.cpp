// check_layering ROOT: the module layering check (layering.hpp) over the repository at ROOT. Prints
// every module with its declared dependencies and those its sources include and its CMake files
// link, then every problem as "file:line: what". Exit status: 0 clean, 1 problems found, 2 usage.
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>

#include "layering.hpp"

namespace {

std::string join(const std::set<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : " ") + n;
  return s.empty() ? "none" : s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || !std::filesystem::is_directory(argv[1])) {
    std::fprintf(stderr, "usage: check_layering REPOSITORY_ROOT\n");
    return 2;
  }
  const kvo::layering::Result r = kvo::layering::check_tree(argv[1]);
  for (const auto& m : r.modules) {
    std::printf("%-10s %3zu files  declared: %-40s includes: %-40s links: %s\n", m.name.c_str(),
                m.files, m.declared ? join(m.depends).c_str() : "(missing)",
                join(m.included).c_str(), join(m.linked).c_str());
  }
  for (const auto& p : r.problems) std::printf("%s\n", p.describe().c_str());
  if (r.modules.empty()) {
    std::printf("no module found under %s\n", argv[1]);
    return 1;
  }
  std::printf("%zu modules, %zu problems: %s\n", r.modules.size(), r.problems.size(),
              r.ok() ? "ok" : "FAILED");
  return r.ok() ? 0 : 1;
}
