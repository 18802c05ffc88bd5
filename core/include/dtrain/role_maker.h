#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dtrain {

class Config;

enum class Role { Worker = 0, Server = 1 };  // values match DT_ROLE_*
const char* to_string(Role r);

// Who this process is in the job (Paddle's role maker).
struct RoleInfo {
  Role role = Role::Worker;
  int rank = 0;              // index among processes of its role
  int world_size = 1;        // number of workers (collective world)
  int local_rank = 0;        // index on this machine
  int local_world_size = 1;  // processes of this role on this machine
  int node_rank = 0;
  int nnodes = 1;
  int server_index = -1;                      // for servers: index in server_endpoints
  int num_servers = 0;                        // parameter servers in the job (server_endpoints.size())
  std::vector<std::string> worker_endpoints;  // PADDLE_TRAINER_ENDPOINTS
  std::vector<std::string> server_endpoints;  // PADDLE_PSERVERS_IP_PORT_LIST
  std::string current_endpoint;               // PADDLE_CURRENT_ENDPOINT
  std::string store_endpoint;                 // "host:port" of the TcpStore
  std::string job_token;
  std::string job_id;
  int restart_count = 0;
  // No launcher serves the store (Slurm, mpirun, torchrun): rank 0 serves it
  // on store_endpoint's port and the others connect to it. In Paddle's
  // parameter-server mode set by hand, server 0 serves it (join_ps).
  bool self_hosted_store = false;
  std::string source;            // which maker produced it: "dtrain env", "paddle env", "toml", ...
  std::string describe() const;  // one line for logs
};

// Produces a RoleInfo; throws ConfigError / InvalidUsage with a message naming
// the variable or key that is missing or malformed.
class RoleMaker {
 public:
  virtual ~RoleMaker() = default;
  virtual RoleInfo resolve() const = 0;
  virtual std::string name() const = 0;
};

// Reads the process environment (or a given map, for tests).
//   DTRAIN_RANK, DTRAIN_WORLD_SIZE, DTRAIN_LOCAL_RANK, DTRAIN_LOCAL_WORLD_SIZE,
//   DTRAIN_ROLE (worker|server), DTRAIN_NODE_RANK, DTRAIN_NNODES, DTRAIN_STORE
//   (host:port), DTRAIN_JOB_TOKEN, DTRAIN_JOB_ID, DTRAIN_RESTART_COUNT,
//   DTRAIN_SERVER_INDEX, DTRAIN_WORKER_ENDPOINTS, DTRAIN_SERVER_ENDPOINTS,
//   DTRAIN_CURRENT_ENDPOINT
// and, when no DTRAIN_RANK is set, the first of these that is present:
//   Paddle: PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS,
//     PADDLE_CURRENT_ENDPOINT, TRAINING_ROLE (TRAINER|PSERVER),
//     PADDLE_PSERVERS_IP_PORT_LIST, POD_IP, PADDLE_PORT. Parameter-server mode
//     (TRAINING_ROLE=PSERVER, or a server list): PADDLE_PSERVERS_IP_PORT_LIST
//     and PADDLE_TRAINERS_NUM (or PADDLE_TRAINER_ENDPOINTS) are required; a
//     server's index is the place of POD_IP:PADDLE_PORT (else
//     PADDLE_CURRENT_ENDPOINT) in the list, a trainer's id PADDLE_TRAINER_ID.
//     Without DTRAIN_STORE (no launcher) the role says self_hosted_store and
//     names the first server's endpoint: server 0 serves the store there
//     (its PS transport binds another port), everyone else connects to it;
//     the job id is derived from the server list, so it is the same everywhere;
//   torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
//     MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT;
//   Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE;
//   Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES,
//     SLURM_NTASKS_PER_NODE.
//   Paddle collective (PADDLE_TRAINER_ENDPOINTS of several trainers, no server
//     list): without DTRAIN_STORE, trainer 0 serves the store on its own
//     endpoint (PADDLE_TRAINER_ENDPOINTS' first entry); machines, node rank
//     and local ranks follow the endpoints' hosts;
//   Slurm across machines (SLURM_NNODES > 1) without MASTER_ADDR: the store
//     on the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST (compressed
//     forms such as node[01-04,07] expanded), on MASTER_PORT or a port derived
//     from SLURM_JOB_ID;
// Under torchrun, mpirun and Slurm no launcher serves a store, so the role says
// self_hosted_store and names the endpoint rank 0 serves: DTRAIN_STORE if set,
// else MASTER_ADDR:MASTER_PORT (MASTER_PORT+1 under a real torchrun, whose own
// store holds MASTER_PORT), else on a single machine 127.0.0.1 and a port
// derived from the scheduler's job id; several machines need MASTER_ADDR.
class EnvRoleMaker : public RoleMaker {
 public:
  EnvRoleMaker();  // the process environment
  explicit EnvRoleMaker(std::map<std::string, std::string> env);
  RoleInfo resolve() const override;
  std::string name() const override { return "env"; }
  // True if the environment names a rank in any form this maker knows.
  bool applies() const;

 private:
  std::map<std::string, std::string> env_;
};

// Expands a Slurm host list: "node[01-03,07],login1" -> node01 node02 node03
// node07 login1 (zero padding kept; several bracket groups in one name expand
// as a product). InvalidUsage on an unmatched bracket or a bad range.
std::vector<std::string> expand_slurm_hostlist(const std::string& list);

// User-defined (Paddle's UserDefinedRoleMaker) from a TOML table, e.g.
//   [role]  rank = 0  world_size = 2  role = "worker"
//           worker_endpoints = ["127.0.0.1:6170", "127.0.0.1:6171"]
//           server_endpoints = []  store = "127.0.0.1:6170"  local_rank = 0 ...
class TomlRoleMaker : public RoleMaker {
 public:
  TomlRoleMaker(const Config& config, std::string table = "role");
  RoleInfo resolve() const override;
  std::string name() const override { return "toml"; }

 private:
  std::shared_ptr<const Config> config_;
  std::string table_;
};

// The environment snapshot as a map (for EnvRoleMaker and tests).
std::map<std::string, std::string> current_environment();

}  // namespace dtrain
