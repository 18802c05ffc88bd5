// dtrain-bench-mpi: the Open MPI reference of `dtrain-bench collectives`.
// Times MPI's own collective the way dtrain is timed (warm-up, barrier, a
// timed loop per trial). Two modes:
//  - paired (--store host:port, the token in $DTRAIN_BENCH_TOKEN): started by
//    dtrain-bench under mpirun at the same time as dtrain's ranks, it takes
//    turns with them through the bench's store (collectives_turns.h), reads
//    each size's trial count there (dtrain's rank 0 sizes it) and writes each
//    rank's trial times to res/mpi/<size index>/<rank>. Iterations per trial:
//    with --target-ms, rank 0 sizes them from MPI's own fastest warm-up call
//    (and publishes them as iters/<size index>/mpi); without, dtrain's
//    (iters/<size index>, --iters N on dtrain-bench).
//      mpirun -np 2 dtrain-bench-mpi --store 127.0.0.1:4000 --target-ms 10 --case 1024:256 ...
//  - alone: iterations per case on the command line; prints one line per size
//    (slowest rank, median trial):
//      DTRAIN_BENCH_MPI bytes=<B> count=<n> iters=<i> time_us=<t>
//      mpirun -np 2 dtrain-bench-mpi --op allreduce --dtype f32 --warmup 5 --trials 3 --case 1024:256:1000[:trials] ...

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives_turns.h"
#include "dtrain/endpoint.h"
#include "dtrain/store.h"

namespace {

using dtrain::bench::coll::Side;

struct Case {
  size_t bytes = 0, count = 0;
  int iters = 0;
  int trials = 0;  // 0: --trials
};

[[noreturn]] void die(int rank, const std::string& msg) {
  if (rank == 0) std::fprintf(stderr, "dtrain-bench-mpi: %s\n", msg.c_str());
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

MPI_Datatype mpi_type(const std::string& t, size_t* size) {
  if (t == "f32") return *size = 4, MPI_FLOAT;
  if (t == "f64") return *size = 8, MPI_DOUBLE;
  if (t == "i32") return *size = 4, MPI_INT32_T;
  if (t == "i64") return *size = 8, MPI_INT64_T;
  if (t == "i8") return *size = 1, MPI_INT8_T;
  if (t == "u8") return *size = 1, MPI_UINT8_T;
  return *size = 0, MPI_DATATYPE_NULL;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  std::string op = "allreduce", dtype = "f32";
  int warmup = 5, trials = 1;
  double target_ms = 0;
  std::string store_at;
  std::vector<Case> cases;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) die(rank, "option " + a + " needs a value");
    std::string v = argv[++i];
    if (a == "--op")
      op = v;
    else if (a == "--dtype")
      dtype = v;
    else if (a == "--warmup")
      warmup = std::atoi(v.c_str());
    else if (a == "--trials")
      trials = std::max(1, std::atoi(v.c_str()));
    else if (a == "--store")
      store_at = v;
    else if (a == "--target-ms")
      target_ms = std::atof(v.c_str());
    else if (a == "--case") {
      Case c;
      unsigned long long b = 0, n = 0;
      int got = std::sscanf(v.c_str(), "%llu:%llu:%d:%d", &b, &n, &c.iters, &c.trials);
      bool paired = !store_at.empty();
      if (got < 2 || (!paired && got < 3) || (got >= 3 && c.iters < 1) || (got == 4 && c.trials < 1))
        die(rank, "--case wants bytes:count:iters[:trials] (bytes:count after --store), got " + v);
      c.bytes = b;
      c.count = n;
      cases.push_back(c);
    } else {
      die(rank, "unknown option " + a);
    }
  }
  size_t esz = 0;
  MPI_Datatype type = mpi_type(dtype, &esz);
  if (type == MPI_DATATYPE_NULL) die(rank, "dtype " + dtype + " has no MPI sum here");
  if (op != "allreduce" && op != "broadcast" && op != "allgather") die(rank, "unknown --op " + op);

  size_t max_bytes = 0;
  for (auto& c : cases) max_bytes = std::max(max_bytes, c.bytes);
  std::vector<char> a(max_bytes + 64, 0), b(op == "allgather" ? max_bytes / world + 64 : 64, 0);

  // Paired mode: the store, on which this rank waits (blocked) while dtrain runs.
  std::shared_ptr<dtrain::Store> store;
  std::unique_ptr<dtrain::bench::coll::Turns> turns;
  if (!store_at.empty()) {
    try {
      auto [host, port] = dtrain::parse_host_port(store_at);
      const char* token = std::getenv("DTRAIN_BENCH_TOKEN");
      store = std::make_shared<dtrain::PrefixStore>("bench",
                                                    std::make_shared<dtrain::TcpStore>(host, port, token ? token : ""));
      turns = std::make_unique<dtrain::bench::coll::Turns>(store, Side::Mpi, rank, world, std::chrono::minutes(10));
    } catch (const std::exception& e) {
      die(rank, std::string("cannot reach the bench's store: ") + e.what());
    }
  }

  for (size_t i = 0; i < cases.size(); ++i) {
    Case& c = cases[i];
    int n = static_cast<int>(c.count);
    auto once = [&] {
      if (op == "allreduce")
        MPI_Allreduce(MPI_IN_PLACE, a.data(), n, type, MPI_SUM, MPI_COMM_WORLD);
      else if (op == "broadcast")
        MPI_Bcast(a.data(), n, type, 0, MPI_COMM_WORLD);
      else
        MPI_Allgather(b.data(), n, type, a.data(), n, type, MPI_COMM_WORLD);
    };
    auto trial = [&] {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int k = 0; k < c.iters; ++k) once();
      return (MPI_Wtime() - t0) / c.iters;
    };
    if (turns) {
      try {
        turns->before(Side::Dtrain);  // dtrain's set-up slot
        turns->before(Side::Mpi);     // this side's warm-up slot
        c.trials = std::stoi(store->get_string("trials/" + std::to_string(i), std::chrono::seconds(30)));
        std::memset(a.data(), 0, c.bytes);
        double fastest = 0;
        for (int w = 0; w < std::max(warmup, target_ms > 0 ? 1 : 0); ++w) {
          double t0 = MPI_Wtime();
          once();
          double s = MPI_Wtime() - t0;
          fastest = w ? std::min(fastest, s) : s;
        }
        if (target_ms > 0) {
          c.iters = static_cast<int>(std::clamp(std::ceil(target_ms / 1000.0 / std::max(fastest, 1e-7)), 5.0, 1e6));
          MPI_Bcast(&c.iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
          if (rank == 0) store->set("iters/" + std::to_string(i) + "/mpi", std::to_string(c.iters));
        } else {
          c.iters = std::stoi(store->get_string("iters/" + std::to_string(i), std::chrono::seconds(30)));
        }
        auto slots = dtrain::bench::coll::schedule(c.trials);
        std::string times;
        for (size_t j = 2; j < slots.size(); ++j) {
          turns->before(slots[j]);
          if (slots[j] != Side::Mpi) continue;
          double per_op = trial();
          // As dtrain's ranks do: a trial over 4x the target cuts the next ones to it.
          if (target_ms > 0) {
            if (rank == 0 && c.iters > 5 && c.iters * per_op > 4 * target_ms / 1000.0)
              c.iters = static_cast<int>(std::clamp(std::ceil(target_ms / 1000.0 / per_op), 5.0, 1e6));
            MPI_Bcast(&c.iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
          }
          char buf[32];
          std::snprintf(buf, sizeof(buf), "%.9e ", per_op);
          times += buf;
        }
        store->set("res/mpi/" + std::to_string(i) + "/" + std::to_string(rank), times);
      } catch (const std::exception& e) {
        die(rank, "size " + std::to_string(c.bytes) + " B: " + e.what());
      }
      continue;
    }
    std::memset(a.data(), 0, c.bytes);
    for (int w = 0; w < warmup; ++w) once();
    std::vector<double> worst_of_trial;
    for (int t = 0; t < (c.trials ? c.trials : trials); ++t) {
      double mine = trial(), worst = 0;
      MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      worst_of_trial.push_back(worst);
    }
    std::sort(worst_of_trial.begin(), worst_of_trial.end());
    size_t nt = worst_of_trial.size();
    double med = nt % 2 ? worst_of_trial[nt / 2] : (worst_of_trial[nt / 2 - 1] + worst_of_trial[nt / 2]) / 2;
    if (rank == 0) {
      std::printf("DTRAIN_BENCH_MPI bytes=%zu count=%zu iters=%d time_us=%.4f\n", c.bytes, c.count, c.iters, med * 1e6);
      std::fflush(stdout);
    }
  }
  // Leave the store before MPI_Finalize's own synchronisation.
  turns.reset();
  store.reset();
  MPI_Finalize();
  return 0;
}
