#pragma once

// The environment variables of each role source, declared once: the launcher
// (apps/dtrain/environment.cc) writes them into every process and the role
// maker (core/src/roles/) reads them back. A null name: the source has no
// such variable. Header-only, no state.

namespace dtrain::env {

// One source's names for the fields of a role (RoleInfo, role_maker.h).
struct RoleVars {
  const char* source;  // as RoleInfo::source says it: "dtrain env", ...
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
  const char* node_rank;
  const char* nnodes;
  const char* restart_count;
  const char* role;  // worker or server
  const char* server_index;
  const char* worker_endpoints;
  const char* server_endpoints;
  const char* current_endpoint;
};

inline constexpr RoleVars kDtrain = {
    "dtrain env",        "DTRAIN_RANK",          "DTRAIN_WORLD_SIZE",       "DTRAIN_LOCAL_RANK",
    "DTRAIN_LOCAL_WORLD_SIZE", "DTRAIN_NODE_RANK", "DTRAIN_NNODES",         "DTRAIN_RESTART_COUNT",
    "DTRAIN_ROLE",       "DTRAIN_SERVER_INDEX",  "DTRAIN_WORKER_ENDPOINTS", "DTRAIN_SERVER_ENDPOINTS",
    "DTRAIN_CURRENT_ENDPOINT"};
// dtrain's variables beside the role fields.
inline constexpr char kStore[] = "DTRAIN_STORE";
inline constexpr char kJobId[] = "DTRAIN_JOB_ID";
inline constexpr char kJobToken[] = "DTRAIN_JOB_TOKEN";

// Paddle's launch (collective and PS). Paddle names no node rank or node count;
// PADDLE_RANK_IN_NODE is written for its scripts, not read.
inline constexpr RoleVars kPaddle = {
    "paddle env",          "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", nullptr, nullptr, nullptr, nullptr, nullptr,
    "TRAINING_ROLE",       "PADDLE_PSERVER_ID", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_PSERVERS_IP_PORT_LIST",
    "PADDLE_CURRENT_ENDPOINT"};
inline constexpr char kPaddleRankInNode[] = "PADDLE_RANK_IN_NODE";
inline constexpr char kPaddlePodIp[] = "POD_IP";
inline constexpr char kPaddlePort[] = "PADDLE_PORT";

// torchrun (torch.distributed.run and its elastic agent).
inline constexpr RoleVars kTorchrun = {
    "torchrun env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT", nullptr, nullptr, nullptr, nullptr, nullptr};
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
inline constexpr char kTorchrunRunId[] = "TORCHELASTIC_RUN_ID";

// Open MPI's mpirun (read only: dtrain does not write them).
inline constexpr RoleVars kOmpi = {
    "mpirun env", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};

// Slurm's srun (read only). The local world size is this node's entry of a
// tasks-per-node list such as "2(x3),1".
inline constexpr RoleVars kSlurm = {
    "slurm env", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "SLURM_NODEID", "SLURM_NNODES",
    nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
inline constexpr const char* kSlurmTasksPerNode[] = {"SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"};
inline constexpr const char* kSlurmNodeList[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"};

}  // namespace dtrain::env
