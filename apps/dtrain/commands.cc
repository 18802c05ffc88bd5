#include "commands.h"

#include <algorithm>
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
#include "dtrain/endpoint.h"
#include "layout.h"
#include "net.h"
#include "dtrain/job_secret.h"

namespace dtrain::launch {

int list_plugins(const std::vector<std::string>& extra_dirs, bool keys) {
  PluginRegistry registry(extra_dirs);
  std::vector<std::string> errors;
  auto plugins = registry.list(&errors);
  std::cout << fmt::format("{:<10} {:<20} {:<5} {}\n", "backend", "version", "abi", "capabilities");
  for (const PluginInfo& p : plugins)
    std::cout << fmt::format("{:<10} {:<20} {:<5} {}\n", p.name, p.version,
                             fmt::format("{}.{}", p.abi_major, p.abi_minor), p.caps_string());
  for (const PluginInfo& p : plugins) std::cout << fmt::format("  {}: {} ({})\n", p.name, p.description, p.path);
  for (const std::string& e : errors) std::cout << "  not loadable: " << e << "\n";
  if (keys) {
    for (const PluginInfo& p : plugins) {
      std::cout << fmt::format("\n[{}] keys (job file table [{}], or -o {}.KEY=VALUE):\n", p.name, p.name, p.name);
      if (p.config_keys.empty()) std::cout << "  (none)\n";
      size_t width = 4;
      for (const ConfigKey& k : p.config_keys) width = std::max(width, k.path.size());
      for (const ConfigKey& k : p.config_keys)
        std::cout << fmt::format("  {:<{}} {:<6} {:<12} {}\n", k.path, width, to_string(k.type),
                                 k.default_text.empty() ? "(none)" : k.default_text, k.description);
    }
    std::cout << "\n";
  }
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
  auto add = [&](std::string c, bool ok, std::string d) {
    rows.push_back({std::move(c), ok ? "ok" : "FAIL", std::move(d)});
  };
  const int timeout_ms = static_cast<int>(o.timeout_s * 1000);

  // The same layout as the job's: the check tests the addresses the job will use.
  MachineLayout m;
  try {
    m = layout_machines(o.machines);
    add("machines", true, fmt::format("node {} of {}, this machine is {}", m.node, m.nnodes, m.my_ip));
  } catch (const std::exception& e) {
    add("machines", false, e.what());
    // Still probe the store the other machines would use.
    m.node = -1;
    m.nnodes = std::max<int>(o.machines.nnodes, static_cast<int>(o.machines.ips.size()));
    if (!o.machines.ips.empty())
      m.store_host = o.machines.ips[0];
    else if (!o.machines.master.empty())
      m.store_host = parse_host_port(o.machines.master).first;
    else
      m.store_host = "127.0.0.1";
    if (!o.machines.master.empty()) m.store_port = parse_host_port(o.machines.master).second;
    if (m.store_port == 0 && o.machines.start_port) m.store_port = o.machines.start_port;
  }
  // One machine takes any free port for its job; the check tests the default.
  if (m.store_port == 0) m.store_port = kDefaultStorePort;
  const int nnodes = m.nnodes, node = m.node, port = m.store_port;
  const std::string& store_host = m.store_host;
  if (node >= 0) {
    std::string iface = local_iface_of(m.my_ip);
    add("interface", !iface.empty(),
        iface.empty() ? m.my_ip + " is not on any interface of this machine" : fmt::format("{} ({})", iface, m.my_ip));
  }

  if (!o.backend.empty()) {
    try {
      auto be = PluginRegistry().load(o.backend);
      add("backend " + o.backend, true,
          fmt::format("{} {} ({})", be->info().name, be->info().version, be->info().path));
    } catch (const std::exception& e) {
      add("backend " + o.backend, false, e.what());
    }
  }
  std::vector<std::string> plugin_errors;
  std::string versions = fmt::format("dtrain-{} {}", core_version(), plugin_versions(&plugin_errors));
  for (auto& e : plugin_errors) add("plugin", false, e);

  std::unique_ptr<TcpStoreServer> server;
  // The job's own secret when there is one; the check store holds only versions.
  std::string token = "dtrain-check:" + o.job_id;
  if (node >= 0) {
    try {
      JobSecret secret = resolve_job_secret(o.secret, o.job_id.empty() ? "default" : o.job_id, nnodes > 1);
      add("job secret", true, secret.source);
      if (!secret.open) token = "dtrain-check:" + secret.token;
    } catch (const std::exception& e) {
      add("job secret", false, e.what());
    }
  }
  if (node == 0) {
    const std::string& bind = m.bind_host;
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
  std::string endpoint = format_host_port(store_host, static_cast<uint16_t>(port));
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
