// The layering check itself, on small trees written to a temporary folder: a clean tree passes; a
// planted include across the graph, a missing, malformed or repeated "Depends on:" line each fail
// with the file and line; what is not a module or not a source is left alone.
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
using kvo::layering::Problem;

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
  EXPECT_NE(ps[0].what.find("(its sources include: spec)"), std::string::npos) << ps[0].what;
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

}  // namespace
