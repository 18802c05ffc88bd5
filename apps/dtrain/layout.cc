#include "layout.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "dtrain/endpoint.h"
#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"
#include "launcher.h"
#include "net.h"

namespace dtrain::launch {

namespace {

int configured_port(int start_port) {
  if (start_port != 0) return start_port;
  if (const char* p = std::getenv("FLAGS_START_PORT")) return std::atoi(p);
  return 0;
}

std::string address_list() {
  std::vector<std::string> mine;
  for (auto& a : local_addresses()) mine.push_back(a.ip + " (" + a.iface + ")");
  return sdk::join(mine, ", ");
}

}  // namespace

MachineLayout layout_machines(const MachineOptions& o) {
  MachineLayout m;
  int port = configured_port(o.start_port);
  if (!o.ips.empty()) {
    m.nnodes = static_cast<int>(o.ips.size());
    m.node = o.node_rank;
    for (int i = 0; i < m.nnodes && m.node < 0; ++i)
      if (!local_iface_of(o.ips[i]).empty()) m.node = i;
    if (m.node < 0)
      throw InvalidUsage("none of --ips " + sdk::join(o.ips) + " is an address of this machine; its addresses are " +
                         address_list() + " (or give --rank to say which entry this machine is)");
    if (m.node >= m.nnodes) throw InvalidUsage(fmt::format("--rank {} is out of range for {} --ips", m.node, m.nnodes));
    m.my_ip = resolve_host(o.ips[m.node]);
    m.store_host = o.ips[0];
    m.store_port = port ? port : kDefaultStorePort;
    m.bind_host = resolve_host(o.ips[0]);
  } else if (!o.master.empty()) {
    auto [host, p] = parse_host_port(o.master);
    m.nnodes = o.nnodes;
    m.node = o.node_rank;
    // No --rank (a PaddleJob's pods, as Paddle's own launch): the machine that
    // owns the master address is node 0, the others take their index from
    // the store when they join (kNodeUnassigned).
    if (m.node < 0) m.node = m.nnodes == 1 || !local_iface_of(resolve_host(host)).empty() ? 0 : kNodeUnassigned;
    if (m.node >= m.nnodes)
      throw InvalidUsage(fmt::format("--rank {} is out of range for --nnodes {}", m.node, m.nnodes));
    m.store_host = host;
    m.store_port = p;
    m.bind_host = resolve_host(host);
    m.my_ip = m.nnodes > 1 ? source_ip_for(host) : "127.0.0.1";
  } else {
    if (o.nnodes > 1) throw InvalidUsage("--nnodes > 1 needs --ips or --master to find the other machines");
    m.store_host = "127.0.0.1";
    m.store_port = port;
    m.my_ip = "127.0.0.1";
    m.bind_host = "127.0.0.1";
  }
  if (m.my_ip.empty()) m.my_ip = "127.0.0.1";
  if (m.bind_host.empty()) throw InvalidUsage("cannot resolve the store's host " + m.store_host);
  if (m.node == 0 && local_iface_of(m.bind_host).empty())
    throw InvalidUsage(
        fmt::format("this machine is node 0 and serves the job store, but {} is not one of its addresses "
                    "({}): name this machine's address in {}",
                    m.store_host, address_list(), o.ips.empty() ? "--master" : "--ips"));
  return m;
}

bool ps_mode(const LaunchOptions& o) {
  return o.server_num > 0 || o.worker_num > 0 || !o.servers.empty() || !o.workers.empty();
}

std::vector<Slot> layout_processes(const LaunchOptions& o, const MachineLayout& m, bool* listed) {
  std::vector<Slot> slots;
  auto count_role = [&](SlotRole role) {
    return static_cast<int>(std::count_if(slots.begin(), slots.end(), [&](const Slot& x) { return x.role == role; }));
  };
  const int start = configured_port(o.start_port);
  int next_port = start + 1;
  auto endpoint_port = [&]() -> uint16_t {
    if (start <= 0) return pick_free_port(m.my_ip);
    while (next_port < 65536 && !port_bind_problem(m.my_ip, static_cast<uint16_t>(next_port)).empty()) ++next_port;
    if (next_port >= 65536) throw InvalidUsage(fmt::format("--start_port {}: no free port left above it", start));
    return static_cast<uint16_t>(next_port++);
  };
  auto add_local = [&](SlotRole role, const std::string& device) {
    Slot s;
    s.role = role;
    s.device = device;
    s.local = count_role(role);
    s.endpoint = format_host_port(m.my_ip, endpoint_port());
    slots.push_back(s);
  };
  auto add_listed = [&](SlotRole role, const std::vector<std::string>& list) {
    for (size_t i = 0; i < list.size(); ++i) {
      std::string host = parse_host_port(list[i]).first;
      if (local_iface_of(host).empty()) continue;
      if (m.multi_machine() && resolve_host(host) != m.my_ip) continue;
      Slot s;
      s.role = role;
      s.index = static_cast<int>(i);
      s.local = count_role(role);
      s.endpoint = list[i];
      slots.push_back(s);
    }
  };
  *listed = false;
  if (ps_mode(o)) {
    if (!o.servers.empty() || !o.workers.empty()) {
      add_listed(SlotRole::Server, o.servers);
      add_listed(SlotRole::Worker, o.workers);
      *listed = true;
    } else {
      for (int i = 0; i < o.server_num; ++i) add_local(SlotRole::Server, "");
      // A machine of servers only (a PaddleJob's master pods) has no worker;
      // elsewhere one worker at least.
      const int workers = o.server_num > 0 && m.multi_machine() ? o.worker_num : std::max(o.worker_num, 1);
      const size_t k = o.devices.size();
      for (int i = 0; i < workers; ++i) add_local(SlotRole::Worker, k ? o.devices[static_cast<size_t>(i) % k] : "");
    }
  } else if (!o.devices.empty()) {
    const int k = static_cast<int>(o.devices.size());
    if (o.nproc_per_node < k)
      throw InvalidUsage(
          fmt::format("nproc_per_node {} (from {}) is fewer than the {} devices of {} ({}): every device "
                      "needs a worker",
                      o.nproc_per_node, o.nproc_source, k, o.devices_source, sdk::join(o.devices)));
    // More workers than devices share them in turn (several NCCL ranks on one
    // GPU need distinct NCCL_HOSTIDs).
    for (int i = 0; i < o.nproc_per_node; ++i) add_local(SlotRole::Worker, o.devices[i % k]);
  } else {
    if (o.nproc_per_node < 1) throw InvalidUsage("--nproc_per_node must be at least 1");
    for (int i = 0; i < o.nproc_per_node; ++i) add_local(SlotRole::Worker, "");
  }
  if (start > 0 && !*listed) {
    for (size_t i = 0; i < slots.size(); ++i) {
      const int lo = next_port + static_cast<int>(i) * kPortsPerProcess;
      if (lo + kPortsPerProcess > 65536) throw InvalidUsage(fmt::format("--start_port {} leaves too few ports", start));
      slots[i].port_range = fmt::format("{}-{}", lo, lo + kPortsPerProcess - 1);
    }
  }
  return slots;
}

}  // namespace dtrain::launch
