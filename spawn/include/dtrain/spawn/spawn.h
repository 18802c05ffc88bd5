#pragma once
// Starting a child process: the one fork/exec shared by the launcher
// (apps/dtrain/process.cc) and the benchmarks (bench/process.cc); the
// dtrain::spawn library (spawn/).

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace dtrain::launch {

struct SpawnOptions {
  std::vector<std::string> argv;           // argv[0] is looked up in PATH unless program is set
  std::string program;                     // when set: the file to execute (no PATH search)
  std::map<std::string, std::string> env;  // added to the parent's environment, overriding
  int stdout_fd = -1;                      // -1: inherited
  int stderr_fd = -1;                      // -1: inherited
  bool stdin_null = false;                 // stdin from /dev/null
  bool own_process_group = false;          // the child leads a new process group
};

// fork + exec. The child gets PR_SET_PDEATHSIG(SIGKILL): it dies with the
// calling thread, even when the parent is killed with SIGKILL. It starts with
// an empty signal mask and the default SIGPIPE action. Everything is prepared
// before fork, so a process with threads may call it. Throws IoError when fork
// fails; a failed exec writes "<parent>: cannot start PROGRAM: why" to the
// child's stderr and exits 127.
pid_t spawn(const SpawnOptions& options);

}  // namespace dtrain::launch
