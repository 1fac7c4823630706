#pragma once
/// \file layering_internal.hpp
/// What layering.cpp (the tree walk, rules 1 to 3) and cmake_links.cpp (rule 4) share: how files
/// are found and named, and how a graph violation is worded, so that includes and links are
/// reported alike. Not part of the check's interface (layering.hpp).

#include <filesystem>
#include <string>
#include <vector>

#include "layering.hpp"

namespace kvo::layering::detail {

/// The files under `dir` that `keep` accepts, sorted, corpus folders and hidden folders skipped.
std::vector<std::filesystem::path> files_under(const std::filesystem::path& dir,
                                               bool (*keep)(const std::filesystem::path&));

/// `p` relative to `root`, generic separators: how a Problem names its file.
std::string rel_path(const std::filesystem::path& p, const std::filesystem::path& root);

/// "module reference may not <verb> oracle (reference/README.md:3: Depends on: spec)": the tail
/// every graph violation shares, pointing at the line to change.
std::string may_not(const Module& m, const std::string& verb, const std::string& other);

/// Rule 4 over the tree at `root` (absolute, normalized): parses every module's CMake files, and
/// the root cmake/ folder's unless it is a module, and checks each module's links against its
/// Depends on: line. Fills each module's `linked` and appends to `problems` (unsorted). `modules`
/// hold their README's reading already: an undeclared module's links are recorded, not judged.
void check_cmake_links(const std::filesystem::path& root, std::vector<Module>& modules,
                       std::vector<Problem>& problems);

}  // namespace kvo::layering::detail
