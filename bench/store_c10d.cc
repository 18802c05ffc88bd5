// dtrain-bench-store-c10d: `dtrain-bench store`'s reference, libtorch's C++
// c10d::TCPStore (the server before PyTorch's libuv rewrite), doing the keys of
// dtrain's join: "join/member/<r>", a "join/members/joined" counter, and one
// "join/members/table" the last member writes and every member reads. 1.13's
// store has no multi-get, so the last member reads the members with one get
// each, and the full exchange is N gets per rank. See bench/store_common.h for
// the processes' protocol.

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "store_common.h"

namespace dtrain::bench::store {
namespace {

constexpr std::chrono::milliseconds kOpTimeout{std::chrono::seconds(120)};

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string text(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }

c10d::TCPStoreOptions options(uint16_t port, bool server) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = server;
  o.waitWorkers = false;
  o.timeout = kOpTimeout;
  return o;
}

int serve() {
  raise_open_files();
  c10d::TCPStore server("127.0.0.1", options(0, true));
  serve_until_killed(server.getPort());
}

int client(const ClientArgs& a) {
  start_client(a);
  std::vector<std::unique_ptr<c10d::TCPStore>> conns;
  for (int i = 0; i < a.count; ++i)
    conns.push_back(std::make_unique<c10d::TCPStore>("127.0.0.1", options(static_cast<uint16_t>(a.port), false)));
  int64_t connected = now_ns();
  for (int i = 0; i < a.count; ++i) {
    auto& s = *conns[i];
    int r = a.first + i;
    s.set("join/member/" + std::to_string(r), bytes(endpoint_of(r)));
    if (s.add("join/members/joined", 1) != a.world) continue;
    std::string table;
    for (int m = 0; m < a.world; ++m) table += text(s.get("join/member/" + std::to_string(m))) + "\n";
    s.set("join/members/table", bytes(table));
  }
  for (int i = 0; i < a.count; ++i) {
    // Split as dtrain's MemberTable does: one view per member.
    std::string table = text(conns[i]->get("join/members/table"));
    std::vector<std::string_view> members;
    members.reserve(a.world);
    for (size_t pos = 0, nl; (nl = table.find('\n', pos)) != std::string::npos; pos = nl + 1)
      members.emplace_back(table.data() + pos, nl - pos);
    int probe = (a.first + i * 7919) % a.world;
    if (members.size() != size_t(a.world) || members[probe] != endpoint_of(probe))
      throw std::runtime_error("the table is wrong");
  }
  int64_t joined = now_ns(), exchanged = 0;
  if (a.exchange) {
    std::vector<std::string> keys;
    for (int r = 0; r < a.world; ++r) keys.push_back("addr/" + std::to_string(r));
    for (int i = 0; i < a.count; ++i) conns[i]->set(keys[a.first + i], bytes(endpoint_of(a.first + i)));
    for (int i = 0; i < a.count; ++i) {
      conns[i]->wait(keys);
      for (const auto& k : keys) conns[i]->get(k);
    }
    exchanged = now_ns();
  }
  say(fmt::format("done {} {} {}", connected, joined, exchanged));
  return 0;
}

}  // namespace
}  // namespace dtrain::bench::store

int main(int argc, char** argv) {
  using namespace dtrain::bench::store;
  CLI::App app{"dtrain-bench-store-c10d: c10d's TCPStore as dtrain-bench store's reference (run by it)"};
  ClientArgs c;
  bool serve_mode = false, client_mode = false;
  app.add_flag("--serve", serve_mode);
  app.add_flag("--client", client_mode);
  add_client_args(app, c);
  CLI11_PARSE(app, argc, argv);
  try {
    if (serve_mode) return serve();
    if (client_mode) return client(c);
    std::fprintf(stderr, "dtrain-bench-store-c10d: run it through `dtrain-bench store`\n");
    return 2;
  } catch (const std::exception& e) {
    if (client_mode) say(std::string("error ") + e.what());
    std::fprintf(stderr, "dtrain-bench-store-c10d: %s\n", e.what());
    return 1;
  }
}
