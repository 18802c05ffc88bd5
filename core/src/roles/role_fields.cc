#include "role_fields.h"

#include <algorithm>
#include <charconv>
#include <cstdint>

#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"

namespace dtrain::roles {

using sdk::join;
using sdk::lower;
using sdk::trim;

std::optional<Role> parse_role(const std::string& text) {
  std::string s = lower(trim(text));
  if (s == "worker" || s == "trainer") return Role::Worker;
  if (s == "server" || s == "pserver") return Role::Server;
  return std::nullopt;
}

namespace {

bool is_host_port(const std::string& s) {
  size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  int port = 0;
  const char* begin = s.data() + colon + 1;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(begin, end, port);
  return ec == std::errc() && p == end && port > 0 && port <= 65535;
}

void check_endpoint(const Namer& n, const std::string& field, const std::optional<std::string>& ep) {
  if (ep && !is_host_port(*ep)) n.fail(field, n.show(field, "'" + *ep + "'") + " is not host:port");
}

void check_endpoints(const Namer& n, const std::string& field, const std::optional<std::vector<std::string>>& eps) {
  if (!eps) return;
  for (const std::string& ep : *eps)
    if (!is_host_port(ep))
      n.fail(field, n.name(field) + " entry '" + ep + "' is not host:port (in " + n.show_list(field, *eps) + ")");
}

void check_min(const Namer& n, const std::string& field, const std::optional<int>& v, int min) {
  if (v && *v < min)
    n.fail(field,
           n.show(field, *v) + (min == 0 ? " must not be negative" : " must be at least " + std::to_string(min)));
}

void check_below(const Namer& n, const std::string& field, int value, const std::string& limit_field, int limit,
                 const std::string& what) {
  if (value >= limit)
    n.fail(field, n.show(field, value) + " is out of range for " + n.show(limit_field, limit) + " (" + what + " 0.." +
                      std::to_string(limit - 1) + ")");
}

}  // namespace

RoleInfo build(const RawRole& r, Role role, const Namer& n, const std::string& source) {
  for (auto [field, value] :
       {std::make_pair("rank", &r.rank), std::make_pair("local_rank", &r.local_rank),
        std::make_pair("node_rank", &r.node_rank), std::make_pair("server_index", &r.server_index),
        std::make_pair("restart_count", &r.restart_count)})
    check_min(n, field, *value, 0);
  check_min(n, "world_size", r.world_size, 1);
  check_min(n, "local_world_size", r.local_world_size, 1);
  check_min(n, "nnodes", r.nnodes, 1);
  check_endpoints(n, "worker_endpoints", r.worker_endpoints);
  check_endpoints(n, "server_endpoints", r.server_endpoints);
  check_endpoint(n, "current_endpoint", r.current_endpoint);
  check_endpoint(n, "store", r.store);

  RoleInfo info;
  info.role = role;
  info.source = source;
  info.job_id = r.job_id;
  info.job_token = r.job_token;
  info.restart_count = r.restart_count.value_or(0);
  info.store_endpoint = r.store.value_or("");
  info.worker_endpoints = r.worker_endpoints.value_or(std::vector<std::string>{});
  info.server_endpoints = r.server_endpoints.value_or(std::vector<std::string>{});
  info.current_endpoint = r.current_endpoint.value_or("");
  info.num_servers = static_cast<int>(info.server_endpoints.size());

  if (r.world_size) {
    info.world_size = *r.world_size;
  } else if (!info.worker_endpoints.empty()) {
    info.world_size = static_cast<int>(info.worker_endpoints.size());
  } else {
    n.fail("world_size",
           n.name("world_size") + " is not set (nor " + n.name("worker_endpoints") + " to count the workers)");
  }
  if (!info.worker_endpoints.empty() && static_cast<int>(info.worker_endpoints.size()) != info.world_size)
    n.fail("worker_endpoints", n.name("worker_endpoints") + " lists " + std::to_string(info.worker_endpoints.size()) +
                                   " endpoints but " + n.show("world_size", info.world_size));

  int count = info.world_size;
  if (role == Role::Worker) {
    if (!r.rank) n.fail("rank", n.name("rank") + " is not set");
    check_below(n, "rank", *r.rank, "world_size", info.world_size, "ranks");
    info.rank = *r.rank;
    if (info.current_endpoint.empty() && !info.worker_endpoints.empty())
      info.current_endpoint = info.worker_endpoints[info.rank];
  } else {
    const auto& servers = info.server_endpoints;
    int index = -1;
    if (r.server_index) {
      index = *r.server_index;
      if (r.rank && *r.rank != index)
        n.fail("rank", n.show("rank", *r.rank) + " disagrees with " + n.show("server_index", index) +
                           " (a server's rank is its server index)");
    } else if (r.rank) {
      index = *r.rank;
    } else if (!info.current_endpoint.empty()) {
      if (servers.empty())
        n.fail("server_endpoints", n.name("server_endpoints") + " is not set, so the index of server " +
                                       n.show("current_endpoint", info.current_endpoint) + " is unknown");
      auto it = std::find(servers.begin(), servers.end(), info.current_endpoint);
      if (it == servers.end())
        n.fail("current_endpoint", n.show("current_endpoint", info.current_endpoint) + " is not in " +
                                       n.show_list("server_endpoints", servers));
      index = static_cast<int>(it - servers.begin());
    } else {
      n.fail("current_endpoint", "a server needs " + n.name("server_index") + ", or " + n.name("current_endpoint") +
                                     " listed in " + n.name("server_endpoints"));
    }
    if (!servers.empty()) {
      if (index >= static_cast<int>(servers.size()))
        n.fail(r.server_index ? "server_index" : "rank",
               n.show(r.server_index ? "server_index" : "rank", index) + " is out of range for " +
                   n.show_list("server_endpoints", servers) + " (" + std::to_string(servers.size()) + " servers)");
      if (info.current_endpoint.empty()) info.current_endpoint = servers[index];
    }
    info.server_index = index;
    info.rank = index;
    count = servers.empty() ? 1 : static_cast<int>(servers.size());
  }

  info.nnodes = r.nnodes.value_or(1);
  int id = info.rank;
  if (r.local_world_size) {
    info.local_world_size = *r.local_world_size;
  } else if (info.nnodes == 1) {
    info.local_world_size = count;
  } else {
    info.local_world_size = count % info.nnodes == 0 ? count / info.nnodes : 1;
  }
  info.local_rank = r.local_rank.value_or(id % info.local_world_size);
  check_below(n, "local_rank", info.local_rank, "local_world_size", info.local_world_size, "local ranks");
  if (r.node_rank) {
    info.node_rank = *r.node_rank;
  } else {
    int guess = id / info.local_world_size;
    info.node_rank = guess < info.nnodes ? guess : 0;
  }
  check_below(n, "node_rank", info.node_rank, "nnodes", info.nnodes, "node ranks");
  return info;
}

std::optional<std::string> EnvReader::get(const std::string& var) const {
  auto it = env_.find(var);
  if (it == env_.end()) return std::nullopt;
  std::string v = trim(it->second);
  if (v.empty()) return std::nullopt;
  return v;
}

std::optional<int> EnvReader::get_int(const std::string& var) const {
  auto v = get(var);
  if (!v) return std::nullopt;
  int out = 0;
  const char* begin = v->data();
  const char* end = v->data() + v->size();
  if (*begin == '+') ++begin;
  auto [p, ec] = std::from_chars(begin, end, out);
  if (ec == std::errc::result_out_of_range) throw InvalidUsage(var + "='" + *v + "' is out of range");
  if (ec != std::errc() || p != end) throw InvalidUsage(var + "='" + *v + "' is not an integer");
  return out;
}

std::optional<std::vector<std::string>> EnvReader::get_list(const std::string& var) const {
  auto v = get(var);
  if (!v) return std::nullopt;
  std::vector<std::string> out;
  for (const std::string& item : sdk::split(*v, ','))
    if (std::string t = trim(item); !t.empty()) out.push_back(std::move(t));
  return out;
}

std::string EnvNamer::name(const std::string& field) const {
  auto it = names_.find(field);
  return it != names_.end() ? it->second : field;
}
std::string EnvNamer::show(const std::string& field, const std::string& value) const {
  return name(field) + "=" + value;
}
std::string EnvNamer::show_list(const std::string& field, const std::vector<std::string>& v) const {
  return name(field) + "=" + join(v, ",");
}
void EnvNamer::fail(const std::string&, const std::string& message) const { throw InvalidUsage(message); }

FieldNames read_placement(const EnvReader& e, const env::RoleVars& s, RawRole& r) {
  const env::RoleVars& d = env::kDtrain;
  FieldNames names;
  struct Field {
    const char* field;
    std::optional<int>& value;
    const char* dtrain;
    const char* own;
  };
  for (const Field& f :
       {Field{"local_rank", r.local_rank, d.local_rank, s.local_rank},
        Field{"local_world_size", r.local_world_size, d.local_world_size, s.local_world_size},
        Field{"node_rank", r.node_rank, d.node_rank, s.node_rank}, Field{"nnodes", r.nnodes, d.nnodes, s.nnodes},
        Field{"restart_count", r.restart_count, d.restart_count, s.restart_count}}) {
    f.value = e.get_int(f.dtrain);
    names[f.field] = f.dtrain;
    if (!f.own) continue;
    if (!f.value) f.value = e.get_int(f.own);
    names[f.field] = f.own;
  }
  r.store = e.get(env::kStore);
  names["store"] = env::kStore;
  r.job_id = e.get(env::kJobId).value_or("");
  r.job_token = e.get(env::kJobToken).value_or("");
  for (auto [field, var] :
       {std::pair{"rank", s.rank}, std::pair{"world_size", s.world_size}, std::pair{"server_index", s.server_index},
        std::pair{"worker_endpoints", s.worker_endpoints}, std::pair{"server_endpoints", s.server_endpoints},
        std::pair{"current_endpoint", s.current_endpoint}})
    if (var) names[field] = var;
  return names;
}

FieldNames read_ranked(const EnvReader& e, const env::RoleVars& s, RawRole& r) {
  FieldNames names = read_placement(e, s, r);
  r.rank = e.get_int(s.rank);
  r.world_size = e.get_int(s.world_size);
  return names;
}

uint16_t port_from_id(const std::string& id) {
  uint32_t h = 2166136261u;
  for (unsigned char c : id) h = (h ^ c) * 16777619u;
  return static_cast<uint16_t>(20000 + h % 10000);
}

// The store endpoint rank 0 serves when no launcher does.
namespace {

std::string self_hosted_endpoint(const EnvReader& e, int nnodes, const std::string& scheduler,
                                 const std::string& job_id, int port_offset) {
  if (auto s = e.get(env::kStore)) return *s;
  auto addr = e.get(env::kMasterAddr);
  auto port = e.get_int(env::kMasterPort);
  if (addr && port) return *addr + ":" + std::to_string(*port + port_offset);
  if (nnodes > 1)
    throw InvalidUsage("a " + scheduler + " job on " + std::to_string(nnodes) +
                       " machines needs MASTER_ADDR and MASTER_PORT (or DTRAIN_STORE=host:port) to find the store "
                       "that rank 0 serves");
  return "127.0.0.1:" + std::to_string(port ? *port + port_offset : port_from_id(scheduler + job_id));
}

}  // namespace

RoleInfo resolve_scheduler(const EnvReader& e, RawRole r, const FieldNames& names, const std::string& scheduler,
                           const std::string& job_id, int port_offset) {
  RoleInfo probe = build(r, Role::Worker, EnvNamer(names), scheduler + " env");
  r.store = self_hosted_endpoint(e, probe.nnodes, scheduler, job_id, port_offset);
  if (r.job_id.empty()) r.job_id = scheduler + "-" + job_id;
  RoleInfo info = build(r, Role::Worker, EnvNamer(names), scheduler + " env");
  info.self_hosted_store = !e.has(env::kStore);
  return info;
}

}  // namespace dtrain::roles
