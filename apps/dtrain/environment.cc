#include "environment.h"

#include <algorithm>
#include <filesystem>
#include <cstdlib>

#include "dtrain/endpoint.h"
#include "dtrain/env_names.h"
#include "dtrain/sdk/strings.h"
#include "net.h"
#include "program.h"

namespace dtrain::launch {

namespace {

// The variables each role source reads, declared once (dtrain/env_names.h).
const env::RoleVars& kDtrainVars = env::kDtrain;
const env::RoleVars& kPaddleVars = env::kPaddle;
const env::RoleVars& kTorchrunVars = env::kTorchrun;

// libdtrain_portrange.so, next to libdtrain_core (build/lib, or the install's lib folder).
std::string port_range_preload() {
  const std::string dir = core_library_dir();
  if (dir.empty()) return "";
  auto lib = std::filesystem::path(dir) / "libdtrain_portrange.so";
  return std::filesystem::exists(lib) ? lib.string() : "";
}

// Gloo's listeners (the gloo plugin's, c10d Gloo's in a Python program, a PS
// job's workers' side communicator, gloo by default) bind port 0: only the
// preload places them in the range. Where the launcher knows the only
// transport and it takes a range itself (a collective job on ucx: UCX's TCP
// listeners through UCX_TCP_PORT_RANGE), nothing is preloaded.
bool needs_port_preload(const JobPlan& p) {
  return p.options.backend != "ucx" || !p.options.python.empty() || !p.server_eps.empty();
}

bool user_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

// torchrun's contract (torch.distributed.run / elastic agent), given to
// workers only: a parameter-server job's workers form a group of their own.
void add_torchrun_environment(std::map<std::string, std::string>& env, const JobPlan& p, const Slot& s,
                              int local_workers, int attempt) {
  const std::string rank = std::to_string(s.index), world = std::to_string(p.worker_eps.size());
  const auto master = parse_host_port(p.worker_eps.front());
  env.insert({{kTorchrunVars.rank, rank},
              {kTorchrunVars.world_size, world},
              {kTorchrunVars.local_rank, std::to_string(s.local)},
              {kTorchrunVars.local_world_size, std::to_string(local_workers)},
              {kTorchrunVars.node_rank, std::to_string(p.machines.node)},
              {env::kTorchrunGroupWorldSize, std::to_string(p.machines.nnodes)},
              {"ROLE_RANK", rank},
              {"ROLE_WORLD_SIZE", world},
              {"ROLE_NAME", "default"},
              // Worker 0's endpoint: reserved for it by the launcher (inside the
              // --start_port range), where its c10d TCPStore binds, as rank 0's
              // endpoint serves Paddle's own rendezvous.
              {env::kMasterAddr, master.first},
              {env::kMasterPort, std::to_string(master.second)},
              {kTorchrunVars.restart_count, std::to_string(attempt)},
              {"TORCHELASTIC_MAX_RESTARTS", std::to_string(p.options.max_restarts)},
              {env::kTorchrunRunId, p.job_id},
              {"TORCHELASTIC_ERROR_FILE", p.python_error_file(s)}});
  if (!user_set("GLOO_SOCKET_IFNAME")) {
    const std::string iface = local_iface_of(p.machines.my_ip);
    if (!iface.empty()) env["GLOO_SOCKET_IFNAME"] = iface;
  }
}

}  // namespace

bool sets_omp_threads(const JobPlan& p) { return p.slots.size() > 1 && !user_set("OMP_NUM_THREADS"); }

std::map<std::string, std::string> process_environment(const JobPlan& p, const Slot& s, int attempt) {
  const LaunchOptions& o = p.options;
  const std::string workers = sdk::join(p.worker_eps);
  int local_same =
      static_cast<int>(std::count_if(p.slots.begin(), p.slots.end(), [&](const Slot& x) { return x.role == s.role; }));
  std::map<std::string, std::string> env = {
      {kDtrainVars.role, s.role_name()},
      {kDtrainVars.world_size, std::to_string(p.worker_eps.size())},
      {kDtrainVars.local_rank, std::to_string(s.local)},
      {kDtrainVars.local_world_size, std::to_string(local_same)},
      {kDtrainVars.node_rank, std::to_string(p.machines.node)},
      {kDtrainVars.nnodes, std::to_string(p.machines.nnodes)},
      {env::kStore, p.store_endpoint},
      {env::kJobToken, p.token},
      {env::kJobId, p.job_id},
      {kDtrainVars.restart_count, std::to_string(attempt)},
      {kDtrainVars.worker_endpoints, workers},
      {kDtrainVars.current_endpoint, s.endpoint},
      {"DTRAIN_HOST_IP", p.machines.my_ip},
      {"DTRAIN_LOG_DIR", o.log_dir},
      {"DTRAIN_ERROR_FILE", p.error_file(s)},
      {kPaddleVars.world_size, std::to_string(p.worker_eps.size())},
      {kPaddleVars.worker_endpoints, workers},
      {kPaddleVars.current_endpoint, s.endpoint},
      {env::kPaddleRankInNode, std::to_string(s.local)},
      {env::kPaddlePodIp, p.machines.my_ip},
      {kPaddleVars.role, s.role == SlotRole::Worker ? "TRAINER" : "PSERVER"},
  };
  if (!p.server_eps.empty()) {
    env[kDtrainVars.server_endpoints] = sdk::join(p.server_eps);
    env[kPaddleVars.server_endpoints] = sdk::join(p.server_eps);
  }
  if (s.role == SlotRole::Worker) {
    env[kDtrainVars.rank] = std::to_string(s.index);
    env[kPaddleVars.rank] = std::to_string(s.index);
  } else {
    env[kDtrainVars.server_index] = std::to_string(s.index);
    env[env::kPaddlePort] = std::to_string(parse_host_port(s.endpoint).second);
  }
  if (!s.port_range.empty()) {
    env["DTRAIN_PORT_RANGE"] = s.port_range;
    if (!std::getenv("UCX_TCP_PORT_RANGE")) env["UCX_TCP_PORT_RANGE"] = s.port_range;
    static const std::string preload = port_range_preload();
    if (!preload.empty() && needs_port_preload(p)) {
      const char* user = std::getenv("LD_PRELOAD");
      env["LD_PRELOAD"] = user && *user ? preload + ":" + user : preload;
    }
  }
  if (s.role == SlotRole::Worker) add_torchrun_environment(env, p, s, local_same, attempt);
  if (sets_omp_threads(p)) env["OMP_NUM_THREADS"] = "1";
  static const std::string package = python_package_dir();
  if (!package.empty()) {
    const char* user = std::getenv("PYTHONPATH");
    env["PYTHONPATH"] = user && *user ? package + ":" + user : package;
  }
  if (!p.elastic_dir.empty()) env["DTRAIN_ELASTIC_DIR"] = p.elastic_dir;
  if (!o.python.empty()) env["DTRAIN_PYTHON"] = o.python;
  if (!o.backend.empty()) env["DTRAIN_BACKEND"] = o.backend;
  if (!o.log_level.empty()) env["DTRAIN_LOG_LEVEL"] = o.log_level;
  if (!s.device.empty()) {
    env["DTRAIN_DEVICE"] = s.device;
    env["FLAGS_selected_gpus"] = s.device;
  }
  return env;
}

}  // namespace dtrain::launch
