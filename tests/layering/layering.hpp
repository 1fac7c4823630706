#pragma once
/// \file layering.hpp
/// The module layering check. A module is a top-level folder of the repository holding a README.md
/// and either include/kvo/<name>/ or sources (*.hpp *.cpp *.cu *.cuh, at any depth); tests/ is
/// never one (it may include anything). Each module's README.md holds exactly one line
///
///     Depends on: spec reference
///
/// (module names separated by single spaces; `Depends on: none` for none). The check then holds
/// four rules:
///
/// 1. Includes follow the graph: no source or header of a module may include another module's
///    headers unless the line names it: neither as `#include "kvo/<other>/..."` (or
///    <kvo/<other>/...>) nor as a relative include ("../<other>/...") that leaves the module's
///    folder for another module's. A module may always include itself.
/// 2. Includes name the module: a quoted include that is neither `kvo/...` nor found next to the
///    including file is looked up among the modules' files by path suffix, the way an include path
///    would find it. Reaching the module's own file is fine (gpu/testing includes gpu/src's private
///    headers that way); reaching only another module's file is a bare include, reported with the
///    module-qualified (or relative) path to write instead, and it counts for rule 1 as well.
/// 3. The declared graph is one-way: the "Depends on:" lines form no cycle (each back edge of a
///    depth-first search is reported as the cycle it closes, so a cyclic graph always fails).
/// 4. CMake links follow the graph: in a module's CMakeLists.txt and *.cmake files, a
///    target_link_libraries item naming a library that another module's CMake files define
///    (add_library; an ALIAS or kvoracle::<name> leads to its target) needs that module on the
///    line. Items are read literally, through ${VAR} set in the module's CMake files (set, list
///    APPEND; a nested ${} matches any name), and through the arguments of a function or macro
///    call (a positional parameter, ARGN, or a cmake_parse_arguments keyword) whose body links
///    them; the problem is reported where the library's name is written.
///
/// Folders named `corpus` or `corpora` (test inputs) and hidden folders are not scanned.

#include <cstddef>
#include <filesystem>
#include <map>
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
  std::set<std::string> linked;  ///< the modules whose libraries its CMake files link, itself aside
  std::size_t files = 0;         ///< sources and headers scanned
};

struct Problem {
  std::string file;      ///< relative to the root, generic separators
  std::size_t line = 0;  ///< 1-based; 0 when the problem is about the whole file
  std::string what;
  std::string describe() const;  ///< "file:line: what"
};

struct Result {
  std::vector<Module> modules;    ///< in name order
  std::vector<Problem> problems;  ///< in file, then line order
  bool ok() const { return problems.empty(); }
};

/// The module folders under `root`, in name order.
std::vector<std::string> discover_modules(const std::filesystem::path& root);

/// Reads every module's README.md and CMake files and scans its sources.
Result check_tree(const std::filesystem::path& root);

/// A declared graph: module -> the modules its "Depends on:" line names.
using Graph = std::map<std::string, std::set<std::string>>;

/// The cycles of `graph`, one per back edge of a depth-first search over the names in order: each
/// as its modules in edge order, starting at its smallest name, the first not repeated at the end
/// ({"a", "b"} is a -> b -> a). Empty exactly when the graph is acyclic. Edges to names that are
/// not keys are ignored.
std::vector<std::vector<std::string>> find_cycles(const Graph& graph);

/// One argument of a CMake command: its text (quotes and brackets removed, escapes and variable
/// references kept as written) and the line it starts on.
struct CMakeArg {
  std::string text;
  std::size_t line = 0;
};

struct CMakeCommand {
  std::string name;  ///< lower case: CMake command names are case-insensitive
  std::size_t line = 0;
  std::vector<CMakeArg> args;  ///< parentheses inside the arguments (if()) are dropped
};

/// The commands of a CMake file, comments (line and bracket) skipped.
std::vector<CMakeCommand> parse_cmake(const std::string& text);

}  // namespace kvo::layering
