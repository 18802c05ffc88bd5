#include "join.h"

#include <iostream>

#include <fmt/format.h>

#include "dtrain/endpoint.h"
#include "dtrain/error.h"
#include "dtrain/job_secret.h"
#include "dtrain/job_token.h"
#include "dtrain/log.h"
#include "net.h"

namespace dtrain::launch {

namespace {

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

}  // namespace

JobStore open_job_store(JobPlan& p) {
  const LaunchOptions& o = p.options;
  MachineLayout& m = p.machines;
  JobStore js;
  p.job_id = o.job_id;
  if (p.job_id.empty()) p.job_id = m.multi_machine() ? "default" : "job-" + make_job_token().substr(0, 8);
  JobSecret secret = resolve_job_secret({o.token_file, o.insecure_open_job}, p.job_id, m.multi_machine());
  p.token = secret.token;
  p.token_source = secret.source;
  if (secret.open)
    std::cerr << "dtrain: WARNING: OPEN JOB: no secret (--insecure_open_job); any host that can reach "
              << format_host_port(m.store_host, static_cast<uint16_t>(m.store_port))
              << " can join this job, read its store and write to it\n"
              << std::flush;
  if (m.node == 0) {
    try {
      js.server = std::make_unique<TcpStoreServer>(m.bind_host, static_cast<uint16_t>(m.store_port), p.token);
    } catch (const std::exception& e) {
      throw IoError(
          fmt::format("cannot serve the job store on {}: {} (another job on this port? choose one "
                      "with --start_port)",
                      format_host_port(m.bind_host, static_cast<uint16_t>(m.store_port)), e.what()));
    }
    m.store_port = js.server->port();
  }
  p.store_endpoint = format_host_port(m.store_host, static_cast<uint16_t>(m.store_port));
  js.launch = connect_launch_store(p);
  js.root = std::static_pointer_cast<PrefixStore>(js.launch)->base();
  if (m.node == kNodeUnassigned && !o.elastic()) {
    // Indices in the order the machines join; node 0 is the master's.
    m.node = static_cast<int>(js.launch->add("node_index", 1));
    if (m.node >= m.nnodes)
      throw InvalidUsage(
          fmt::format("this machine joined the job at {} as machine {} of --nnodes {}: more "
                      "machines joined than the job has (a machine started twice?)",
                      p.store_endpoint, m.node + 1, m.nnodes));
  }
  return js;
}

std::shared_ptr<Store> connect_launch_store(const JobPlan& p) {
  auto client = std::make_shared<TcpStore>(p.machines.store_host, static_cast<uint16_t>(p.machines.store_port), p.token,
                                           seconds_ms(p.options.join_timeout_s));
  client->set_answer_timeout(kPeerSilenceLimit);
  return std::make_shared<PrefixStore>("launch", client);
}

NodeInfo describe_machine(const JobPlan& p, int node) {
  NodeInfo me;
  me.node = node;
  me.ip = p.machines.my_ip;
  me.hostname = this_hostname();
  me.version = core_version();
  for (const Slot& s : p.slots) (s.role == SlotRole::Worker ? me.workers : me.servers).push_back(s.endpoint);
  return me;
}

void exchange_node_info(JobPlan& p, Store& launch, const std::function<void()>& interrupted) {
  const LaunchOptions& o = p.options;
  const int node = p.machines.node, nnodes = p.machines.nnodes;
  NodeInfo me = describe_machine(p, node);
  auto joined = std::make_shared<PrefixStore>("join", std::shared_ptr<Store>(&launch, [](Store*) {}));
  publish_member(*joined, node, nnodes, bytes(me.encode()));
  std::optional<MemberTable> infos;
  try {
    infos = read_members(*joined, nnodes, seconds_ms(o.join_timeout_s), interrupted);
  } catch (const TimeoutError&) {
    auto missing = missing_members(*joined, nnodes);
    if (missing.empty()) throw;  // every machine published, the table was not written: say that
    std::string names;
    for (int n : missing)
      names += fmt::format("{}{} ({})", names.empty() ? "" : ", ", n,
                           o.ips.size() > static_cast<size_t>(n) ? o.ips[n] : "?");
    throw TimeoutError(fmt::format(
        "machine{} {} of {} {} not joined the job after {} s; start the same "
        "dtrain command there, or check `dtrain check`",
        missing.size() > 1 ? "s" : "", names, nnodes, missing.size() > 1 ? "have" : "has", o.join_timeout_s));
  }
  std::vector<NodeInfo> nodes(nnodes);
  for (int n = 0; n < nnodes; ++n)
    nodes[n] = NodeInfo::decode(std::string((*infos)[n]), fmt::format("launch/join/member/{}", n));
  set_machines(p, std::move(nodes), node);
}

void set_machines(JobPlan& p, std::vector<NodeInfo> nodes, int self) {
  const LaunchOptions& o = p.options;
  const std::string mine = core_version();
  for (const NodeInfo& n : nodes)
    if (n.version != mine)
      throw InvalidUsage(
          fmt::format("machine {} ({}) runs dtrain {} but this one runs {}: install the same "
                      "version everywhere",
                      n.node, n.ip, n.version, mine));
  p.nodes = std::move(nodes);
  p.machines.node = self;
  p.machines.nnodes = static_cast<int>(p.nodes.size());
  p.worker_eps.clear();
  p.server_eps.clear();
  if (p.listed) {
    p.worker_eps = o.workers;
    p.server_eps = o.servers;
  } else {
    for (size_t i = 0; i < p.nodes.size(); ++i) {
      const NodeInfo& n = p.nodes[i];
      int base_w = static_cast<int>(p.worker_eps.size()), base_s = static_cast<int>(p.server_eps.size());
      if (static_cast<int>(i) == self)
        for (Slot& s : p.slots) s.index = (s.role == SlotRole::Worker ? base_w : base_s) + s.local;
      p.worker_eps.insert(p.worker_eps.end(), n.workers.begin(), n.workers.end());
      p.server_eps.insert(p.server_eps.end(), n.servers.begin(), n.servers.end());
    }
  }
  if (p.worker_eps.empty()) throw InvalidUsage("the job has no worker process");
}

}  // namespace dtrain::launch
