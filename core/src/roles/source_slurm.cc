// Slurm's srun variables (SLURM_PROCID, ...): the store on MASTER_ADDR, else
// on the first host of the job's node list.
#include <cstdlib>

#include "dtrain/endpoint.h"
#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"
#include "role_fields.h"

namespace dtrain::roles {

// A named namespace: the core builds in unity batches under the sanitizers,
// where every source's applies() and resolve() meet.
namespace slurm_env {

const env::RoleVars& kVars = env::kSlurm;

bool applies(const EnvReader& e) { return e.has(kVars.rank) && e.has(kVars.world_size); }

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

RoleInfo resolve(const EnvReader& e) {
  RawRole r;
  FieldNames names = read_ranked(e, kVars, r);
  if (!r.local_world_size) {
    for (const char* var : env::kSlurmTasksPerNode)
      if (auto spec = e.get(var)) {
        r.local_world_size = slurm_tasks_on_node(*spec, r.node_rank.value_or(0));
        break;
      }
  }
  names["local_world_size"] = env::kSlurmTasksPerNode[1];
  std::string id = e.get("SLURM_JOB_ID").value_or("") + "." + e.get("SLURM_STEP_ID").value_or("");
  // Across machines without MASTER_ADDR: the store on the first host of the
  // job's node list, on MASTER_PORT or a port derived from the job id.
  if (r.nnodes.value_or(1) > 1 && !e.has(env::kStore) && !e.has(env::kMasterAddr)) {
    std::optional<std::string> list;
    for (const char* var : env::kSlurmNodeList)
      if (!list) list = e.get(var);
    if (list) {
      auto hosts = expand_slurm_hostlist(*list);
      if (hosts.empty()) throw InvalidUsage("SLURM_JOB_NODELIST='" + *list + "' names no host");
      auto port = e.get_int(env::kMasterPort);
      r.store = format_host_port(
          hosts.front(),
          static_cast<uint16_t>(port ? *port : port_from_id("slurm" + e.get("SLURM_JOB_ID").value_or(""))));
      if (r.job_id.empty()) r.job_id = "slurm-" + id;
      RoleInfo info = build(r, Role::Worker, EnvNamer(names), kVars.source);
      info.self_hosted_store = true;
      return info;
    }
  }
  return resolve_scheduler(e, r, names, "slurm", id);
}

}  // namespace slurm_env

const EnvSource kSlurmSource = {slurm_env::applies, slurm_env::resolve};

}  // namespace dtrain::roles
