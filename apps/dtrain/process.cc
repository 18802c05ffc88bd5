#include "process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>

#include "dtrain/error.h"

namespace dtrain::launch {

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

Process::~Process() {
  if (running()) {
    signal(SIGKILL);
    int st = 0;
    waitpid(pid_, &st, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (log_fd_ >= 0) close(log_fd_);
}

void Process::start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                    const std::string& log_path) {
  log_path_ = log_path;
  log_fd_ = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd_ < 0) throw IoError("cannot open log file " + log_path + ": " + std::strerror(errno));
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw IoError(std::string("pipe: ") + std::strerror(errno));
  SpawnOptions so;
  so.argv = argv;
  so.env = env;
  so.stdout_fd = so.stderr_fd = fds[1];
  so.stdin_null = true;
  so.own_process_group = true;
  try {
    pid_ = spawn(so);
  } catch (...) {
    close(fds[0]);
    close(fds[1]);
    throw;
  }
  close(fds[1]);
  out_fd_ = fds[0];
  fcntl(out_fd_, F_SETFL, fcntl(out_fd_, F_GETFL) | O_NONBLOCK);
}

std::string Process::drain() {
  std::string out;
  if (out_fd_ < 0) return out;
  char buf[65536];
  for (;;) {
    ssize_t n = read(out_fd_, buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      close(out_fd_);
      out_fd_ = -1;
    }
    break;
  }
  size_t off = 0;
  while (off < out.size() && log_fd_ >= 0) {
    ssize_t w = write(log_fd_, out.data() + off, out.size() - off);
    if (w <= 0) break;
    off += static_cast<size_t>(w);
  }
  return out;
}

bool Process::poll_exit() {
  if (pid_ <= 0) return true;
  if (exited_) return true;
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != pid_)
    return false;
  // Whatever else is left in its process group goes with it (the group id
  // cannot be reused while the leader is an unreaped zombie).
  kill(-pid_, SIGKILL);
  int st = 0;
  waitpid(pid_, &st, 0);
  exited_ = true;
  exit_time_ms_ = unix_ms();
  if (WIFEXITED(st)) exit_code_ = WEXITSTATUS(st);
  if (WIFSIGNALED(st)) term_signal_ = WTERMSIG(st);
  return true;
}

std::string Process::status_text() const {
  if (!exited_) return "running";
  if (term_signal_) return "signal " + signal_name(term_signal_);
  return "exit code " + std::to_string(exit_code_);
}

void Process::signal(int sig) {
  if (pid_ > 0 && !exited_) {
    kill(-pid_, sig);
    kill(pid_, sig);
  }
}

std::string Process::log_tail(int n) const {
  std::ifstream in(log_path_);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > n) lines.pop_front();
  }
  std::string out;
  for (auto& l : lines) out += l + "\n";
  return out;
}

}  // namespace dtrain::launch
