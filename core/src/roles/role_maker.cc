#include "dtrain/role_maker.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>

#include "dtrain/config.h"
#include "dtrain/endpoint.h"
#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"

extern char** environ;

namespace dtrain {

namespace {

using sdk::join;
using sdk::lower;
using sdk::trim;

std::optional<Role> parse_role(const std::string& text) {
  std::string s = lower(trim(text));
  if (s == "worker" || s == "trainer") return Role::Worker;
  if (s == "server" || s == "pserver") return Role::Server;
  return std::nullopt;
}

bool is_host_port(const std::string& s) {
  size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  int port = 0;
  const char* begin = s.data() + colon + 1;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(begin, end, port);
  return ec == std::errc() && p == end && port > 0 && port <= 65535;
}

// Role fields as read from one source, before defaults and checks.
struct RawRole {
  std::optional<int> rank, world_size, local_rank, local_world_size, node_rank, nnodes, server_index, restart_count;
  std::optional<std::string> current_endpoint, store;
  std::optional<std::vector<std::string>> worker_endpoints, server_endpoints;
  std::string job_id, job_token;
};

// How a source names its fields in messages and reports a problem.
class Namer {
 public:
  virtual ~Namer() = default;
  virtual std::string name(const std::string& field) const = 0;
  virtual std::string show(const std::string& field, const std::string& value) const = 0;
  virtual std::string show_list(const std::string& field, const std::vector<std::string>& v) const = 0;
  [[noreturn]] virtual void fail(const std::string& field, const std::string& message) const = 0;

  std::string show(const std::string& field, int value) const { return show(field, std::to_string(value)); }
};

class EnvNamer : public Namer {
 public:
  explicit EnvNamer(std::map<std::string, std::string> names) : names_(std::move(names)) {}
  std::string name(const std::string& field) const override {
    auto it = names_.find(field);
    return it != names_.end() ? it->second : field;
  }
  std::string show(const std::string& field, const std::string& value) const override {
    return name(field) + "=" + value;
  }
  std::string show_list(const std::string& field, const std::vector<std::string>& v) const override {
    return name(field) + "=" + join(v, ",");
  }
  [[noreturn]] void fail(const std::string&, const std::string& message) const override { throw InvalidUsage(message); }

 private:
  std::map<std::string, std::string> names_;
};

class TomlNamer : public Namer {
 public:
  TomlNamer(const Config& config, std::string table) : config_(config), table_(std::move(table)) {}
  std::string name(const std::string& field) const override { return table_ + "." + field; }
  std::string show(const std::string& field, const std::string& value) const override {
    return name(field) + " = " + value;
  }
  std::string show_list(const std::string& field, const std::vector<std::string>& v) const override {
    std::vector<std::string> quoted;
    for (const std::string& s : v) quoted.push_back("\"" + s + "\"");
    return name(field) + " = [" + join(quoted, ", ") + "]";
  }
  [[noreturn]] void fail(const std::string& field, const std::string& message) const override {
    ConfigLocation loc = config_.location_of(name(field));
    if (loc.line == 0) loc = config_.location_of(table_);
    throw ConfigError(loc.file, loc.line, loc.column, "", message);
  }

 private:
  const Config& config_;
  std::string table_;
};

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

class EnvReader {
 public:
  explicit EnvReader(const std::map<std::string, std::string>& env) : env_(env) {}

  std::optional<std::string> get(const std::string& var) const {
    auto it = env_.find(var);
    if (it == env_.end()) return std::nullopt;
    std::string v = trim(it->second);
    if (v.empty()) return std::nullopt;
    return v;
  }
  bool has(const std::string& var) const { return get(var).has_value(); }

  std::optional<int> get_int(const std::string& var) const {
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

  std::optional<std::vector<std::string>> get_list(const std::string& var) const {
    auto v = get(var);
    if (!v) return std::nullopt;
    std::vector<std::string> out;
    for (const std::string& item : sdk::split(*v, ','))
      if (std::string t = trim(item); !t.empty()) out.push_back(std::move(t));
    return out;
  }

 private:
  const std::map<std::string, std::string>& env_;
};

void read_common(const EnvReader& e, RawRole& r) {
  r.local_rank = e.get_int("DTRAIN_LOCAL_RANK");
  r.local_world_size = e.get_int("DTRAIN_LOCAL_WORLD_SIZE");
  r.node_rank = e.get_int("DTRAIN_NODE_RANK");
  r.nnodes = e.get_int("DTRAIN_NNODES");
  r.restart_count = e.get_int("DTRAIN_RESTART_COUNT");
  r.store = e.get("DTRAIN_STORE");
  r.job_id = e.get("DTRAIN_JOB_ID").value_or("");
  r.job_token = e.get("DTRAIN_JOB_TOKEN").value_or("");
}

const std::map<std::string, std::string> kCommonNames = {
    {"local_rank", "DTRAIN_LOCAL_RANK"},       {"local_world_size", "DTRAIN_LOCAL_WORLD_SIZE"},
    {"node_rank", "DTRAIN_NODE_RANK"},         {"nnodes", "DTRAIN_NNODES"},
    {"restart_count", "DTRAIN_RESTART_COUNT"}, {"store", "DTRAIN_STORE"}};

bool has_dtrain_rank(const EnvReader& e) {
  return e.has("DTRAIN_RANK") || e.has("DTRAIN_WORLD_SIZE") || e.has("DTRAIN_ROLE") || e.has("DTRAIN_SERVER_INDEX");
}

bool has_paddle_rank(const EnvReader& e) {
  return e.has("PADDLE_TRAINER_ID") || e.has("PADDLE_TRAINERS_NUM") || e.has("TRAINING_ROLE");
}

RoleInfo resolve_dtrain(const EnvReader& e) {
  RawRole r;
  read_common(e, r);
  r.rank = e.get_int("DTRAIN_RANK");
  r.world_size = e.get_int("DTRAIN_WORLD_SIZE");
  r.server_index = e.get_int("DTRAIN_SERVER_INDEX");
  r.worker_endpoints = e.get_list("DTRAIN_WORKER_ENDPOINTS");
  r.server_endpoints = e.get_list("DTRAIN_SERVER_ENDPOINTS");
  r.current_endpoint = e.get("DTRAIN_CURRENT_ENDPOINT");
  Role role = Role::Worker;
  if (auto text = e.get("DTRAIN_ROLE")) {
    auto parsed = parse_role(*text);
    if (!parsed) throw InvalidUsage("DTRAIN_ROLE='" + *text + "' must be worker or server");
    role = *parsed;
  }
  std::map<std::string, std::string> names = kCommonNames;
  names.insert({{"rank", "DTRAIN_RANK"},
                {"world_size", "DTRAIN_WORLD_SIZE"},
                {"server_index", "DTRAIN_SERVER_INDEX"},
                {"worker_endpoints", "DTRAIN_WORKER_ENDPOINTS"},
                {"server_endpoints", "DTRAIN_SERVER_ENDPOINTS"},
                {"current_endpoint", "DTRAIN_CURRENT_ENDPOINT"}});
  return build(r, role, EnvNamer(names), "dtrain env");
}

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

RoleInfo resolve_paddle(const EnvReader& e) {
  RawRole r;
  read_common(e, r);
  Role role = Role::Worker;
  if (auto text = e.get("TRAINING_ROLE")) {
    auto parsed = parse_role(*text);
    if (!parsed) throw InvalidUsage("TRAINING_ROLE='" + *text + "' must be TRAINER or PSERVER");
    role = *parsed;
  }
  std::map<std::string, std::string> names = kCommonNames;
  names.insert({{"rank", "PADDLE_TRAINER_ID"},
                {"world_size", "PADDLE_TRAINERS_NUM"},
                {"server_index", "PADDLE_PSERVER_ID"},
                {"worker_endpoints", "PADDLE_TRAINER_ENDPOINTS"},
                {"server_endpoints", "PADDLE_PSERVERS_IP_PORT_LIST"},
                {"current_endpoint", "PADDLE_CURRENT_ENDPOINT"}});
  r.world_size = e.get_int("PADDLE_TRAINERS_NUM");
  r.worker_endpoints = e.get_list("PADDLE_TRAINER_ENDPOINTS");
  r.server_endpoints = e.get_list("PADDLE_PSERVERS_IP_PORT_LIST");
  r.current_endpoint = e.get("PADDLE_CURRENT_ENDPOINT");
  auto ip = e.get("POD_IP");
  auto port = e.get("PADDLE_PORT");
  bool ps_mode = role == Role::Server || (r.server_endpoints && !r.server_endpoints->empty());
  if (role == Role::Server && (!r.server_endpoints || r.server_endpoints->empty()))
    throw InvalidUsage("TRAINING_ROLE=PSERVER needs PADDLE_PSERVERS_IP_PORT_LIST (the servers' ip:port list)");
  if (ps_mode && !r.world_size && !r.worker_endpoints)
    throw InvalidUsage("PADDLE_TRAINERS_NUM is required in parameter-server mode (PADDLE_PSERVERS_IP_PORT_LIST=" +
                       join(*r.server_endpoints, ",") + ")");
  if (role == Role::Worker) {
    r.rank = e.get_int("PADDLE_TRAINER_ID");
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
  RoleInfo info = build(r, role, EnvNamer(names), "paddle env");
  info.self_hosted_store = self_hosted;
  return info;
}

bool has_torchrun_rank(const EnvReader& e) { return e.has("RANK") && e.has("WORLD_SIZE"); }
bool has_ompi_rank(const EnvReader& e) { return e.has("OMPI_COMM_WORLD_RANK"); }
bool has_slurm_rank(const EnvReader& e) { return e.has("SLURM_PROCID") && e.has("SLURM_NTASKS"); }

uint16_t port_from_id(const std::string& id) {
  uint32_t h = 2166136261u;
  for (unsigned char c : id) h = (h ^ c) * 16777619u;
  return static_cast<uint16_t>(20000 + h % 10000);
}

// The store endpoint rank 0 serves when no launcher does.
std::string self_hosted_endpoint(const EnvReader& e, int nnodes, const std::string& scheduler,
                                 const std::string& job_id, int port_offset = 0) {
  if (auto s = e.get("DTRAIN_STORE")) return *s;
  auto addr = e.get("MASTER_ADDR");
  auto port = e.get_int("MASTER_PORT");
  if (addr && port) return *addr + ":" + std::to_string(*port + port_offset);
  if (nnodes > 1)
    throw InvalidUsage("a " + scheduler + " job on " + std::to_string(nnodes) +
                       " machines needs MASTER_ADDR and MASTER_PORT (or DTRAIN_STORE=host:port) to find the store "
                       "that rank 0 serves");
  return "127.0.0.1:" + std::to_string(port ? *port + port_offset : port_from_id(scheduler + job_id));
}

RoleInfo resolve_scheduler(const EnvReader& e, RawRole r, std::map<std::string, std::string> names,
                           const std::string& scheduler, const std::string& job_id, int port_offset = 0) {
  RoleInfo probe = build(r, Role::Worker, EnvNamer(names), scheduler + " env");
  r.store = self_hosted_endpoint(e, probe.nnodes, scheduler, job_id, port_offset);
  if (r.job_id.empty()) r.job_id = scheduler + "-" + job_id;
  RoleInfo info = build(r, Role::Worker, EnvNamer(names), scheduler + " env");
  info.self_hosted_store = !e.has("DTRAIN_STORE");
  return info;
}

RoleInfo resolve_torchrun(const EnvReader& e) {
  RawRole r;
  read_common(e, r);
  r.rank = e.get_int("RANK");
  r.world_size = e.get_int("WORLD_SIZE");
  if (!r.local_rank) r.local_rank = e.get_int("LOCAL_RANK");
  if (!r.local_world_size) r.local_world_size = e.get_int("LOCAL_WORLD_SIZE");
  if (!r.node_rank) r.node_rank = e.get_int("GROUP_RANK");
  if (!r.restart_count) r.restart_count = e.get_int("TORCHELASTIC_RESTART_COUNT");
  if (!r.nnodes && r.world_size && r.local_world_size && *r.local_world_size > 0)
    r.nnodes = std::max(1, *r.world_size / *r.local_world_size);
  std::map<std::string, std::string> names = kCommonNames;
  names.insert({{"rank", "RANK"}, {"world_size", "WORLD_SIZE"}});
  names["local_rank"] = "LOCAL_RANK";
  names["local_world_size"] = "LOCAL_WORLD_SIZE";
  names["node_rank"] = "GROUP_RANK";
  // A real torchrun already serves its own store on MASTER_PORT.
  int offset = e.has("TORCHELASTIC_RUN_ID") ? 1 : 0;
  return resolve_scheduler(e, r, names, "torchrun", e.get("TORCHELASTIC_RUN_ID").value_or("local"), offset);
}

RoleInfo resolve_ompi(const EnvReader& e) {
  RawRole r;
  read_common(e, r);
  r.rank = e.get_int("OMPI_COMM_WORLD_RANK");
  r.world_size = e.get_int("OMPI_COMM_WORLD_SIZE");
  if (!r.local_rank) r.local_rank = e.get_int("OMPI_COMM_WORLD_LOCAL_RANK");
  if (!r.local_world_size) r.local_world_size = e.get_int("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (!r.nnodes && r.world_size && r.local_world_size && *r.local_world_size > 0)
    r.nnodes = std::max(1, (*r.world_size + *r.local_world_size - 1) / *r.local_world_size);
  if (!r.node_rank && r.rank && r.local_world_size && *r.local_world_size > 0)
    r.node_rank = *r.rank / *r.local_world_size;
  std::map<std::string, std::string> names = kCommonNames;
  names.insert({{"rank", "OMPI_COMM_WORLD_RANK"}, {"world_size", "OMPI_COMM_WORLD_SIZE"}});
  names["local_rank"] = "OMPI_COMM_WORLD_LOCAL_RANK";
  names["local_world_size"] = "OMPI_COMM_WORLD_LOCAL_SIZE";
  std::string id = e.get("OMPI_MCA_ess_base_jobid").value_or(e.get("PMIX_NAMESPACE").value_or("mpirun"));
  return resolve_scheduler(e, r, names, "mpirun", id);
}

// "2(x3),1" -> tasks per node list; the entry for a node index.
std::optional<int> slurm_tasks_on_node(const std::string& spec, int node) {
  int index = 0;
  for (const std::string& item : sdk::split(spec, ',', /*skip_empty=*/false)) {
    int count = std::atoi(item.c_str());
    int repeat = 1;
    auto x = item.find("(x");
    if (x != std::string::npos) repeat = std::atoi(item.c_str() + x + 2);
    if (node < index + repeat) return count;
    index += repeat;
  }
  return std::nullopt;
}

RoleInfo resolve_slurm(const EnvReader& e) {
  RawRole r;
  read_common(e, r);
  r.rank = e.get_int("SLURM_PROCID");
  r.world_size = e.get_int("SLURM_NTASKS");
  if (!r.local_rank) r.local_rank = e.get_int("SLURM_LOCALID");
  if (!r.node_rank) r.node_rank = e.get_int("SLURM_NODEID");
  if (!r.nnodes) r.nnodes = e.get_int("SLURM_NNODES");
  if (!r.local_world_size) {
    auto spec = e.get("SLURM_TASKS_PER_NODE");
    if (!spec) spec = e.get("SLURM_NTASKS_PER_NODE");
    if (spec) r.local_world_size = slurm_tasks_on_node(*spec, r.node_rank.value_or(0));
  }
  std::map<std::string, std::string> names = kCommonNames;
  names.insert({{"rank", "SLURM_PROCID"}, {"world_size", "SLURM_NTASKS"}});
  names["local_rank"] = "SLURM_LOCALID";
  names["node_rank"] = "SLURM_NODEID";
  names["nnodes"] = "SLURM_NNODES";
  names["local_world_size"] = "SLURM_NTASKS_PER_NODE";
  std::string id = e.get("SLURM_JOB_ID").value_or("") + "." + e.get("SLURM_STEP_ID").value_or("");
  // Across machines without MASTER_ADDR: the store on the first host of the
  // job's node list, on MASTER_PORT or a port derived from the job id.
  if (r.nnodes.value_or(1) > 1 && !e.has("DTRAIN_STORE") && !e.has("MASTER_ADDR")) {
    auto list = e.get("SLURM_STEP_NODELIST");
    if (!list) list = e.get("SLURM_JOB_NODELIST");
    if (!list) list = e.get("SLURM_NODELIST");
    if (list) {
      auto hosts = expand_slurm_hostlist(*list);
      if (hosts.empty()) throw InvalidUsage("SLURM_JOB_NODELIST='" + *list + "' names no host");
      auto port = e.get_int("MASTER_PORT");
      r.store = format_host_port(
          hosts.front(),
          static_cast<uint16_t>(port ? *port : port_from_id("slurm" + e.get("SLURM_JOB_ID").value_or(""))));
      if (r.job_id.empty()) r.job_id = "slurm-" + id;
      RoleInfo info = build(r, Role::Worker, EnvNamer(names), "slurm env");
      info.self_hosted_store = true;
      return info;
    }
  }
  return resolve_scheduler(e, r, names, "slurm", id);
}

}  // namespace

const char* to_string(Role r) { return r == Role::Server ? "server" : "worker"; }

std::string RoleInfo::describe() const {
  std::ostringstream os;
  os << to_string(role);
  if (role == Role::Worker) {
    os << " rank " << rank << "/" << world_size;
  } else {
    os << " " << server_index;
    if (!server_endpoints.empty()) os << "/" << server_endpoints.size();
    os << " serving " << world_size << " worker" << (world_size == 1 ? "" : "s");
  }
  os << ", local " << local_rank << "/" << local_world_size << ", node " << node_rank << "/" << nnodes;
  if (!current_endpoint.empty()) os << ", endpoint " << current_endpoint;
  if (!store_endpoint.empty()) os << ", store " << store_endpoint;
  if (!job_id.empty()) os << ", job " << job_id;
  if (restart_count > 0) os << ", restart " << restart_count;
  os << " (" << (source.empty() ? "unknown" : source) << ")";
  return os.str();
}

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> env;
  for (char** p = environ; p && *p; ++p) {
    std::string entry = *p;
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

EnvRoleMaker::EnvRoleMaker() : env_(current_environment()) {}
EnvRoleMaker::EnvRoleMaker(std::map<std::string, std::string> env) : env_(std::move(env)) {}

bool EnvRoleMaker::applies() const {
  EnvReader e(env_);
  return has_dtrain_rank(e) || has_paddle_rank(e) || has_torchrun_rank(e) || has_ompi_rank(e) || has_slurm_rank(e);
}

RoleInfo EnvRoleMaker::resolve() const {
  EnvReader e(env_);
  if (has_dtrain_rank(e)) return resolve_dtrain(e);
  if (has_paddle_rank(e)) return resolve_paddle(e);
  if (has_torchrun_rank(e)) return resolve_torchrun(e);
  if (has_ompi_rank(e)) return resolve_ompi(e);
  if (has_slurm_rank(e)) return resolve_slurm(e);
  RawRole r;
  read_common(e, r);
  r.rank = 0;
  r.world_size = 1;
  RoleInfo info = build(r, Role::Worker, EnvNamer(kCommonNames), "default");
  return info;
}

TomlRoleMaker::TomlRoleMaker(const Config& config, std::string table)
    : config_(std::make_shared<const Config>(config)), table_(std::move(table)) {}

RoleInfo TomlRoleMaker::resolve() const {
  const Config& c = *config_;
  static const std::vector<std::string> kKeys = {
      "role",      "rank",   "world_size",       "local_rank",       "local_world_size",
      "node_rank", "nnodes", "worker_endpoints", "server_endpoints", "current_endpoint",
      "store",     "job_id"};
  if (!c.has(table_))
    throw ConfigError(c.source(), 0, 0, "", "the [" + table_ + "] table is missing (it says who this process is)");
  for (const std::string& key : c.keys_of(table_)) {
    if (std::find(kKeys.begin(), kKeys.end(), key) != kKeys.end()) continue;
    ConfigLocation loc = c.location_of(table_ + "." + key);
    std::string message = "unknown key '" + table_ + "." + key + "'";
    std::string suggestion = closest_match(key, kKeys);
    if (!suggestion.empty()) message += "; did you mean '" + table_ + "." + suggestion + "'?";
    throw ConfigError(loc.file, loc.line, loc.column, "", message);
  }

  TomlNamer namer(c, table_);
  auto get_int = [&](const std::string& field) -> std::optional<int> {
    std::string path = table_ + "." + field;
    if (!c.has(path)) return std::nullopt;
    int64_t v = c.get_int(path);
    if (v < INT_MIN || v > INT_MAX) namer.fail(field, namer.show(field, std::to_string(v)) + " is out of range");
    return static_cast<int>(v);
  };
  auto get_string = [&](const std::string& field) -> std::optional<std::string> {
    std::string path = table_ + "." + field;
    if (!c.has(path)) return std::nullopt;
    return c.get_string(path);
  };
  auto get_list = [&](const std::string& field) -> std::optional<std::vector<std::string>> {
    std::string path = table_ + "." + field;
    if (!c.has(path)) return std::nullopt;
    return c.get_string_list(path);
  };

  Role role = Role::Worker;
  if (auto text = get_string("role")) {
    auto parsed = parse_role(*text);
    if (!parsed) namer.fail("role", namer.show("role", "\"" + *text + "\"") + " must be \"worker\" or \"server\"");
    role = *parsed;
  }
  RawRole r;
  r.rank = get_int("rank");
  r.world_size = get_int("world_size");
  r.local_rank = get_int("local_rank");
  r.local_world_size = get_int("local_world_size");
  r.node_rank = get_int("node_rank");
  r.nnodes = get_int("nnodes");
  r.worker_endpoints = get_list("worker_endpoints");
  r.server_endpoints = get_list("server_endpoints");
  r.current_endpoint = get_string("current_endpoint");
  r.store = get_string("store");
  r.job_id = get_string("job_id").value_or("");
  return build(r, role, namer, "toml");
}

}  // namespace dtrain
