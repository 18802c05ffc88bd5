#include "commands.h"

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/log.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/store.h"
#include "net.h"

namespace dtrain::launch {

int list_plugins(const std::vector<std::string>& extra_dirs) {
  PluginRegistry registry(extra_dirs);
  std::vector<std::string> errors;
  auto plugins = registry.list(&errors);
  std::cout << fmt::format("{:<10} {:<20} {:<5} {}\n", "backend", "version", "abi", "capabilities");
  for (const PluginInfo& p : plugins)
    std::cout << fmt::format("{:<10} {:<20} {:<5} {}\n", p.name, p.version, fmt::format("{}.{}", p.abi_major, p.abi_minor),
                             p.caps_string());
  for (const PluginInfo& p : plugins) std::cout << fmt::format("  {}: {} ({})\n", p.name, p.description, p.path);
  for (const std::string& e : errors) std::cout << "  not loadable: " << e << "\n";
  std::string dirs;
  for (const std::string& d : registry.search_path()) dirs += (dirs.empty() ? "" : ":") + d;
  std::cout << "search path: " << dirs << "\n";
  return plugins.empty() ? 1 : 0;
}

namespace {

struct Row {
  std::string check, result, detail;
};

std::string plugin_versions(std::vector<std::string>* errors) {
  std::string out;
  for (const PluginInfo& p : PluginRegistry().list(errors)) out += (out.empty() ? "" : " ") + p.name + "-" + p.version;
  return out;
}

}  // namespace

int run_check(const CheckOptions& o) {
  std::vector<Row> rows;
  auto add = [&](std::string c, bool ok, std::string d) { rows.push_back({std::move(c), ok ? "ok" : "FAIL", std::move(d)}); };
  const int timeout_ms = static_cast<int>(o.timeout_s * 1000);

  int nnodes = 1, node = 0, port = o.start_port;
  if (port == 0)
    if (const char* p = std::getenv("FLAGS_START_PORT")) port = std::atoi(p);
  std::string store_host = "127.0.0.1", my_ip = "127.0.0.1";
  if (!o.ips.empty()) {
    nnodes = static_cast<int>(o.ips.size());
    node = o.node_rank;
    for (int i = 0; i < nnodes && node < 0; ++i)
      if (!local_iface_of(o.ips[i]).empty()) node = i;
    store_host = o.ips[0];
    if (port == 0) port = 6170;
    if (node < 0) {
      add("this machine in --ips", false, "none of the --ips is an address of this machine");
      node = -1;
    } else {
      my_ip = resolve_host(o.ips[node]);
      add("this machine in --ips", true, fmt::format("node {} of {} ({})", node, nnodes, o.ips[node]));
    }
  } else if (!o.master.empty()) {
    auto [h, p] = parse_host_port(o.master);
    store_host = h;
    port = p;
    nnodes = o.nnodes;
    node = o.node_rank < 0 ? 0 : o.node_rank;
    add("node rank", node < nnodes, fmt::format("node {} of {}", node, nnodes));
  } else if (port == 0) {
    port = 6170;
  }
  if (node >= 0 && nnodes > 1 && o.ips.empty()) {
    for (auto& a : local_addresses())
      if (a.iface != "lo" && a.ip.find(':') == std::string::npos) {
        my_ip = a.ip;
        break;
      }
  }
  std::string iface = local_iface_of(my_ip);
  add("interface", !iface.empty(), iface.empty() ? my_ip + " is not on any interface of this machine"
                                                : fmt::format("{} ({})", iface, my_ip));

  if (!o.backend.empty()) {
    try {
      auto be = PluginRegistry().load(o.backend);
      add("backend " + o.backend, true, fmt::format("{} {} ({})", be->info().name, be->info().version, be->info().path));
    } catch (const std::exception& e) {
      add("backend " + o.backend, false, e.what());
    }
  }
  std::vector<std::string> plugin_errors;
  std::string versions = fmt::format("dtrain-{} {}", core_version(), plugin_versions(&plugin_errors));
  for (auto& e : plugin_errors) add("plugin", false, e);

  std::unique_ptr<TcpStoreServer> server;
  const std::string token = "dtrain-check:" + o.job_id;
  if (node == 0) {
    std::string bind = nnodes == 1 ? "127.0.0.1" : "0.0.0.0";
    std::string problem = port_bind_problem(bind, static_cast<uint16_t>(port));
    add(fmt::format("store port {} free", port), problem.empty(),
        problem.empty() ? "can be bound on " + bind : problem + " (a job running? choose another with --start_port)");
    if (problem.empty()) {
      try {
        server = std::make_unique<TcpStoreServer>(bind, static_cast<uint16_t>(port), token);
      } catch (const std::exception& e) {
        add("serve check store", false, e.what());
      }
    }
  }
  std::string endpoint = fmt::format("{}:{}", store_host, port);
  std::string problem = tcp_probe(store_host, static_cast<uint16_t>(port), timeout_ms);
  add("store " + endpoint + " reachable", problem.empty(), problem.empty() ? "connected" : problem);

  if (problem.empty() && node >= 0) {
    try {
      TcpStore store(store_host, static_cast<uint16_t>(port), token, std::chrono::milliseconds(timeout_ms));
      store.set(fmt::format("check/{}", node), versions);
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
      for (int n = 0; n < nnodes; ++n) {
        if (n == node) continue;
        std::optional<Bytes> v;
        while (!(v = store.try_get(fmt::format("check/{}", n))) && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (!v) {
          add(fmt::format("node {} versions", n), false,
              fmt::format("no answer within {} s: run `dtrain check` with the same options there", o.timeout_s));
          continue;
        }
        std::string theirs(v->begin(), v->end());
        add(fmt::format("node {} versions", n), theirs == versions,
            theirs == versions ? "same as here: " + versions : "differs: there " + theirs + ", here " + versions);
      }
      if (node == 0) {
        // Keep the check store up a little for machines that started later.
        store.set(fmt::format("check-done/{}", node), "1");
        std::this_thread::sleep_for(std::chrono::milliseconds(nnodes > 1 ? 1000 : 0));
      }
    } catch (const std::exception& e) {
      add("store " + endpoint + " handshake", false, e.what());
    }
  }
  add("versions here", true, versions);

  bool ok = true;
  size_t w = 5;
  for (auto& r : rows) w = std::max(w, r.check.size());
  std::cout << fmt::format("{:<{}}  {:<6} {}\n", "check", w, "result", "detail");
  for (auto& r : rows) {
    std::cout << fmt::format("{:<{}}  {:<6} {}\n", r.check, w, r.result, r.detail);
    ok = ok && r.result == "ok";
  }
  return ok ? 0 : 1;
}

}  // namespace dtrain::launch
