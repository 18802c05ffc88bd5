#pragma once

// The environment variables of each role source, declared once: the launcher
// (apps/dtrain/environment.cc) writes them into every process and the role
// maker (core/src/roles/) reads them back. A null name: the source has no
// such variable. Header-only, no state.

namespace dtrain::env {

// One source's names for the fields of a role (RoleInfo, role_maker.h).
struct RoleVars {
  const char* source = nullptr;  // as RoleInfo::source says it: "dtrain env", ...
  const char* rank = nullptr;
  const char* world_size = nullptr;
  const char* local_rank = nullptr;
  const char* local_world_size = nullptr;
  const char* node_rank = nullptr;
  const char* nnodes = nullptr;
  const char* restart_count = nullptr;
  const char* role = nullptr;  // worker or server
  const char* server_index = nullptr;
  const char* worker_endpoints = nullptr;
  const char* server_endpoints = nullptr;
  const char* current_endpoint = nullptr;
};

inline constexpr RoleVars kDtrain = [] {
  RoleVars v{};
  v.source = "dtrain env";
  v.rank = "DTRAIN_RANK";
  v.world_size = "DTRAIN_WORLD_SIZE";
  v.local_rank = "DTRAIN_LOCAL_RANK";
  v.local_world_size = "DTRAIN_LOCAL_WORLD_SIZE";
  v.node_rank = "DTRAIN_NODE_RANK";
  v.nnodes = "DTRAIN_NNODES";
  v.restart_count = "DTRAIN_RESTART_COUNT";
  v.role = "DTRAIN_ROLE";
  v.server_index = "DTRAIN_SERVER_INDEX";
  v.worker_endpoints = "DTRAIN_WORKER_ENDPOINTS";
  v.server_endpoints = "DTRAIN_SERVER_ENDPOINTS";
  v.current_endpoint = "DTRAIN_CURRENT_ENDPOINT";
  return v;
}();
// dtrain's variables beside the role fields.
inline constexpr char kStore[] = "DTRAIN_STORE";
inline constexpr char kJobId[] = "DTRAIN_JOB_ID";
inline constexpr char kJobToken[] = "DTRAIN_JOB_TOKEN";

// Paddle's launch (collective and PS). Paddle names no node rank or node count;
// PADDLE_RANK_IN_NODE is written for its scripts, not read.
inline constexpr RoleVars kPaddle = [] {
  RoleVars v{};
  v.source = "paddle env";
  v.rank = "PADDLE_TRAINER_ID";
  v.world_size = "PADDLE_TRAINERS_NUM";
  v.role = "TRAINING_ROLE";
  v.server_index = "PADDLE_PSERVER_ID";
  v.worker_endpoints = "PADDLE_TRAINER_ENDPOINTS";
  v.server_endpoints = "PADDLE_PSERVERS_IP_PORT_LIST";
  v.current_endpoint = "PADDLE_CURRENT_ENDPOINT";
  return v;
}();
inline constexpr char kPaddleRankInNode[] = "PADDLE_RANK_IN_NODE";
inline constexpr char kPaddlePodIp[] = "POD_IP";
inline constexpr char kPaddlePort[] = "PADDLE_PORT";

// torchrun (torch.distributed.run and its elastic agent).
inline constexpr RoleVars kTorchrun = [] {
  RoleVars v{};
  v.source = "torchrun env";
  v.rank = "RANK";
  v.world_size = "WORLD_SIZE";
  v.local_rank = "LOCAL_RANK";
  v.local_world_size = "LOCAL_WORLD_SIZE";
  v.node_rank = "GROUP_RANK";
  v.restart_count = "TORCHELASTIC_RESTART_COUNT";
  return v;
}();
// Written for the program; the role maker takes the node count from
// WORLD_SIZE / LOCAL_WORLD_SIZE instead, as it always has.
inline constexpr char kTorchrunGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
inline constexpr char kTorchrunRunId[] = "TORCHELASTIC_RUN_ID";

// Open MPI's mpirun (read only: dtrain does not write them).
inline constexpr RoleVars kOmpi = [] {
  RoleVars v{};
  v.source = "mpirun env";
  v.rank = "OMPI_COMM_WORLD_RANK";
  v.world_size = "OMPI_COMM_WORLD_SIZE";
  v.local_rank = "OMPI_COMM_WORLD_LOCAL_RANK";
  v.local_world_size = "OMPI_COMM_WORLD_LOCAL_SIZE";
  return v;
}();

// Slurm's srun (read only). The local world size is this node's entry of a
// tasks-per-node list such as "2(x3),1".
inline constexpr RoleVars kSlurm = [] {
  RoleVars v{};
  v.source = "slurm env";
  v.rank = "SLURM_PROCID";
  v.world_size = "SLURM_NTASKS";
  v.local_rank = "SLURM_LOCALID";
  v.node_rank = "SLURM_NODEID";
  v.nnodes = "SLURM_NNODES";
  return v;
}();
inline constexpr const char* kSlurmTasksPerNode[] = {"SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"};
inline constexpr const char* kSlurmNodeList[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"};

}  // namespace dtrain::env
