#include "dtrain/spawn/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstring>

#include "dtrain/error.h"

extern char** environ;

namespace dtrain::launch {

pid_t spawn(const SpawnOptions& o) {
  // Everything the child needs is prepared before fork: no allocation after it.
  std::vector<std::string> env_strings;
  for (char** e = environ; e && *e; ++e) {
    std::string entry = *e;
    auto eq = entry.find('=');
    if (eq != std::string::npos && o.env.count(entry.substr(0, eq))) continue;
    env_strings.push_back(std::move(entry));
  }
  for (const auto& [k, v] : o.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = o.argv;
  if (argv_copy.empty()) argv_copy.push_back(o.program);
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);
  const char* program = o.program.empty() ? args[0] : o.program.c_str();
  pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) throw IoError(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    if (o.own_process_group) setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(128 + SIGKILL);  // the parent died before prctl
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    if (o.stdout_fd >= 0) dup2(o.stdout_fd, 1);
    if (o.stderr_fd >= 0) dup2(o.stderr_fd, 2);
    if (o.stdin_null) {
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, 0);
    }
    if (o.program.empty())
      execvpe(program, args.data(), envp.data());
    else
      execve(program, args.data(), envp.data());
    const char* msg = ": cannot start ";
    (void)!write(2, program_invocation_short_name, std::strlen(program_invocation_short_name));
    (void)!write(2, msg, std::strlen(msg));
    (void)!write(2, program, std::strlen(program));
    (void)!write(2, ": ", 2);
    const char* why = std::strerror(errno);
    (void)!write(2, why, std::strlen(why));
    (void)!write(2, "\n", 1);
    _exit(127);
  }
  if (o.own_process_group) setpgid(pid, pid);
  return pid;
}

}  // namespace dtrain::launch
