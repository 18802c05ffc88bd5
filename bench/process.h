#pragma once
// Child processes for the benchmarks: start, wait with a time limit, and never
// leave orphans (children die with SIGKILL when the parent dies, and a failing
// or overdue child takes the others down with it).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::bench {

struct Child {
  pid_t pid = -1;
  std::string name;  // "rank 1", "mpirun"
};

// Path of the running executable (/proc/self/exe).
std::string self_exe();
// Directory part of a path ("/a/b/c" -> "/a/b").
std::string dir_of(const std::string& path);
// First executable `name` on $PATH, or "" when there is none.
std::string find_in_path(const std::string& name);

// fork + execv(path, argv) with the parent's environment plus extra_env
// ("KEY=value", overriding). The child gets PR_SET_PDEATHSIG=SIGKILL. When
// stdout_fd >= 0 it becomes the child's stdout. Throws IoError on failure.
pid_t spawn(const std::string& path, const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
            int stdout_fd = -1);

// A benchmark's worker processes (this program with --worker MODE): the
// arguments of rank r that every such benchmark passes.
std::vector<std::string> worker_argv(const std::string& mode, int rank, int world, int port, int64_t steps,
                                     int64_t warmup, int threads);
// Starts rank r of `bench`'s workers (DTRAIN_LOG_LEVEL=warn), its output in
// /tmp/dtrain-bench-<bench>.<pid>.<r>.out, whose path is appended to outs.
Child spawn_rank(const std::string& bench, int rank, const std::vector<std::string>& argv,
                 std::vector<std::string>& outs);

// Installs SIGINT/SIGTERM handlers that make wait_all/run_capture stop their
// children and return; the parent then exits non-zero.
void install_interrupt_handlers();
bool interrupted();

// Waits for every child. Returns "" when all exited with status 0; otherwise
// kills the rest (SIGKILL), reaps them and returns one line naming the first
// failure (exit code, signal, time limit or interrupt).
std::string wait_all(std::vector<Child>& kids, std::chrono::seconds limit);

// Runs a program to completion, collecting its stdout (stderr passes through).
// On the time limit or an interrupt it sends SIGTERM, then SIGKILL after a grace.
struct Captured {
  std::string out;
  std::string failure;  // "" on exit status 0
};
Captured run_capture(const std::string& path, const std::vector<std::string>& argv,
                     const std::vector<std::string>& extra_env, std::chrono::seconds limit);

}  // namespace dtrain::bench
