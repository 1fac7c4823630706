// The layering check itself, on small trees written to a temporary folder: a clean tree passes; a
// planted include across the graph, a bare include of another module's header, a cycle in the
// declared graph, a CMake link to a module the graph does not allow (literal, through a variable,
// through a function's arguments), a missing, malformed or repeated "Depends on:" line each fail
// with the file, the line and what; what is not a module, not a source or not a link is left alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "layering.hpp"

namespace {

namespace fs = std::filesystem;
using kvo::layering::check_tree;
using kvo::layering::discover_modules;
using kvo::layering::find_cycles;
using kvo::layering::Graph;
using kvo::layering::parse_cmake;
using kvo::layering::Problem;
using Cycles = std::vector<std::vector<std::string>>;

class Layering : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() /
            ("kvo_layering_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    // The smallest layered tree: spec <- reference <- oracle, a test folder and a corpus.
    write("spec/README.md", "# spec\n\nMay include: the standard library.\n\nDepends on: none\n");
    write("spec/include/kvo/spec/types.hpp", "#pragma once\n#include <cstdint>\n");
    write("reference/README.md", "# reference\n\nDepends on: spec\n");
    write("reference/include/kvo/reference/numbers.hpp",
          "#pragma once\n#include \"kvo/spec/types.hpp\"\n");
    write("reference/src/numbers.cpp",
          "#include \"kvo/reference/numbers.hpp\"\n\n#include <cmath>\n\nint f() { return 0; }\n");
    write("oracle/README.md", "# oracle\n\nDepends on: spec reference\n");
    write("oracle/src/check.cpp",
          "#include \"kvo/reference/numbers.hpp\"\n#include \"kvo/spec/types.hpp\"\n"
          "#include \"local.hpp\"\n");
    write("oracle/src/local.hpp", "#pragma once\n");
    write("tests/README.md", "# tests\n");
    write("tests/reference/test_numbers.cpp", "#include \"kvo/oracle/check.hpp\"\n");
    write("reference/corpus/seed.cpp", "#include \"kvo/oracle/check.hpp\"\n");
    // Their libraries, linked along the same graph; tests/ (not a module) links anything.
    write("spec/CMakeLists.txt", "add_library(kvo_spec STATIC src/types.cpp)\n");
    write("reference/CMakeLists.txt",
          "add_library(kvo_reference STATIC src/numbers.cpp)\n"
          "target_link_libraries(kvo_reference PUBLIC kvo_spec)\n");
    write(
        "oracle/CMakeLists.txt",
        "add_library(kvo_oracle STATIC src/check.cpp)\n"
        "target_link_libraries(kvo_oracle PUBLIC kvo_reference  # the numbers\n"
        "                                 PRIVATE $<BUILD_INTERFACE:kvo_spec> Threads::Threads)\n");
    write("tests/CMakeLists.txt", "target_link_libraries(test_numbers PRIVATE kvo_oracle)\n");
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
  }
  std::vector<Problem> problems() const { return check_tree(root_).problems; }

  fs::path root_;
};

std::string all(const std::vector<Problem>& ps) {
  std::string s;
  for (const auto& p : ps) s += p.describe() + "\n";
  return s;
}

TEST_F(Layering, CleanTreePasses) {
  const auto r = check_tree(root_);
  EXPECT_TRUE(r.ok()) << all(r.problems);
  ASSERT_EQ(r.modules.size(), 3u);
  EXPECT_EQ(r.modules[0].name, "oracle");
  EXPECT_EQ(r.modules[0].included, (std::set<std::string>{"reference", "spec"}));
  EXPECT_EQ(r.modules[0].linked, (std::set<std::string>{"reference", "spec"}));
  EXPECT_EQ(r.modules[1].linked, (std::set<std::string>{"spec"}));
  EXPECT_TRUE(r.modules[2].declared);
  EXPECT_TRUE(r.modules[2].depends.empty());  // spec: none
}

TEST_F(Layering, PlantedIncludeFailsWithFileLineAndHeader) {
  write("reference/src/numbers.cpp",
        "#include \"kvo/reference/numbers.hpp\"\n\n#include \"kvo/oracle/check.hpp\"\n");
  const auto ps = problems();
  ASSERT_EQ(ps.size(), 1u) << all(ps);
  EXPECT_EQ(ps[0].file, "reference/src/numbers.cpp");
  EXPECT_EQ(ps[0].line, 3u);
  EXPECT_NE(ps[0].what.find("\"kvo/oracle/check.hpp\""), std::string::npos) << ps[0].what;
  EXPECT_NE(ps[0].what.find("module reference may not include oracle"), std::string::npos);
  EXPECT_NE(ps[0].what.find("reference/README.md:3: Depends on: spec"), std::string::npos);
  EXPECT_EQ(ps[0].describe().rfind("reference/src/numbers.cpp:3: #include", 0), 0u);
}

TEST_F(Layering, EveryIncludeFormIsSeenAndCommentsAreNot) {
  write("reference/include/kvo/reference/numbers.hpp",
        "#pragma once\n  #  include <kvo/oracle/a.hpp>\n// #include \"kvo/oracle/b.hpp\"\n"
        "#include \"kvo/truth/c.hpp\"\n");
  write("reference/src/kernel.cu", "#include \"kvo/gpu/d.hpp\"\n");
  const auto ps = problems();
  ASSERT_EQ(ps.size(), 3u) << all(ps);
  EXPECT_EQ(ps[0].describe().rfind("reference/include/kvo/reference/numbers.hpp:2: #include", 0),
            0u);
  EXPECT_NE(ps[0].what.find("<kvo/oracle/a.hpp>"), std::string::npos);
  // A module that does not exist (yet) is not in the list either.
  EXPECT_EQ(ps[1].line, 4u);
  EXPECT_NE(ps[1].what.find("may not include truth"), std::string::npos);
  EXPECT_EQ(ps[2].file, "reference/src/kernel.cu");
}

TEST_F(Layering, RelativeIncludeIntoAnotherModuleCounts) {
  write("cli/README.md", "# cli\n\nDepends on: spec reference oracle\n");
  write("cli/options.hpp", "#pragma once\n");
  write("fuzz/README.md", "# fuzz\n\nDepends on: spec\n");
  write("fuzz/fuzz_seed.cpp", "#include \"../cli/options.hpp\"\n#include \"../tests/x.hpp\"\n");
  auto ps = problems();
  ASSERT_EQ(ps.size(), 1u) << all(ps);  // tests/ is not a module
  EXPECT_EQ(ps[0].file, "fuzz/fuzz_seed.cpp");
  EXPECT_NE(ps[0].what.find("may not include cli"), std::string::npos);
  write("fuzz/README.md", "# fuzz\n\nDepends on: spec cli\n");
  ps = problems();
  EXPECT_TRUE(ps.empty()) << all(ps);
}

TEST_F(Layering, MissingLineFails) {
  write("reference/README.md", "# reference\n\nMay include: spec.\n");
  const auto ps = problems();
  ASSERT_EQ(ps.size(), 1u) << all(ps);  // the README's problem stands for the module's includes
  EXPECT_EQ(ps[0].describe().rfind("reference/README.md: no \"Depends on:\" line", 0), 0u);
  EXPECT_NE(ps[0].what.find("(its sources include: spec) (its CMake files link: spec)"),
            std::string::npos)
      << ps[0].what;
}

TEST_F(Layering, MalformedOrRepeatedLineFails) {
  write("reference/README.md", "# reference\n\nDepends on: spec,oracle\n");
  auto ps = problems();
  ASSERT_EQ(ps.size(), 1u) << all(ps);
  EXPECT_EQ(ps[0].file, "reference/README.md");
  EXPECT_EQ(ps[0].line, 3u);
  EXPECT_NE(ps[0].what.find("malformed"), std::string::npos);
  write("reference/README.md", "# reference\n\nDepends on: spec\n");
  for (const char* bad : {"Depends on:", "Depends on: ", "Depends on: spec  oracle",
                          "Depends on: none spec", "Depends on: Spec"}) {
    write("spec/README.md", std::string("# spec\n") + bad + "\n");
    ps = problems();
    EXPECT_TRUE(std::any_of(ps.begin(), ps.end(), [](const Problem& p) {
      return p.file == "spec/README.md";
    })) << bad;
  }
  write("spec/README.md", "# spec\n\nDepends on: none\n\nDepends on: none\n");
  ps = problems();
  ASSERT_EQ(ps.size(), 1u) << all(ps);
  EXPECT_EQ(ps[0].file, "spec/README.md");
  EXPECT_EQ(ps[0].line, 5u);
  EXPECT_NE(ps[0].what.find("second"), std::string::npos);
}

TEST_F(Layering, DiscoveryNeedsReadmeAndIncludeDirOrSources) {
  write("docs/README.md", "# docs\n");                                  // no sources: not a module
  write("scripts/tool.cpp", "#include \"kvo/oracle/x.hpp\"\n");         // no README: not a module
  write("truth/README.md", "# truth\n\nDepends on: spec reference\n");  // include dir only
  fs::create_directories(root_ / "truth/include/kvo/truth");
  write(".hidden/README.md", "# hidden\n");
  write(".hidden/a.cpp", "\n");
  EXPECT_EQ(discover_modules(root_),
            (std::vector<std::string>{"oracle", "reference", "spec", "truth"}));
  EXPECT_TRUE(problems().empty()) << all(problems());
}

// ---- Bare includes ----

TEST_F(Layering, BareIncludeOfAnotherModulesHeaderFails) {
  // python/src/module.cpp reaching cli/case_flags.hpp through the include directory of a cli
  // library it links: allowed by the graph, but the include names no module.
  write("cli/README.md", "# cli\n\nDepends on: spec reference oracle\n");
  write("cli/case_flags.hpp", "#pragma once\n");
  write("python/README.md", "# python\n\nDepends on: spec cli\n");
  write("python/src/module.cpp", "#include <string>\n\n#include \"case_flags.hpp\"\n");
  auto r = check_tree(root_);
  ASSERT_EQ(r.problems.size(), 1u) << all(r.problems);
  EXPECT_EQ(r.problems[0].describe(),
            "python/src/module.cpp:3: #include \"case_flags.hpp\" reaches module cli's "
            "cli/case_flags.hpp through an include path without naming the module: no kvo/cli/ "
            "path reaches it (it is not under cli/include/kvo/cli/): move it there or include it "
            "as \"../../cli/case_flags.hpp\"");
  ASSERT_EQ(r.modules[2].name, "python");  // cli oracle python reference spec
  EXPECT_EQ(r.modules[2].included, (std::set<std::string>{"cli"}));  // it counts for the graph

  // A public header without its kvo/<module>/ prefix, by file name or by a shorter suffix: the
  // fix is the qualified path.
  write("reference/src/numbers.cpp",
        "#include \"kvo/reference/numbers.hpp\"\n#include \"types.hpp\"\n"
        "#include \"spec/types.hpp\"\n");
  r = check_tree(root_);
  ASSERT_EQ(r.problems.size(), 3u) << all(r.problems);
  EXPECT_EQ(r.problems[1].describe(),
            "reference/src/numbers.cpp:2: #include \"types.hpp\" reaches module spec's "
            "spec/include/kvo/spec/types.hpp through an include path without naming the module: "
            "include it as \"kvo/spec/types.hpp\"");
  EXPECT_EQ(r.problems[2].describe(),
            "reference/src/numbers.cpp:3: #include \"spec/types.hpp\" reaches module spec's "
            "spec/include/kvo/spec/types.hpp through an include path without naming the module: "
            "include it as \"kvo/spec/types.hpp\"");
}

TEST_F(Layering, BareIncludeIntoAnUndeclaredModuleAlsoBreaksTheGraph) {
  write("cli/README.md", "# cli\n\nDepends on: spec reference oracle\n");
  write("cli/case_flags.hpp", "#pragma once\n");
  write("oracle/src/check.cpp",
        "#include \"kvo/reference/numbers.hpp\"\n#include \"kvo/spec/types.hpp\"\n"
        "#include \"local.hpp\"\n#include \"case_flags.hpp\"\n");
  const auto ps = problems();
  ASSERT_EQ(ps.size(), 2u) << all(ps);
  EXPECT_EQ(ps[0].describe().rfind(
                "oracle/src/check.cpp:4: #include \"case_flags.hpp\" reaches module cli's", 0),
            0u);
  EXPECT_EQ(ps[1].describe(),
            "oracle/src/check.cpp:4: #include \"case_flags.hpp\": module oracle may not include "
            "cli (oracle/README.md:3: Depends on: reference spec)");
}

TEST_F(Layering, BareIncludesTheProjectUsesPass) {
  write("cli/README.md", "# cli\n\nDepends on: spec reference oracle\n");
  write("cli/case_flags.hpp", "#pragma once\n");
  write("gpu/README.md", "# gpu\n\nDepends on: spec\n");
  write("gpu/src/launch.cuh", "#pragma once\n");
  write("gpu/src/numbers.hpp", "#pragma once\n");  // also reference's name: its own one wins
  write("gpu/testing/src/faults.hpp", "#pragma once\n");
  write("tests/common/helpers.hpp", "#pragma once\n");
  write("gpu/testing/src/faults.cu",
        "#include \"faults.hpp\"\n"           // same folder
        "#include \"launch.cuh\"\n"           // its own private header, through its include path
        "#include \"numbers.hpp\"\n"          // its own, though reference has one too
        "#include \"helpers.hpp\"\n"          // tests/ is not a module
        "#include \"cuda_runtime_api.h\"\n"   // not the project's
        "#include <case_flags.hpp>\n"         // angle brackets: outside libraries' form
        "// #include \"case_flags.hpp\"\n"    // a comment
        "#include \"../src/launch.cuh\"\n");  // relative, inside the module
  const auto ps = problems();
  EXPECT_TRUE(ps.empty()) << all(ps);
}

// ---- The declared graph's cycles ----

TEST(LayeringCycles, AcyclicGraphHasNone) {
  EXPECT_TRUE(find_cycles({}).empty());
  EXPECT_TRUE(find_cycles({{"spec", {}},
                           {"reference", {"spec"}},
                           {"oracle", {"reference", "spec"}},
                           {"cli", {"oracle", "spec"}}})
                  .empty());
  EXPECT_TRUE(find_cycles({{"spec", {"ghost"}}}).empty());  // a name that is no key is no edge
}

TEST(LayeringCycles, EveryCycleIsFoundAndShownFromItsSmallestName) {
  EXPECT_EQ(find_cycles({{"spec", {"spec"}}}), (Cycles{{"spec"}}));
  EXPECT_EQ(find_cycles({{"oracle", {"reference"}},
                         {"reference", {"traces"}},
                         {"traces", {"oracle"}},
                         {"spec", {}}}),
            (Cycles{{"oracle", "reference", "traces"}}));
  // Entered at z (from a), shown from y.
  EXPECT_EQ(find_cycles({{"a", {"z"}}, {"y", {"z"}}, {"z", {"y"}}}), (Cycles{{"y", "z"}}));
  // Two cycles through b, one per back edge.
  EXPECT_EQ(find_cycles({{"a", {"b"}}, {"b", {"a", "c"}}, {"c", {"b"}}}),
            (Cycles{{"a", "b"}, {"b", "c"}}));
}

TEST_F(Layering, CyclicDeclaredGraphFailsAtTheReadme) {
  write("spec/README.md", "# spec\n\nDepends on: oracle\n");
  auto ps = problems();
  ASSERT_EQ(ps.size(), 1u) << all(ps);
  EXPECT_EQ(ps[0].describe(),
            "oracle/README.md:3: the declared module graph has a cycle: oracle -> reference -> "
            "spec -> oracle (each module's \"Depends on:\" line names the next); the layering "
            "must be one-way, so one of these dependencies has to go");
  write("spec/README.md", "# spec\n\nDepends on: none\n");
  write("reference/README.md", "# reference\n\nDepends on: spec reference\n");
  ps = problems();
  ASSERT_EQ(ps.size(), 1u) << all(ps);
  EXPECT_EQ(ps[0].describe().rfind(
                "reference/README.md:3: the declared module graph has a cycle: reference -> "
                "reference (",
                0),
            0u);
}

// ---- CMake links ----

TEST_F(Layering, CMakeLinkToAForbiddenModuleFails) {
  write("oracle/CMakeLists.txt",
        "add_library(kvo_oracle STATIC src/check.cpp)\n"
        "add_library(oracle_alias ALIAS kvo_oracle)\n");
  write("reference/CMakeLists.txt",
        "add_library(kvo_reference STATIC src/numbers.cpp)\n"
        "# target_link_libraries(kvo_reference PUBLIC kvo_oracle)\n"  // a comment
        "if(TARGET kvo_oracle)\n"                                     // not a link
        "  message(STATUS \"kvo_oracle is here\")\n"
        "endif()\n"
        "target_link_libraries(kvo_reference PUBLIC kvo_spec\n"
        "                      PRIVATE $<BUILD_INTERFACE:kvo_oracle>)\n"
        "add_library(kvo_reference_extra INTERFACE)\n"
        "TARGET_LINK_LIBRARIES(kvo_reference_extra INTERFACE kvoracle::oracle)\n"
        "target_link_libraries(kvo_reference_extra INTERFACE oracle_alias kvo_reference)\n");
  const auto r = check_tree(root_);
  ASSERT_EQ(r.problems.size(), 3u) << all(r.problems);
  EXPECT_EQ(r.problems[0].describe(),
            "reference/CMakeLists.txt:7: target kvo_reference links kvo_oracle (module oracle): "
            "module reference may not link oracle (reference/README.md:3: Depends on: spec)");
  EXPECT_EQ(r.problems[1].file, "reference/CMakeLists.txt");
  EXPECT_EQ(r.problems[1].line, 9u);
  EXPECT_EQ(r.problems[1].what.rfind(
                "target kvo_reference_extra links kvoracle::oracle (module oracle): ", 0),
            0u);
  EXPECT_EQ(r.problems[2].line, 10u);
  EXPECT_EQ(r.problems[2].what.rfind("target kvo_reference_extra links oracle_alias (module "
                                     "oracle): module reference may not link oracle",
                                     0),
            0u);
  ASSERT_EQ(r.modules[1].name, "reference");
  EXPECT_EQ(r.modules[1].linked, (std::set<std::string>{"oracle", "spec"}));
}

TEST_F(Layering, CMakeLinkThroughAVariableFailsWhereTheLibraryIsNamed) {
  write("reference/CMakeLists.txt",
        "add_library(kvo_reference STATIC src/numbers.cpp)\n"
        "set(REF_LIBS_core kvo_spec)\n"
        "set(REF_LIBS_extra kvo_spec\n"
        "    kvo_oracle)\n"
        "foreach(part core extra)\n"
        "  target_link_libraries(kvo_reference PRIVATE ${REF_LIBS_${part}})\n"
        "endforeach()\n"
        "list(APPEND REF_MORE kvo_oracle)\n"
        "target_link_libraries(kvo_reference PRIVATE \"${REF_MORE}\")\n"
        "set(REF_SOURCES kvo_oracle.cpp)\n");  // never linked
  const auto ps = problems();
  ASSERT_EQ(ps.size(), 2u) << all(ps);
  EXPECT_EQ(ps[0].describe(),
            "reference/CMakeLists.txt:4: target kvo_reference links kvo_oracle (module oracle) "
            "through ${REF_LIBS_${part}}, linked at reference/CMakeLists.txt:6: module reference "
            "may not link oracle (reference/README.md:3: Depends on: spec)");
  EXPECT_EQ(ps[1].describe(),
            "reference/CMakeLists.txt:8: target kvo_reference links kvo_oracle (module oracle) "
            "through ${REF_MORE}, linked at reference/CMakeLists.txt:9: module reference may not "
            "link oracle (reference/README.md:3: Depends on: spec)");
}

TEST_F(Layering, CMakeLinkThroughAFunctionsArgumentsFailsAtTheCall) {
  // A helper of the root cmake/ folder (not a module), as kvo_add_test, and one of the module's
  // own, as bench's kvo_cpu_bench.
  write("cmake/Helpers.cmake",
        "function(kvo_add_thing name)\n"
        "  cmake_parse_arguments(ARG \"\" \"TIMEOUT\" \"SOURCES;LIBS\" ${ARGN})\n"
        "  add_executable(${name} ${ARG_SOURCES})\n"
        "  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest)\n"
        "endfunction()\n");
  write("reference/CMakeLists.txt",
        "add_library(kvo_reference STATIC src/numbers.cpp)\n"
        "target_link_libraries(kvo_reference PUBLIC kvo_spec)\n"
        "function(ref_tool name library)\n"
        "  add_executable(tool_${name} tool.cpp)\n"
        "  target_link_libraries(tool_${name} PRIVATE ${library} kvo_spec)\n"
        "endfunction()\n"
        "ref_tool(fine kvo_spec)\n"
        "ref_tool(bad kvo_oracle)\n");
  write("reference/tests.cmake",
        "kvo_add_thing(test_fine SOURCES kvo_oracle LIBS kvo_spec)\n"  // SOURCES is not linked
        "kvo_add_thing(test_bad SOURCES a.cpp LIBS kvo_spec\n"
        "              kvo_oracle TIMEOUT 60)\n");
  const auto ps = problems();
  ASSERT_EQ(ps.size(), 2u) << all(ps);
  EXPECT_EQ(ps[0].describe(),
            "reference/CMakeLists.txt:8: target tool_bad links kvo_oracle (module oracle) through "
            "ref_tool()'s library, linked at reference/CMakeLists.txt:5: module reference may not "
            "link oracle (reference/README.md:3: Depends on: spec)");
  EXPECT_EQ(ps[1].describe(),
            "reference/tests.cmake:3: target test_bad links kvo_oracle (module oracle) through "
            "kvo_add_thing()'s ARG_LIBS, linked at cmake/Helpers.cmake:4: module reference may "
            "not link oracle (reference/README.md:3: Depends on: spec)");
}

TEST(LayeringCMakeParser, CommentsBracketsQuotesAndLines) {
  const auto cmds = parse_cmake(
      "# a comment(\n"
      "#[[ a bracket comment\ntarget_link_libraries(x y)\n]]\n"
      "ADD_LIBRARY(kvo_x STATIC a.cpp) # trailing\n"
      "set(V \"one two\n three\" [=[four]=] five\\ six)\n"
      "if((A AND B) OR C)\n");
  ASSERT_EQ(cmds.size(), 3u);
  EXPECT_EQ(cmds[0].name, "add_library");
  EXPECT_EQ(cmds[0].line, 5u);
  ASSERT_EQ(cmds[0].args.size(), 3u);
  EXPECT_EQ(cmds[0].args[2].text, "a.cpp");
  EXPECT_EQ(cmds[1].name, "set");
  ASSERT_EQ(cmds[1].args.size(), 4u);
  EXPECT_EQ(cmds[1].args[1].text, "one two\n three");
  EXPECT_EQ(cmds[1].args[1].line, 6u);
  EXPECT_EQ(cmds[1].args[2].text, "four");
  EXPECT_EQ(cmds[1].args[2].line, 7u);
  EXPECT_EQ(cmds[1].args[3].text, "five\\ six");
  EXPECT_EQ(cmds[2].line, 8u);
  EXPECT_EQ(cmds[2].args.size(), 5u);  // the inner parentheses dropped
}

}  // namespace
