// Open MPI's mpirun variables (OMPI_COMM_WORLD_RANK, ...): rank 0 serves the store.
#include <algorithm>

#include "role_fields.h"

namespace dtrain::roles {

// A named namespace: the core builds in unity batches under the sanitizers,
// where every source's applies() and resolve() meet.
namespace ompi_env {

const env::RoleVars& kVars = env::kOmpi;

bool applies(const EnvReader& e) { return e.has(kVars.rank); }

RoleInfo resolve(const EnvReader& e) {
  RawRole r;
  FieldNames names = read_ranked(e, kVars, r);
  if (!r.nnodes && r.world_size && r.local_world_size && *r.local_world_size > 0)
    r.nnodes = std::max(1, (*r.world_size + *r.local_world_size - 1) / *r.local_world_size);
  if (!r.node_rank && r.rank && r.local_world_size && *r.local_world_size > 0)
    r.node_rank = *r.rank / *r.local_world_size;
  std::string id = e.get("OMPI_MCA_ess_base_jobid").value_or(e.get("PMIX_NAMESPACE").value_or("mpirun"));
  return resolve_scheduler(e, r, names, "mpirun", id);
}

}  // namespace ompi_env

const EnvSource kOmpiSource = {ompi_env::applies, ompi_env::resolve};

}  // namespace dtrain::roles
