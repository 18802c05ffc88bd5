// Paddle's launch variables (PADDLE_TRAINER_ID, TRAINING_ROLE, ...), with or
// without a launcher: set by hand, trainer 0 or server 0 serves the store.
#include <algorithm>
#include <cstdio>

#include "dtrain/endpoint.h"
#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"
#include "role_fields.h"

namespace dtrain::roles {

// A named namespace: the core builds in unity batches under the sanitizers,
// where every source's applies() and resolve() meet.
namespace paddle_env {

using sdk::join;

const env::RoleVars& kVars = env::kPaddle;

bool applies(const EnvReader& e) { return e.has(kVars.rank) || e.has(kVars.world_size) || e.has(kVars.role); }

// Machines from an endpoint list (Paddle sets no node rank): one machine per
// distinct host, in order of first appearance; local ranks count this host's
// endpoints before the rank's own.
void place_by_hosts(const std::vector<std::string>& endpoints, int rank, RawRole& r) {
  std::vector<std::string> hosts;
  for (const std::string& ep : endpoints) {
    std::string h = parse_host_port(ep).first;
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  }
  const std::string mine = parse_host_port(endpoints[static_cast<size_t>(rank)]).first;
  int local = 0, local_size = 0;
  for (size_t i = 0; i < endpoints.size(); ++i)
    if (parse_host_port(endpoints[i]).first == mine) {
      if (static_cast<int>(i) < rank) ++local;
      ++local_size;
    }
  if (!r.nnodes) r.nnodes = static_cast<int>(hosts.size());
  if (!r.node_rank) r.node_rank = static_cast<int>(std::find(hosts.begin(), hosts.end(), mine) - hosts.begin());
  if (!r.local_rank) r.local_rank = local;
  if (!r.local_world_size) r.local_world_size = local_size;
}

RoleInfo resolve(const EnvReader& e) {
  RawRole r;
  FieldNames names = read_placement(e, kVars, r);
  Role role = Role::Worker;
  if (auto text = e.get(kVars.role)) {
    auto parsed = parse_role(*text);
    if (!parsed) throw InvalidUsage("TRAINING_ROLE='" + *text + "' must be TRAINER or PSERVER");
    role = *parsed;
  }
  r.world_size = e.get_int(kVars.world_size);
  r.worker_endpoints = e.get_list(kVars.worker_endpoints);
  r.server_endpoints = e.get_list(kVars.server_endpoints);
  r.current_endpoint = e.get(kVars.current_endpoint);
  auto ip = e.get(env::kPaddlePodIp);
  auto port = e.get(env::kPaddlePort);
  bool ps_mode = role == Role::Server || (r.server_endpoints && !r.server_endpoints->empty());
  if (role == Role::Server && (!r.server_endpoints || r.server_endpoints->empty()))
    throw InvalidUsage("TRAINING_ROLE=PSERVER needs PADDLE_PSERVERS_IP_PORT_LIST (the servers' ip:port list)");
  if (ps_mode && !r.world_size && !r.worker_endpoints)
    throw InvalidUsage("PADDLE_TRAINERS_NUM is required in parameter-server mode (PADDLE_PSERVERS_IP_PORT_LIST=" +
                       join(*r.server_endpoints, ",") + ")");
  if (role == Role::Worker) {
    r.rank = e.get_int(kVars.rank);
    if (!r.current_endpoint && ip && port) {
      r.current_endpoint = *ip + ":" + *port;
      names["current_endpoint"] = "POD_IP:PADDLE_PORT";
    }
  } else if (ip && port) {
    // Paddle: a server's index is the place of POD_IP:PADDLE_PORT in the list.
    r.current_endpoint = *ip + ":" + *port;
    names["current_endpoint"] = "POD_IP:PADDLE_PORT";
  } else if (!r.current_endpoint) {
    throw InvalidUsage(
        "TRAINING_ROLE=PSERVER needs POD_IP and PADDLE_PORT (or PADDLE_CURRENT_ENDPOINT) "
        "to find this server in PADDLE_PSERVERS_IP_PORT_LIST");
  }
  // No launcher: in PS mode server 0 serves the store on its listed endpoint,
  // in collective mode trainer 0 on its own; the job id comes from that list.
  const bool collective_list = !ps_mode && r.worker_endpoints && r.worker_endpoints->size() > 1;
  bool self_hosted = (ps_mode || collective_list) && !r.store;
  if (self_hosted) {
    const auto& list = ps_mode ? *r.server_endpoints : *r.worker_endpoints;
    r.store = list.front();
    if (r.job_id.empty()) {
      uint32_t h = 2166136261u;
      for (unsigned char c : join(list, ",")) h = (h ^ c) * 16777619u;
      char buf[16];
      std::snprintf(buf, sizeof buf, "%08x", h);
      r.job_id = std::string(ps_mode ? "paddle-ps-" : "paddle-") + buf;
    }
  }
  if (collective_list && r.rank && *r.rank >= 0 && *r.rank < static_cast<int>(r.worker_endpoints->size()))
    place_by_hosts(*r.worker_endpoints, *r.rank, r);
  RoleInfo info = build(r, role, EnvNamer(names), kVars.source);
  info.self_hosted_store = self_hosted;
  return info;
}

}  // namespace paddle_env

const EnvSource kPaddleSource = {paddle_env::applies, paddle_env::resolve};

}  // namespace dtrain::roles
