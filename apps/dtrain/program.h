#pragma once
// What the launcher starts: the user's program as a command line. A Python
// program (PROGRAM.py, or -m MODULE) is, for the launcher, only "run with
// this interpreter"; its variables come from environment.h like any other's.

#include <string>
#include <vector>

namespace dtrain::launch {

struct ProgramOptions {
  std::string python;      // --python; empty: DTRAIN_PYTHON, else default_python()
  bool module = false;     // -m: command[0] is a module name (python -m)
  bool no_python = false;  // --no_python: run command[0] as it is, even a .py
};

// The interpreter dtrain's Python package was built for (found at configure
// time: the first python3 whose torch matches the libtorch of the build),
// else "python3".
std::string default_python();

// The command line for `dtrain ... PROGRAM ARGS`: a bare program name is
// looked up next to dtrain, then in PATH; a .py program (unless no_python) or
// a module runs as `PYTHON -u PROGRAM ARGS` / `PYTHON -u -m MODULE ARGS`,
// and *python is set to the interpreter (left empty otherwise). Throws
// InvalidUsage for -m with --no_python.
std::vector<std::string> program_command(std::vector<std::string> command, const ProgramOptions& o,
                                         std::string* python);

// The folder of the libdtrain_core this dtrain runs on (build/lib, or the
// install's lib folder): what the launcher gives the processes lies beside it.
std::string core_library_dir();

// The folder holding dtrain's Python package (`import dtrain`), next to
// libdtrain_core: build/lib/dtrain/python, or <prefix>/lib/dtrain/python
// installed. "" when the package was not built.
std::string python_package_dir();

}  // namespace dtrain::launch
