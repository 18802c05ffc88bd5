// dtrain-ps-token-probe: a parameter-server client that knows the servers'
// addresses (as anyone who scans their ports does) but not the job's token.
// It connects through the core's own client (connect_worker) over a private
// in-memory store that holds only those addresses, presents --token, and
// declares a table. Exit 3 when the servers refused it, 0 when they let it
// in, 1 on any other failure (e.g. no server reachable).
//
//   dtrain-ps-token-probe --servers 127.0.0.1:40123 --workers 2 --token wrong
#include <chrono>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/ps.h"
#include "dtrain/sdk/strings.h"
#include "dtrain/store.h"

using namespace dtrain;

int main(int argc, char** argv) {
  CLI::App app{"dtrain-ps-token-probe: a PS client without the job's token"};
  std::string servers, token, tag, backend = "ps_grpc";
  int workers = 1;
  double timeout_s = 10;
  app.add_option("--servers", servers, "the servers' gRPC endpoints, host:port,... in server order")->required();
  app.add_option("--workers", workers, "the job's worker count");
  app.add_option("--token", token, "the token to present ('' presents none)");
  app.add_option("--backend", backend);
  app.add_option("--timeout-s", timeout_s);
  app.add_option("--tag", tag, "ignored; lets a test find its processes");
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<std::string> eps = sdk::split(servers);
    // The core scopes the first PS communicator's keys under this prefix
    // (core/src/comm/communicator.cc: dtrain/comm/<name>.<n>/p/ for the plugin).
    auto store = std::make_shared<MemoryStore>();
    for (size_t i = 0; i < eps.size(); ++i) store->set("dtrain/comm/ps.0/p/ps/server/" + std::to_string(i), eps[i]);
    CommOptions co;
    co.role = Role::Worker;
    co.rank = 0;
    co.world_size = co.num_workers = workers;
    co.num_servers = static_cast<int>(eps.size());
    co.store = store;
    co.name = "ps";
    co.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    co.job_token = token;
    auto worker = ps::connect_worker(PluginRegistry().load(backend), co, ps::ModeOptions{});
    ps::TableConfig t;
    t.name = "token_probe";
    t.kind = ps::TableKind::Dense;
    t.dim = 4;
    worker->dense_table(t);
    std::printf("dtrain-ps-token-probe: the servers accepted token '%s'\n", token.c_str());
    return 0;
  } catch (const std::exception& e) {
    const bool refused = std::string(e.what()).find("refused") != std::string::npos;
    std::printf("dtrain-ps-token-probe: %s: %s\n", refused ? "refused" : "failed", e.what());
    return refused ? 3 : 1;
  }
}
