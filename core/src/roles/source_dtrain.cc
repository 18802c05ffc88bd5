// dtrain's own variables, as its launcher writes them (DTRAIN_RANK, ...).
#include "dtrain/error.h"
#include "role_fields.h"

namespace dtrain::roles {

// A named namespace: the core builds in unity batches under the sanitizers,
// where every source's applies() and resolve() meet.
namespace dtrain_env {

const env::RoleVars& kVars = env::kDtrain;

bool applies(const EnvReader& e) {
  return e.has(kVars.rank) || e.has(kVars.world_size) || e.has(kVars.role) || e.has(kVars.server_index);
}

RoleInfo resolve(const EnvReader& e) {
  RawRole r;
  FieldNames names = read_ranked(e, kVars, r);
  r.server_index = e.get_int(kVars.server_index);
  r.worker_endpoints = e.get_list(kVars.worker_endpoints);
  r.server_endpoints = e.get_list(kVars.server_endpoints);
  r.current_endpoint = e.get(kVars.current_endpoint);
  Role role = Role::Worker;
  if (auto text = e.get(kVars.role)) {
    auto parsed = parse_role(*text);
    if (!parsed) throw InvalidUsage(std::string(kVars.role) + "='" + *text + "' must be worker or server");
    role = *parsed;
  }
  return build(r, role, EnvNamer(names), kVars.source);
}

}  // namespace dtrain_env

const EnvSource kDtrainSource = {dtrain_env::applies, dtrain_env::resolve};

}  // namespace dtrain::roles
