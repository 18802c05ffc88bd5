// `dtrain-bench collectives`: the Open MPI reference (dtrain-bench-mpi under mpirun).
#include "collectives_internal.h"

#include <sys/stat.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "process.h"

namespace dtrain::bench::coll {

MpiPlan plan_mpi(const CollectivesOptions& o, const Plan& p, const std::string& store_at) {
  MpiPlan m;
  if (o.no_reference || o.no_mpi) return m.note = "turned off", m;
  if (p.cuda) return m.note = "not with --backend nccl: the buffers are CUDA memory", m;
  if (p.dtype == DType::F16 || p.dtype == DType::BF16)
    return m.note = std::string("MPI has no ") + dtype_name(p.dtype) + " sum", m;
  std::string exe = dir_of(self_exe()) + "/dtrain-bench-mpi";
  struct stat st {};
  if (::stat(exe.c_str(), &st) != 0)
    return m.note = "skipped: " + exe + " was not built (MPI not found at build time)", m;
  std::string mpirun = find_in_path("mpirun");
  if (mpirun.empty()) return m.note = "skipped: mpirun is not on PATH (Debian: openmpi-bin)", m;
  m.mpirun = mpirun;
  m.argv = {mpirun,
            "-np",
            std::to_string(p.world),
            "--oversubscribe",
            "--bind-to",
            "none",
            "-x",
            kTokenEnv,
            exe,
            "--op",
            op_name(p.op),
            "--dtype",
            dtype_name(p.dtype),
            "--warmup",
            std::to_string(o.warmup),
            "--store",
            store_at};
  // --iters auto: Open MPI sizes its own iterations from its warm-up.
  if (!p.fixed_iters) {
    m.argv.push_back("--target-ms");
    m.argv.push_back(fmt::format("{}", o.target_ms));
  }
  for (auto& c : p.cases) {
    m.argv.push_back("--case");
    m.argv.push_back(fmt::format("{}:{}", c.bytes, c.count));
  }
  m.env = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_btl_tcp_if_include=lo"};
  if (o.mpi_transport == "tcp") {
    m.env.push_back("OMPI_MCA_pml=ob1");
    m.env.push_back("OMPI_MCA_btl=self,tcp");
  } else if (o.mpi_transport == "sm") {
    m.env.push_back("OMPI_MCA_pml=ob1");
    m.env.push_back("OMPI_MCA_btl=self,vader");
  }
  m.note = o.mpi_transport.empty() ? "Open MPI's default transport" : "btl " + o.mpi_transport;
  m.note += "; its ranks run beside dtrain's and take turns with them, trial by trial";
  return m;
}

}  // namespace dtrain::bench::coll
