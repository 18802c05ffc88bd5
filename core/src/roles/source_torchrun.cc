// torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...): under torchrun
// itself, or under dtrain's launcher, which writes them for Python programs.
#include <algorithm>

#include "role_fields.h"

namespace dtrain::roles {

// A named namespace: the core builds in unity batches under the sanitizers,
// where every source's applies() and resolve() meet.
namespace torchrun_env {

const env::RoleVars& kVars = env::kTorchrun;

bool applies(const EnvReader& e) { return e.has(kVars.rank) && e.has(kVars.world_size); }

RoleInfo resolve(const EnvReader& e) {
  RawRole r;
  FieldNames names = read_ranked(e, kVars, r);
  if (!r.nnodes && r.world_size && r.local_world_size && *r.local_world_size > 0)
    r.nnodes = std::max(1, *r.world_size / *r.local_world_size);
  // A real torchrun already serves its own store on MASTER_PORT.
  int offset = e.has(env::kTorchrunRunId) ? 1 : 0;
  return resolve_scheduler(e, r, names, "torchrun", e.get(env::kTorchrunRunId).value_or("local"), offset);
}

}  // namespace torchrun_env

const EnvSource kTorchrunSource = {torchrun_env::applies, torchrun_env::resolve};

}  // namespace dtrain::roles
