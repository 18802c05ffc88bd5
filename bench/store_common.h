#pragma once
// `dtrain-bench store`'s processes: what its server and client processes share,
// whether they drive dtrain's store (bench/store.cc) or libtorch's
// c10d::TCPStore (bench/store_c10d.cc, built only with libtorch).
//
// A server process starts its store on 127.0.0.1, port 0, and writes
// "port P\n" to stdout; the parent reads its memory in /proc and kills it.
// A client process drives ranks [first, first + count) of `world`, each on
// its own connection, in phases: it writes "ready\n", blocks until it reads one
// byte from the go pipe, then connects every rank, for every rank publishes,
// for every rank reads the table (the join), and with --exchange does the full
// address exchange. It ends with one line "done JOIN_NS EXCHANGE_NS" of
// CLOCK_MONOTONIC times (the parent's clock too), or "error WHY".

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "stats.h"  // now_ns

namespace dtrain::bench::store {

struct ClientArgs {
  int port = 0;
  int world = 0;
  int first = 0;
  int count = 0;
  int go_fd = -1;
  bool exchange = false;
  std::string token;  // dtrain's job token (c10d's 1.13 store has none)
};

// The client's options (the parent passes them; no user does).
inline void add_client_args(CLI::App& app, ClientArgs& a) {
  auto* g = app.add_option_group("client", "(internal) a client process's ranks");
  g->add_option("--port", a.port);
  g->add_option("--world", a.world);
  g->add_option("--first", a.first);
  g->add_option("--count", a.count);
  g->add_option("--go-fd", a.go_fd);
  g->add_flag("--exchange", a.exchange);
  g->add_option("--token", a.token);
}

// One write per line, so lines of several children sharing a pipe do not mix.
inline void say(const std::string& line) {
  std::string s = line + "\n";
  for (size_t off = 0; off < s.size();) {
    ssize_t n = ::write(1, s.data() + off, s.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// A client process plays hundreds of ranks, each allocating a table-sized
// answer once: malloc keeps freed memory instead of returning it to the
// kernel after every rank (fresh pages fault in again, and that, not the
// store, would be timed). Both stores' clients set it.
inline void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

// Thousands of connections: the soft open-file limit up to the hard one.
inline void raise_open_files() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
}

// A client process's start: its limits, "ready", then the parent's go.
inline void start_client(const ClientArgs& a) {
  raise_open_files();
  keep_freed_memory();
  say("ready");
  char c;
  while (::read(a.go_fd, &c, 1) < 0 && errno == EINTR) {
  }
  ::close(a.go_fd);
}

// A server process: "port P", then it serves until the parent kills it.
[[noreturn]] inline void serve_until_killed(uint16_t port) {
  say("port " + std::to_string(port));
  for (;;) ::pause();
}

// "member/<i>" of a rank, "addr/<i>": the simulated endpoint a rank publishes.
inline std::string endpoint_of(int rank) {
  return "10." + std::to_string(rank >> 8 & 255) + "." + std::to_string(rank & 255) +
         ".1:" + std::to_string(20000 + rank % 40000);
}

}  // namespace dtrain::bench::store
