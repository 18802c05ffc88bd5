#include "process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"
#include "dtrain/spawn/spawn.h"

namespace dtrain::bench {

namespace {

volatile std::sig_atomic_t g_interrupted = 0;

void on_signal(int) { g_interrupted = 1; }

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int s = WTERMSIG(status);
    const char* n = strsignal(s);
    return "was killed by signal " + std::to_string(s) + (n ? std::string(" (") + n + ")" : "");
  }
  return "ended with status " + std::to_string(status);
}

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

void kill_and_reap(std::vector<Child>& kids) {
  for (auto& k : kids)
    if (k.pid > 0) ::kill(k.pid, SIGKILL);
  for (auto& k : kids) {
    if (k.pid <= 0) continue;
    int st = 0;
    while (::waitpid(k.pid, &st, 0) < 0 && errno == EINTR) {
    }
    k.pid = -1;
  }
}

// A rank failed: give the others a moment to fail too, so that the report can
// name the root cause (a rank killed by a signal) rather than a peer that only
// saw its connection drop, then kill the rest.
std::string first_failure(std::vector<Child>& kids, const std::string& name, int status) {
  std::vector<std::pair<std::string, int>> failures{{name, status}};
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (std::chrono::steady_clock::now() < until) {
    bool any = false;
    for (auto& k : kids) {
      if (k.pid <= 0) continue;
      any = true;
      int st = 0;
      if (::waitpid(k.pid, &st, WNOHANG) == k.pid) {
        k.pid = -1;
        if (failed(st)) failures.push_back({k.name, st});
      }
    }
    if (!any) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill_and_reap(kids);
  std::stable_sort(failures.begin(), failures.end(),
                   [](const auto& a, const auto& b) { return WIFSIGNALED(a.second) && !WIFSIGNALED(b.second); });
  std::string why;
  for (auto& [n, st] : failures) why += (why.empty() ? "" : "; then ") + n + " " + describe_status(st);
  return why;
}

}  // namespace

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw IoError(std::string("cannot read /proc/self/exe: ") + std::strerror(errno));
  buf[n] = 0;
  return buf;
}

std::string dir_of(const std::string& path) {
  auto p = path.rfind('/');
  return p == std::string::npos ? "." : path.substr(0, p);
}

std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (std::string dir : sdk::split(path ? path : "/usr/local/bin:/usr/bin:/bin", ':', /*skip_empty=*/false)) {
    if (dir.empty()) dir = ".";
    std::string cand = dir + "/" + name;
    struct stat st {};
    if (::stat(cand.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(cand.c_str(), X_OK) == 0) return cand;
  }
  return "";
}

pid_t spawn(const std::string& path, const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
            int stdout_fd) {
  ::dtrain::launch::SpawnOptions o;
  o.program = path;
  o.argv = argv;
  for (const std::string& kv : extra_env) {
    auto eq = kv.find('=');
    o.env[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
  }
  o.stdout_fd = stdout_fd;
  return ::dtrain::launch::spawn(o);
}

void install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

bool interrupted() { return g_interrupted != 0; }

std::string wait_all(std::vector<Child>& kids, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  size_t alive = 0;
  for (auto& k : kids) alive += k.pid > 0;
  while (alive > 0) {
    for (auto& k : kids) {
      if (k.pid <= 0) continue;
      int st = 0;
      pid_t r = ::waitpid(k.pid, &st, WNOHANG);
      if (r == 0) continue;
      if (r < 0 && errno == EINTR) continue;
      k.pid = -1;
      --alive;
      if (r > 0 && failed(st)) return first_failure(kids, k.name, st);
    }
    if (alive == 0) break;
    if (interrupted()) {
      kill_and_reap(kids);
      return "interrupted; stopped every rank";
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::string names;
      for (auto& k : kids)
        if (k.pid > 0) names += (names.empty() ? "" : ", ") + k.name;
      kill_and_reap(kids);
      return "the time limit of " + std::to_string(limit.count()) + " s passed with " + names +
             " still running; killed them";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "";
}

Captured run_capture(const std::string& path, const std::vector<std::string>& argv,
                     const std::vector<std::string>& extra_env, std::chrono::seconds limit) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw IoError(std::string("pipe failed: ") + std::strerror(errno));
  pid_t pid;
  try {
    pid = spawn(path, argv, extra_env, fds[1]);
  } catch (...) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw;
  }
  ::close(fds[1]);
  Captured c;
  auto deadline = std::chrono::steady_clock::now() + limit;
  bool eof = false, term_sent = false;
  std::chrono::steady_clock::time_point kill_at{};
  int status = 0;
  bool reaped = false;
  while (!reaped) {
    if (!eof) {
      pollfd p{fds[0], POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) {
        char buf[4096];
        ssize_t n = ::read(fds[0], buf, sizeof(buf));
        if (n > 0)
          c.out.append(buf, static_cast<size_t>(n));
        else if (n == 0 || (errno != EINTR && errno != EAGAIN))
          eof = true;
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      reaped = true;
      break;
    }
    auto now = std::chrono::steady_clock::now();
    if (!term_sent && (interrupted() || now > deadline)) {
      c.failure = interrupted() ? "interrupted" : "the time limit of " + std::to_string(limit.count()) + " s passed";
      ::kill(pid, SIGTERM);  // mpirun forwards it to its ranks and cleans up
      term_sent = true;
      kill_at = now + std::chrono::seconds(5);
    } else if (term_sent && now > kill_at) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      reaped = true;
    }
  }
  // Drain what is left in the pipe.
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) break;
    char buf[4096];
    ssize_t n = ::read(fds[0], buf, sizeof(buf));
    if (n <= 0) break;
    c.out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (c.failure.empty() && failed(status)) c.failure = describe_status(status);
  return c;
}

std::vector<std::string> worker_argv(const std::string& mode, int rank, int world, int port, int64_t steps,
                                     int64_t warmup, int threads) {
  return {self_exe(),
          "--worker",
          mode,
          "--rank",
          std::to_string(rank),
          "--world",
          std::to_string(world),
          "--port",
          std::to_string(port),
          "--steps",
          std::to_string(steps),
          "--warmup",
          std::to_string(warmup),
          "--threads",
          std::to_string(threads)};
}

Child spawn_rank(const std::string& bench, int rank, const std::vector<std::string>& argv,
                 std::vector<std::string>& outs) {
  std::string out = "/tmp/dtrain-bench-" + bench + "." + std::to_string(getpid()) + "." + std::to_string(rank) + ".out";
  FILE* f = std::fopen(out.c_str(), "w");
  if (!f) throw IoError("cannot create " + out + ": " + std::strerror(errno));
  Child c{spawn(self_exe(), argv, {"DTRAIN_LOG_LEVEL=warn"}, fileno(f)), "rank " + std::to_string(rank)};
  std::fclose(f);
  outs.push_back(out);
  return c;
}

}  // namespace dtrain::bench
