// `dtrain-bench collectives`: the Open MPI reference (dtrain-bench-mpi under mpirun).
#include "collectives_internal.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/buffer.h"
#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/sdk/support.h"
#include "dtrain/store.h"
#include "dtrain/work.h"
#include "gloo_reference.h"
#include "options.h"  // sdk/testing: --option key=value as TOML
#include "process.h"

namespace dtrain::bench::coll {

std::string run_mpi(const CollectivesOptions& o, const Plan& p, std::vector<Row>& rows, std::chrono::seconds limit) {
  if (o.no_reference || o.no_mpi) return "turned off";
  if (p.dtype == DType::F16 || p.dtype == DType::BF16) return std::string("MPI has no ") + dtype_name(p.dtype) + " sum";
  std::string exe = dir_of(self_exe()) + "/dtrain-bench-mpi";
  struct stat st {};
  if (::stat(exe.c_str(), &st) != 0) return "skipped: " + exe + " was not built (MPI not found at build time)";
  std::string mpirun = find_in_path("mpirun");
  if (mpirun.empty()) return "skipped: mpirun is not on PATH (Debian: openmpi-bin)";
  std::vector<std::string> argv{mpirun,
                                "-np",
                                std::to_string(p.world),
                                "--oversubscribe",
                                "--bind-to",
                                "none",
                                exe,
                                "--op",
                                op_name(p.op),
                                "--dtype",
                                dtype_name(p.dtype),
                                "--warmup",
                                std::to_string(o.warmup),
                                "--trials",
                                std::to_string(o.trials)};
  for (auto& r : rows) {
    argv.push_back("--case");
    argv.push_back(fmt::format("{}:{}:{}:{}", r.c.bytes, r.c.count, r.iters, r.trials));
  }
  std::vector<std::string> env{"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                               "OMPI_MCA_btl_tcp_if_include=lo"};
  if (o.mpi_transport == "tcp") {
    env.push_back("OMPI_MCA_pml=ob1");
    env.push_back("OMPI_MCA_btl=self,tcp");
  } else if (o.mpi_transport == "sm") {
    env.push_back("OMPI_MCA_pml=ob1");
    env.push_back("OMPI_MCA_btl=self,vader");
  }
  Captured cap = run_capture(mpirun, argv, env, limit);
  std::map<size_t, double> got;
  std::istringstream is(cap.out);
  std::string line;
  while (std::getline(is, line)) {
    if (line.rfind(kMpiTag, 0) != 0) continue;
    size_t bytes = 0;
    double us = -1;
    std::istringstream ls(line.substr(std::strlen(kMpiTag)));
    std::string field;
    while (ls >> field) {
      auto eq = field.find('=');
      if (eq == std::string::npos) continue;
      std::string k = field.substr(0, eq), v = field.substr(eq + 1);
      if (k == "bytes") bytes = std::stoull(v);
      if (k == "time_us") us = std::stod(v);
    }
    if (bytes && us >= 0) got[bytes] = us * 1e-6;
  }
  for (auto& r : rows)
    if (got.count(r.c.bytes)) r.mpi = got[r.c.bytes];
  std::string what = o.mpi_transport.empty() ? "Open MPI's default transport" : "btl " + o.mpi_transport;
  if (!cap.failure.empty())
    return "FAILED (mpirun " + cap.failure + "; " + std::to_string(got.size()) + " of " + std::to_string(rows.size()) +
           " sizes measured), " + what;
  return what;
}

}  // namespace dtrain::bench::coll
