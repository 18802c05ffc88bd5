#pragma once
// Everything one machine's dtrain has decided about the job before it starts
// the processes: read by the environment builder, the table and the report.

#include <string>
#include <vector>

#include "launcher.h"
#include "layout.h"
#include "messages.h"

namespace dtrain::launch {

struct JobPlan {
  LaunchOptions options;
  MachineLayout machines;
  std::string job_id;
  std::string token;         // the store's token: passed to the processes, never printed
  std::string token_source;  // where it came from, for the table ("DTRAIN_JOB_TOKEN", "file X", "OPEN ...")
  std::string store_endpoint;
  std::vector<Slot> slots;  // this machine's processes
  bool listed = false;      // slots come from --servers/--workers
  std::vector<NodeInfo> nodes;
  std::vector<std::string> worker_eps, server_eps;  // the whole job's, in rank order
  std::string error_dir;                            // where the processes' communicators write their first abort
  // Elastic jobs: this machine's member id, and its commit folder (DTRAIN_ELASTIC_DIR,
  // kept across generations: the workers' in-memory state, see fleet/elastic.h).
  int elastic_id = -1;
  int generation = -1;
  std::string elastic_dir;

  std::string log_file(const Slot& s) const { return options.log_dir + "/" + s.log_name(); }
  std::string error_file(const Slot& s) const { return error_dir + "/" + s.log_name(); }
  // TORCHELASTIC_ERROR_FILE: where torch's @record writes a Python program's
  // uncaught exception (JSON), read into the root-cause report.
  std::string python_error_file(const Slot& s) const { return error_file(s) + ".torch.json"; }
};

}  // namespace dtrain::launch
