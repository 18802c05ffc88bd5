#include "job/job_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "dtrain/endpoint.h"
#include "dtrain/error.h"
#include "dtrain/job_secret.h"
#include "dtrain/log.h"

namespace dtrain {

namespace {

bool is_loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr);
  return false;
}

// Debian maps a machine's own host name to 127.0.1.1: a store bound there is
// out of the other machines' reach however they resolve the name.
void check_reachable_bind(const std::string& host, const RoleInfo& role) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return;  // the bind reports it
  bool all_loopback = true;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) all_loopback = all_loopback && is_loopback(ai->ai_addr);
  ::freeaddrinfo(res);
  if (all_loopback)
    throw InvalidUsage("the job runs on " + std::to_string(role.nnodes) + " machines but its store address " +
                       role.store_endpoint + " (" + role.source + ") is a loopback address on this machine, which " +
                       "serves the store: the other machines cannot reach it; give MASTER_ADDR (or DTRAIN_STORE) " +
                       "this machine's network address");
}

}  // namespace

JobStore connect_job_store(const RoleInfo& role, bool serves, bool multi_machine, std::chrono::milliseconds timeout) {
  auto [host, port] = parse_host_port(role.store_endpoint);
  std::string token = role.job_token;
  JobStore js;
  if (role.self_hosted_store) {
    if (multi_machine) {
      JobSecret secret = resolve_job_secret(secret_options_from_env(), role.job_id, true);
      token = secret.token;
      if (secret.open && serves)
        log_warn("OPEN JOB: no secret (DTRAIN_INSECURE_OPEN_JOB=1); any host that can reach " + role.store_endpoint +
                 " can read and write the job's store");
    } else if (token.empty()) {
      token = "dtrain-self-hosted:" + role.job_id;
    }
    if (serves) {
      if (multi_machine) check_reachable_bind(host, role);
      js.server = std::make_shared<TcpStoreServer>(host, port, token);
      log_info("serving the job store on " + role.store_endpoint + " (" + role.source + ")");
    }
  }
  js.token = token;
  // Each attempt of a restarted job rendezvous in its own key space.
  js.store = std::make_shared<PrefixStore>("run" + std::to_string(role.restart_count),
                                           std::make_shared<TcpStore>(host, port, token, timeout));
  return js;
}

CommOptions worker_comm_options(const RoleInfo& role, std::shared_ptr<Store> store, std::string name,
                                std::string config_toml, std::chrono::milliseconds timeout) {
  CommOptions co;
  co.role = Role::Worker;
  co.rank = role.rank;
  co.world_size = role.world_size;
  co.local_rank = role.local_rank;
  co.local_world_size = role.local_world_size;
  co.store = std::move(store);
  co.config_toml = std::move(config_toml);
  co.timeout = timeout;
  co.name = std::move(name);
  co.job_id = role.job_id;
  return co;
}

}  // namespace dtrain
