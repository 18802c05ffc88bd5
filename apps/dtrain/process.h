#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dtrain/spawn/spawn.h"

namespace dtrain::launch {

// One child process of the launcher. Its stdout and stderr go to one pipe that
// the launcher drains into the log file (and the console, for rank 0).
//
// Lifetime: the child gets PR_SET_PDEATHSIG(SIGKILL), so it dies with the
// launcher even when the launcher is killed with SIGKILL; it runs in its own
// process group so that terminate()/kill() reach what it started too.
// Not thread-safe: owned by the launcher's main thread, which must also be the
// thread that called start() (the death signal is tied to that thread).
class Process {
 public:
  Process() = default;
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Starts argv[0] (looked up in PATH when it has no '/') with the current
  // environment plus env. Throws IoError when fork/pipe fail; a failed exec
  // shows up as exit code 127 with the reason in the log.
  void start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
             const std::string& log_path);

  // Reads what the child wrote since the last call, appends it to the log and
  // returns it. Non-blocking.
  std::string drain();
  int output_fd() const { return out_fd_; }

  // Reaps the child if it has exited (non-blocking). True once it has.
  bool poll_exit();
  bool running() const { return pid_ > 0 && !exited_; }
  bool exited() const { return exited_; }
  int pid() const { return pid_; }
  // Exit description: "exit code 3", "signal SIGKILL", or "exit code 0".
  std::string status_text() const;
  bool succeeded() const { return exited_ && exit_code_ == 0 && term_signal_ == 0; }
  int exit_code() const { return exit_code_; }
  int term_signal() const { return term_signal_; }
  int64_t exit_time_ms() const { return exit_time_ms_; }

  void signal(int sig);  // to the child's process group
  const std::string& log_path() const { return log_path_; }
  // The last n lines of the log.
  std::string log_tail(int n) const;

 private:
  int pid_ = -1;
  int out_fd_ = -1;
  int log_fd_ = -1;
  bool exited_ = false;
  int exit_code_ = 0;
  int term_signal_ = 0;
  int64_t exit_time_ms_ = 0;
  std::string log_path_;
};

std::string signal_name(int sig);
int64_t unix_ms();

}  // namespace dtrain::launch
