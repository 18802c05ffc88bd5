#pragma once
// The parameter-server half of the conformance suite: any backend with the
// DT_CAP_PS_* bits runs it (dtrain-conformance ps --backend NAME).
//
// Every case starts its own small PS job inside this process: S servers and W
// workers as threads over one MemoryStore, through ps::start_server and
// ps::connect_worker, for S in 1..3 x W in 1..3. The values pulled are checked
// against a reference computed here from the formulas of the ABI
// (dtrain/abi/backend_v1.h: DT_PS_MODE_*, DT_PS_OPT_*), never against the
// backend itself:
//   sync   bit-identical to the reference that sums the workers' gradients in
//          worker order and divides by W, then applies one optimizer step;
//   async  pushes serialized by barriers (every rule) or concurrent with values
//          whose sums are exact in f32 (SGD), so the order cannot matter;
//   geo    GeoSparseTable / GeoDenseTable with SGD, the workers' k-step syncs
//          serialized by barriers, local and server values both checked.
// Besides: sync determinism (two runs bit-identical; 2 workers == 1 worker
// pushing the average), repeated keys in pulls and pushes, unseen keys pull
// their initial row, the initial row of a key does not depend on the server
// count, a FULL save loads onto another server count with identical rows and
// optimizer state (pulls and continued training compared), BASE + DELTA.
//
// Hyper-parameters are powers of two (lr, epsilon, 1 - beta) and gradients
// have few significant bits, so every product in the rules is exact in f32
// and the formulas leave no room for a second reading; the divisions, square
// roots and the W-average are where a backend can differ, and must not.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "conformance.h"

namespace dtrain {
class Backend;
}

namespace dtrain::conformance {

struct PsOptions {
  std::vector<int> servers{1, 2, 3};
  std::vector<int> workers{1, 2, 3};
  // Only cases whose name contains this substring run ("" = all; "^x": names
  // that start with x). Names look like "sync/S2xW3/sparse/adam",
  // "geo/S1xW2/dense", "init/S2/unseen_keys", "save/full/S3->S2/text".
  std::string filter;
  bool verbose = false;
  // The backend's own options (flat TOML), as for collectives.
  std::string config_toml;
  // Deadline of every PS op; a case that hangs fails after it.
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  // Where save/load cases write (a fresh folder under it, removed after);
  // "" = the system's temporary folder.
  std::string scratch_dir;
  // Values of the large cases (a dense table and a sparse pull/push of this
  // many floats, past gRPC-style message limits).
  size_t large_count = (size_t(1) << 20) + 7;
};

// Runs every selected case; each case's failures name the case, the worker
// and the first differing value. Throws only when the backend lacks the PS bits.
Result run_ps(const std::shared_ptr<Backend>& backend, const PsOptions& options);

}  // namespace dtrain::conformance
