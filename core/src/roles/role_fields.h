#pragma once

// The role maker's inside, shared by its sources (one file each: source_*.cc)
// and by the TOML role maker (role_maker.cc): the raw fields one source read,
// how that source names them in messages, and build(), which applies the
// defaults and checks every field the same way whatever the source.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/env_names.h"
#include "dtrain/role_maker.h"

namespace dtrain::roles {

std::optional<Role> parse_role(const std::string& text);

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

// Defaults and checks: the RoleInfo of a role read by one source.
RoleInfo build(const RawRole& r, Role role, const Namer& n, const std::string& source);

// An environment's variables; empty values count as unset.
class EnvReader {
 public:
  explicit EnvReader(const std::map<std::string, std::string>& env) : env_(env) {}
  std::optional<std::string> get(const std::string& var) const;
  bool has(const std::string& var) const { return get(var).has_value(); }
  std::optional<int> get_int(const std::string& var) const;
  std::optional<std::vector<std::string>> get_list(const std::string& var) const;

 private:
  const std::map<std::string, std::string>& env_;
};

using FieldNames = std::map<std::string, std::string>;

class EnvNamer : public Namer {
 public:
  explicit EnvNamer(FieldNames names) : names_(std::move(names)) {}
  std::string name(const std::string& field) const override;
  std::string show(const std::string& field, const std::string& value) const override;
  std::string show_list(const std::string& field, const std::vector<std::string>& v) const override;
  [[noreturn]] void fail(const std::string& field, const std::string& message) const override;
  using Namer::show;

 private:
  FieldNames names_;
};

// dtrain's own variables, read first whatever the source (the launcher writes
// them beside the others), then the source's for the fields dtrain's left
// unset. Returns the names for messages: the source's where it has one.
FieldNames read_placement(const EnvReader& e, const env::RoleVars& source, RawRole& r);
// read_placement, and the source's rank and world size.
FieldNames read_ranked(const EnvReader& e, const env::RoleVars& source, RawRole& r);

// torchrun, mpirun and Slurm without dtrain's launcher: rank 0 serves the
// store (MASTER_ADDR:MASTER_PORT, else a port derived from the job id).
uint16_t port_from_id(const std::string& id);
RoleInfo resolve_scheduler(const EnvReader& e, RawRole r, const FieldNames& names, const std::string& scheduler,
                           const std::string& job_id, int port_offset = 0);

// One source of roles in the environment, in EnvRoleMaker's order of precedence.
struct EnvSource {
  bool (*applies)(const EnvReader&);
  RoleInfo (*resolve)(const EnvReader&);
};
extern const EnvSource kDtrainSource, kPaddleSource, kTorchrunSource, kOmpiSource, kSlurmSource;

}  // namespace dtrain::roles
