#include "table.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"
#include "environment.h"
#include "program.h"

namespace dtrain::launch {

void print_job_table(const JobPlan& p) {
  const LaunchOptions& o = p.options;
  std::error_code ec;
  std::filesystem::create_directories(o.log_dir, ec);
  if (ec) throw IoError("cannot create the log folder " + o.log_dir + ": " + ec.message());
  std::ostringstream t;
  t << "----------------------- dtrain: distributed job -----------------------\n";
  auto row = [&](const std::string& k, const std::string& v) { t << fmt::format("  {:<16} {}\n", k, v); };
  row("mode", ps_mode(o) ? "parameter server" : "collective");
  if (!o.backend.empty()) row("backend", o.backend);
  row("job_id", p.job_id);
  row("machines", fmt::format("{} (this is node {}, {}){}", p.machines.nnodes, p.machines.node, p.machines.my_ip,
                              o.elastic() ? fmt::format("; elastic {}:{}, generation {}, member {}", o.nnodes_min,
                                                        o.nnodes, p.generation, p.elastic_id)
                                          : ""));
  row("workers", ps_mode(o) ? std::to_string(p.worker_eps.size())
                            : fmt::format("{} ({} on this machine, from {})", p.worker_eps.size(), o.nproc_per_node,
                                          o.nproc_source));
  if (!p.server_eps.empty()) row("servers", std::to_string(p.server_eps.size()));
  row("store", p.store_endpoint + (p.machines.node == 0 ? " (served here)" : ""));
  row("store token", p.token_source);
  if (!p.slots.empty() && !p.slots.front().port_range.empty()) {
    const std::string last = p.slots.back().port_range.substr(p.slots.back().port_range.find('-') + 1);
    row("ports", fmt::format("{}-{} (store {}, an endpoint each, then {} a process: DTRAIN_PORT_RANGE)",
                             p.machines.store_port, last, p.machines.store_port, kPortsPerProcess));
  }
  row("log_dir", o.log_dir);
  row("max_restarts", std::to_string(o.max_restarts));
  row("command", sdk::join(o.command, " "));
  if (!o.python.empty()) {
    const std::string package = python_package_dir();
    row("python", o.python + (package.empty() ? " (dtrain's Python package is not built)"
                                              : " (import dtrain from " + package + ")"));
  }
  if (!o.devices.empty())
    row("devices",
        "CUDA " + sdk::join(o.devices) + " (from " + o.devices_source + "; DTRAIN_DEVICE of each worker below)");
  const bool gpu = !o.devices.empty();
  t << fmt::format("  {:<8} {:<6} {:<5} {:<6} {:<22} {}{}\n", "role", "rank", "node", "local", "endpoint",
                   gpu ? "device  " : "", "log");
  for (const Slot& s : p.slots)
    t << fmt::format("  {:<8} {:<6} {:<5} {:<6} {:<22} {}{}\n", s.role_name(), s.index, p.machines.node, s.local,
                     s.endpoint, gpu ? fmt::format("{:<8}", s.device.empty() ? "-" : s.device) : "", p.log_file(s));
  t << "-----------------------------------------------------------------------\n";
  if (sets_omp_threads(p))
    t << fmt::format(
        "dtrain: OMP_NUM_THREADS=1 for each of the {} processes on this machine (torchrun's rule, to keep them from "
        "overloading it); set OMP_NUM_THREADS to tune it\n",
        p.slots.size());
  std::cout << t.str() << std::flush;

  // An elastic job's generations follow one another in the file.
  std::ofstream ep(o.log_dir + "/endpoints.log", p.generation > 0 ? std::ios::app : std::ios::trunc);
  if (o.elastic()) ep << "generation: " << p.generation << "\n";
  ep << "job_id: " << p.job_id << "\nstore: " << p.store_endpoint << "\n";
  ep << "PADDLE_TRAINER_ENDPOINTS:\n";
  for (auto& e : p.worker_eps) ep << e << "\n";
  if (!p.server_eps.empty()) {
    ep << "PADDLE_PSERVERS_IP_PORT_LIST:\n";
    for (auto& e : p.server_eps) ep << e << "\n";
  }
}

}  // namespace dtrain::launch
