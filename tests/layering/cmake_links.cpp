// Rule 4 of the layering check (layering.hpp): CMake files parsed into commands, what the whole
// tree's CMake files define (libraries, aliases, functions, variables) learned, and each module's
// target_link_libraries items traced back to the modules that define them.
#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "layering.hpp"
#include "layering_internal.hpp"

namespace kvo::layering {
namespace fs = std::filesystem;
using detail::files_under;
using detail::may_not;
using detail::rel_path;
namespace {

bool is_cmake(const fs::path& p) {
  return p.filename() == "CMakeLists.txt" || p.extension() == ".cmake";
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct CMakeFile {
  std::string rel;     ///< root-relative
  std::string module;  ///< "" for the root cmake/ folder (functions and aliases only)
  std::vector<CMakeCommand> commands;
};

/// A target_link_libraries command inside a function or macro body.
struct LinkUse {
  std::string target;
  std::vector<CMakeArg> items;
  std::string file;
  std::size_t line = 0;
};

/// A function or macro definition: enough to map its link items back to a call's arguments.
struct Function {
  std::vector<std::string> params;
  std::string prefix;                    ///< cmake_parse_arguments' prefix, "" without one
  std::set<std::string> keywords;        ///< all of cmake_parse_arguments' keywords
  std::set<std::string> value_keywords;  ///< those that take values
  std::vector<LinkUse> links;
};

/// A value a variable is given (set, list APPEND) and where.
struct VarValue {
  CMakeArg arg;
  std::string file;
};

struct Refs {
  std::vector<std::string> names;  ///< plain words, generator expressions opened
  std::vector<std::string> vars;   ///< the insides of top-level ${...}, as written
};

/// The words of one argument and the variables it references. Generator expressions are opened
/// ($<BUILD_INTERFACE:kvo_x> names kvo_x); $ENV{} and $CACHE{} are dropped; "::" stays inside a
/// word (kvoracle::oracle), a single ':' or ';' separates.
Refs refs_in(const std::string& s) {
  Refs r;
  std::string rest;
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] == '$') {
      std::size_t j = i + 1;
      while (j < s.size() && std::isalpha(static_cast<unsigned char>(s[j]))) ++j;
      if (j < s.size() && s[j] == '{') {
        std::size_t k = j, depth = 0;
        for (; k < s.size(); ++k) {
          if (s[k] == '{') ++depth;
          if (s[k] == '}' && --depth == 0) break;
        }
        if (j == i + 1) r.vars.push_back(s.substr(j + 1, k - j - 1));
        rest += ' ';
        i = std::min(k + 1, s.size());
        continue;
      }
    }
    rest += s[i++];
  }
  const auto word_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '+' ||
           c == '-';
  };
  for (std::size_t i = 0; i < rest.size();) {
    if (!word_char(rest[i])) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < rest.size()) {
      if (word_char(rest[j])) {
        ++j;
      } else if (rest.compare(j, 2, "::") == 0 && j + 2 < rest.size() && word_char(rest[j + 2])) {
        j += 2;
      } else {
        break;
      }
    }
    r.names.push_back(rest.substr(i, j - i));
    i = j;
  }
  return r;
}

/// A variable reference as a name pattern: nested references become '*'
/// (KVO_FUZZ_LIBS_${name} matches every KVO_FUZZ_LIBS_<target>).
std::string var_pattern(const std::string& ref) {
  std::string out;
  for (std::size_t i = 0; i < ref.size();) {
    if (ref.compare(i, 2, "${") == 0) {
      std::size_t k = i + 1, depth = 0;
      for (; k < ref.size(); ++k) {
        if (ref[k] == '{') ++depth;
        if (ref[k] == '}' && --depth == 0) break;
      }
      out += '*';
      i = std::min(k + 1, ref.size());
    } else {
      out += ref[i++];
    }
  }
  return out;
}

bool glob_match(const std::string& pattern, const std::string& name) {
  std::size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string item; std::getline(in, item, ';');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool is_link_keyword(const std::string& s) {
  static const std::set<std::string> kKeywords{
      "PUBLIC", "PRIVATE",   "INTERFACE", "LINK_PUBLIC", "LINK_PRIVATE", "LINK_INTERFACE_LIBRARIES",
      "debug",  "optimized", "general"};
  return kKeywords.count(s) > 0;
}

/// What the CMake files of the whole tree define: which module owns each library, the aliases,
/// the functions, and each module's variables.
struct CMakeWorld {
  std::map<std::string, std::string> owner;  ///< library -> module
  std::map<std::string, std::string> alias;  ///< ALIAS name -> target
  std::map<std::string, Function> functions;
  std::map<std::string, std::map<std::string, std::vector<VarValue>>> vars;  ///< module -> var

  std::string owner_of(std::string lib) const {
    for (int hops = 0; hops < 8 && alias.count(lib); ++hops) lib = alias.at(lib);
    if (const auto it = owner.find(lib); it != owner.end()) return it->second;
    // kvoracle::<name> is kvo_<name> (cmake/KvoPackage.cmake, whose ALIAS lines are written
    // through a foreach and so are not read here).
    if (lib.starts_with("kvoracle::")) {
      if (const auto it = owner.find("kvo_" + lib.substr(10)); it != owner.end()) return it->second;
    }
    return "";
  }

  /// The values of the variables a reference may mean, in `module`'s CMake files.
  std::vector<VarValue> values_of(const std::string& module, const std::string& ref) const {
    std::vector<VarValue> out;
    const auto mv = vars.find(module);
    if (mv == vars.end()) return out;
    const std::string pattern = var_pattern(ref);
    for (const auto& [name, values] : mv->second) {
      if (glob_match(pattern, name)) out.insert(out.end(), values.begin(), values.end());
    }
    return out;
  }
};

void learn(const CMakeFile& file, CMakeWorld& w) {
  Function* current = nullptr;
  for (const CMakeCommand& c : file.commands) {
    const auto& a = c.args;
    if (c.name == "add_library" && !a.empty() && a[0].text.find('$') == std::string::npos) {
      if (a.size() >= 3 && a[1].text == "ALIAS") {
        w.alias.emplace(a[0].text, a[2].text);
      } else if (!file.module.empty()) {
        w.owner.emplace(a[0].text, file.module);
      }
    } else if ((c.name == "function" || c.name == "macro") && !a.empty()) {
      std::string name = a[0].text;
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char ch) { return std::tolower(ch); });
      current = &w.functions[name];
      *current = Function{};
      for (std::size_t i = 1; i < a.size(); ++i) current->params.push_back(a[i].text);
    } else if (c.name == "endfunction" || c.name == "endmacro") {
      current = nullptr;
    } else if (c.name == "cmake_parse_arguments" && current != nullptr) {
      const std::size_t at = !a.empty() && a[0].text == "PARSE_ARGV" ? 2 : 0;
      if (a.size() < at + 4) continue;
      current->prefix = a[at].text;
      for (std::size_t k = 1; k <= 3; ++k) {
        for (const std::string& kw : split_list(a[at + k].text)) {
          current->keywords.insert(kw);
          if (k > 1) current->value_keywords.insert(kw);
        }
      }
    } else if (c.name == "target_link_libraries" && current != nullptr && !a.empty()) {
      current->links.push_back({a[0].text, {a.begin() + 1, a.end()}, file.rel, c.line});
    } else if ((c.name == "set" || c.name == "list") && !file.module.empty() && !a.empty()) {
      std::size_t first = 1;
      if (c.name == "list") {
        if (a.size() < 2 || (a[0].text != "APPEND" && a[0].text != "PREPEND")) continue;
        first = 2;
      }
      auto& values = w.vars[file.module][a[first - 1].text];
      for (std::size_t i = first; i < a.size(); ++i) {
        if (c.name == "set" && (a[i].text == "CACHE" || a[i].text == "PARENT_SCOPE")) break;
        values.push_back({a[i], file.rel});
      }
    }
  }
}

/// The call arguments a reference inside `f`'s body stands for, and whether it is one of `f`'s
/// parameters at all (a positional one, ARGN, ARGV<n> or a cmake_parse_arguments keyword).
bool param_values(const Function& f, const std::string& ref, const std::vector<CMakeArg>& call,
                  std::vector<CMakeArg>& out) {
  const std::size_t n = f.params.size();
  if (const auto it = std::find(f.params.begin(), f.params.end(), ref); it != f.params.end()) {
    const std::size_t i = static_cast<std::size_t>(it - f.params.begin());
    if (i < call.size()) out.push_back(call[i]);
    return true;
  }
  if (ref == "ARGN") {
    if (call.size() > n) out.insert(out.end(), call.begin() + n, call.end());
    return true;
  }
  if (ref.starts_with("ARGV") && ref.size() > 4 &&
      std::all_of(ref.begin() + 4, ref.end(), [](unsigned char ch) { return std::isdigit(ch); })) {
    const std::size_t i = std::stoul(ref.substr(4));
    if (i < call.size()) out.push_back(call[i]);
    return true;
  }
  if (f.prefix.empty() || !ref.starts_with(f.prefix + "_")) return false;
  const std::string kw = ref.substr(f.prefix.size() + 1);
  if (!f.value_keywords.count(kw)) return false;
  bool in = false;
  for (std::size_t i = n; i < call.size(); ++i) {
    if (f.keywords.count(call[i].text)) {
      in = call[i].text == kw;
    } else if (in) {
      out.push_back(call[i]);
    }
  }
  return true;
}

bool is_param(const Function& f, const std::string& ref) {
  std::vector<CMakeArg> ignored;
  return param_values(f, ref, {}, ignored);
}

/// `target` with `f`'s positional parameters replaced by a call's arguments (bench_${name} ->
/// bench_traces), so that the report names the target the call makes.
std::string substitute(std::string target, const Function& f, const std::vector<CMakeArg>& call) {
  for (std::size_t i = 0; i < f.params.size() && i < call.size(); ++i) {
    const std::string ref = "${" + f.params[i] + "}";
    for (std::size_t at = 0; (at = target.find(ref, at)) != std::string::npos;) {
      target.replace(at, ref.size(), call[i].text);
      at += call[i].text.size();
    }
  }
  return target;
}

/// Checks every link `m`'s CMake files make against its Depends on: line.
void check_links(const CMakeWorld& w, const std::vector<const CMakeFile*>& files, Module& m,
                 std::vector<Problem>& problems) {
  std::set<std::tuple<std::string, std::size_t, std::string>> seen;
  // One library named at file:line, linked to `target`; `via` says how, when not literally.
  const auto use = [&](const std::string& lib, const std::string& file, std::size_t line,
                       const std::string& target, const std::string& via) {
    const std::string other = w.owner_of(lib);
    if (other.empty() || other == m.name) return;
    m.linked.insert(other);
    // Without a valid line, the README's own problem stands for every link.
    if (!m.declared || m.depends.count(other)) return;
    if (!seen.insert({file, line, lib}).second) return;  // one set() line, several link lines
    problems.push_back({file, line,
                        "target " + target + " links " + lib + " (module " + other + ")" + via +
                            ": " + may_not(m, "link", other)});
  };
  // The libraries an argument names, directly and through the module's variables.
  const auto use_arg = [&](const CMakeArg& arg, const std::string& file, const std::string& target,
                           const std::string& via, const Function* enclosing) {
    const Refs r = refs_in(arg.text);
    for (const std::string& lib : r.names) use(lib, file, arg.line, target, via);
    for (const std::string& ref : r.vars) {
      if (enclosing != nullptr && is_param(*enclosing, ref)) continue;  // judged at each call
      for (const VarValue& v : w.values_of(m.name, ref)) {
        for (const std::string& lib : refs_in(v.arg.text).names) {
          use(lib, v.file, v.arg.line, target,
              " through ${" + ref + "}" +
                  (via.empty() ? ", linked at " + file + ":" + std::to_string(arg.line) : via));
        }
      }
    }
  };
  for (const CMakeFile* f : files) {
    const Function* enclosing = nullptr;
    for (const CMakeCommand& c : f->commands) {
      if ((c.name == "function" || c.name == "macro") && !c.args.empty()) {
        std::string name = c.args[0].text;
        std::transform(name.begin(), name.end(), name.begin(),
                       [](unsigned char ch) { return std::tolower(ch); });
        const auto it = w.functions.find(name);
        enclosing = it == w.functions.end() ? nullptr : &it->second;
      } else if (c.name == "endfunction" || c.name == "endmacro") {
        enclosing = nullptr;
      } else if (c.name == "target_link_libraries" && !c.args.empty()) {
        for (std::size_t i = 1; i < c.args.size(); ++i) {
          if (is_link_keyword(c.args[i].text)) continue;
          use_arg(c.args[i], f->rel, c.args[0].text, "", enclosing);
        }
      } else if (const auto it = w.functions.find(c.name); it != w.functions.end()) {
        // A call: each link in the function's body, with the call's arguments put in.
        const Function& fn = it->second;
        for (const LinkUse& link : fn.links) {
          const std::string target = substitute(link.target, fn, c.args);
          for (const CMakeArg& item : link.items) {
            for (const std::string& ref : refs_in(item.text).vars) {
              std::vector<CMakeArg> values;
              if (!param_values(fn, ref, c.args, values)) continue;
              const std::string via = " through " + c.name + "()'s " + ref + ", linked at " +
                                      link.file + ":" + std::to_string(link.line);
              for (const CMakeArg& v : values) {
                if (!is_link_keyword(v.text)) use_arg(v, f->rel, target, via, nullptr);
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

std::vector<CMakeCommand> parse_cmake(const std::string& s) {
  constexpr std::size_t npos = std::string::npos;
  std::vector<CMakeCommand> out;
  std::size_t i = 0, line = 1;
  const auto advance = [&](std::size_t n) {
    for (; n > 0 && i < s.size(); --n, ++i) {
      if (s[i] == '\n') ++line;
    }
  };
  // "[", "="*, "[" at `at`: the number of '=', npos when not a bracket opening.
  const auto bracket_level = [&](std::size_t at) -> std::size_t {
    if (at >= s.size() || s[at] != '[') return npos;
    std::size_t j = at + 1;
    while (j < s.size() && s[j] == '=') ++j;
    return j < s.size() && s[j] == '[' ? j - at - 1 : npos;
  };
  const auto read_bracket = [&](std::size_t level) {  // at the opening; returns the contents
    const std::string close = "]" + std::string(level, '=') + "]";
    advance(level + 2);
    const std::size_t end = s.find(close, i);
    const std::size_t stop = end == npos ? s.size() : end;
    std::string body = s.substr(i, stop - i);
    advance(stop - i + (end == npos ? 0 : close.size()));
    return body;
  };
  const auto skip_comment = [&] {  // at the '#'
    advance(1);
    if (const std::size_t level = bracket_level(i); level != npos) {
      read_bracket(level);
      return;
    }
    while (i < s.size() && s[i] != '\n') advance(1);
  };
  const auto read_quoted = [&] {  // at the opening '"'; escapes kept as written
    std::string text;
    advance(1);
    while (i < s.size() && s[i] != '"') {
      if (s[i] == '\\' && i + 1 < s.size()) {
        text += s[i];
        advance(1);
      }
      text += s[i];
      advance(1);
    }
    advance(1);
    return text;
  };
  const auto is_ident = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  };
  while (i < s.size()) {
    if (s[i] == '#') {
      skip_comment();
      continue;
    }
    if (!is_ident(s[i])) {
      advance(1);
      continue;
    }
    const std::size_t start = i, cmd_line = line;
    while (i < s.size() && is_ident(s[i])) advance(1);
    CMakeCommand cmd{s.substr(start, i - start), cmd_line, {}};
    std::transform(cmd.name.begin(), cmd.name.end(), cmd.name.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) advance(1);
    if (i >= s.size() || s[i] != '(') continue;  // not a command invocation
    advance(1);
    for (int depth = 1; i < s.size() && depth > 0;) {
      const char c = s[i];
      if (c == '(' || c == ')') {
        depth += c == '(' ? 1 : -1;
        advance(1);
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        advance(1);
      } else if (c == '#') {
        skip_comment();
      } else if (c == '"') {
        const std::size_t at = line;
        cmd.args.push_back({read_quoted(), at});
      } else if (const std::size_t level = bracket_level(i); level != npos) {
        const std::size_t at = line;
        cmd.args.push_back({read_bracket(level), at});
      } else {
        // Unquoted: up to whitespace, a parenthesis or '#'; a '"' inside (-Da="b c", legacy)
        // quotes a stretch of it.
        CMakeArg arg{"", line};
        while (i < s.size()) {
          const char d = s[i];
          if (std::isspace(static_cast<unsigned char>(d)) || d == '(' || d == ')' || d == '#') {
            break;
          }
          if (d == '"') {
            arg.text += '"' + read_quoted() + '"';
            continue;
          }
          if (d == '\\' && i + 1 < s.size()) {
            arg.text += d;
            advance(1);
          }
          arg.text += s[i];
          advance(1);
        }
        cmd.args.push_back(std::move(arg));
      }
    }
    out.push_back(std::move(cmd));
  }
  return out;
}

namespace detail {

void check_cmake_links(const fs::path& root, std::vector<Module>& modules,
                       std::vector<Problem>& problems) {
  // The root cmake/ folder (not a module) lends its functions (kvo_add_test) and aliases.
  std::vector<CMakeFile> cmake;
  for (const Module& m : modules) {
    for (const fs::path& f : files_under(root / m.name, is_cmake)) {
      cmake.push_back({rel_path(f, root), m.name, parse_cmake(read_text(f))});
    }
  }
  const bool cmake_is_module = std::any_of(modules.begin(), modules.end(),
                                           [](const Module& m) { return m.name == "cmake"; });
  if (!cmake_is_module) {
    for (const fs::path& f : files_under(root / "cmake", is_cmake)) {
      cmake.push_back({rel_path(f, root), "", parse_cmake(read_text(f))});
    }
  }
  CMakeWorld world;
  for (const CMakeFile& f : cmake) learn(f, world);
  for (Module& m : modules) {
    std::vector<const CMakeFile*> own;
    for (const CMakeFile& f : cmake) {
      if (f.module == m.name) own.push_back(&f);
    }
    check_links(world, own, m, problems);
  }
}

}  // namespace detail

}  // namespace kvo::layering
