#include "program.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>

#include "dtrain/error.h"
#include "dtrain/log.h"

namespace dtrain::launch {

namespace fs = std::filesystem;

namespace {

std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  char self[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    fs::path sibling = fs::path(std::string(self, static_cast<size_t>(n))).parent_path() / program;
    if (fs::exists(sibling)) return sibling.string();
  }
  return program;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

std::string default_python() {
#ifdef DTRAIN_BUILT_PYTHON
  return DTRAIN_BUILT_PYTHON;
#else
  return "python3";
#endif
}

std::vector<std::string> program_command(std::vector<std::string> command, const ProgramOptions& o,
                                         std::string* python) {
  python->clear();
  if (command.empty()) return command;
  if (o.module && o.no_python)
    throw InvalidUsage("-m runs a Python module and --no_python runs no interpreter: give one of them");
  if (!o.module && (o.no_python || !ends_with(command[0], ".py"))) {
    command[0] = resolve_program(command[0]);
    return command;
  }
  *python = o.python;
  if (python->empty())
    if (const char* env = std::getenv("DTRAIN_PYTHON"); env && *env) *python = env;
  if (python->empty()) *python = default_python();
  if (!o.module && !fs::exists(command[0]))
    throw InvalidUsage("cannot start " + command[0] + ": no such file (a .py program runs as `" + *python + " -u " +
                       command[0] + "`)");
  std::vector<std::string> head = {*python, "-u"};
  if (o.module) head.push_back("-m");
  command.insert(command.begin(), head.begin(), head.end());
  return command;
}

std::string core_library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&core_version), &info) == 0 || !info.dli_fname) return "";
  return fs::path(info.dli_fname).parent_path().string();
}

std::string python_package_dir() {
  const std::string lib = core_library_dir();
  if (lib.empty()) return "";
  auto dir = fs::path(lib) / "dtrain" / "python";
  return fs::exists(dir / "dtrain" / "__init__.py") ? dir.string() : "";
}

}  // namespace dtrain::launch
