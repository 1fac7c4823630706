#pragma once
/// \file layering.hpp
/// The module layering check. A module is a top-level folder of the repository holding a README.md
/// and either include/kvo/<name>/ or sources (*.hpp *.cpp *.cu *.cuh, at any depth); tests/ is
/// never one (it may include anything). Each module's README.md holds exactly one line
///
///     Depends on: spec reference
///
/// (module names separated by single spaces; `Depends on: none` for none), and no source or header
/// of the module may include another module's headers unless the line names it: neither as
/// `#include "kvo/<other>/..."` (or <kvo/<other>/...>) nor as a relative include ("../<other>/...")
/// that leaves the module's folder for another module's. A module may always include itself.
/// Folders named `corpus` or `corpora` (test inputs) are not scanned.

#include <cstddef>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

namespace kvo::layering {

/// Top-level folders that are never modules.
inline const std::set<std::string> kNotModules{"tests"};

struct Module {
  std::string name;
  bool declared = false;           ///< README.md holds one well-formed Depends on: line
  std::size_t line = 0;            ///< its line number (1-based)
  std::set<std::string> depends;   ///< the names it lists (empty for `none`)
  std::set<std::string> included;  ///< the modules its sources actually include, itself aside
  std::size_t files = 0;           ///< sources and headers scanned
};

struct Problem {
  std::string file;      ///< relative to the root, generic separators
  std::size_t line = 0;  ///< 1-based; 0 when the problem is about the whole file
  std::string what;
  std::string describe() const;  ///< "file:line: what"
};

struct Result {
  std::vector<Module> modules;  ///< in name order
  std::vector<Problem> problems;
  bool ok() const { return problems.empty(); }
};

/// The module folders under `root`, in name order.
std::vector<std::string> discover_modules(const std::filesystem::path& root);

/// Reads every module's README.md and scans its sources.
Result check_tree(const std::filesystem::path& root);

}  // namespace kvo::layering
