#pragma once
// The server-side table engine of ps_grpc: one server's part of one table.
// No gRPC here; service.cc calls these from its request threads.
//
// Errors are thrown as dtrain::sdk::Error (dtrain/sdk/error.h):
// DT_ERR_INVALID_USAGE for a bad request (the message names the table and the
// numbers), DT_ERR_TIMEOUT for a sync wait that outlived its deadline (naming
// the workers that have not pushed), DT_ERR_SYSTEM for file errors (naming
// the path). A failed request leaves the table as it was.
//
// Threading: every method may be called concurrently from many threads.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/sdk/backend.h"

namespace dtrain::ps_grpc {

using Clock = std::chrono::steady_clock;

// Where keys and dense values live. Every server and client computes these
// alike; load() re-filters saved rows with them, so a save made on S servers
// loads onto any other count.
struct Sharding {
  int num_servers = 1;
  uint32_t num_shards = 64;  // sparse shards in the whole job
  uint32_t shard_of(uint64_t key) const;
  int server_of(uint64_t key) const;  // server holding key's shard
  // Dense: [begin, end) of the values server s holds (even split, the first
  // dim % num_servers servers hold one more).
  uint64_t dense_begin(uint64_t dim, int server) const;
  uint64_t dense_end(uint64_t dim, int server) const { return dense_begin(dim, server + 1); }
};

// DT_ERR_INVALID_USAGE unless 0 <= worker < workers.
void check_worker(const std::string& table, int worker, int workers);

struct TableStats {
  uint64_t rows = 0;     // sparse rows held (dense: values held)
  uint64_t pending = 0;  // keys counted but not yet admitted
  uint64_t applied_steps = 0;
};

class Table {
 public:
  virtual ~Table() = default;
  // desc was checked by the caller for dtype F32 and a known kind, rule,
  // initializer and mode. num_workers counts the sync step's participants.
  static std::unique_ptr<Table> create(const sdk::TableDesc& desc, const Sharding& sharding, int server,
                                       int num_workers);
  const sdk::TableDesc& desc() const { return desc_; }
  // "" if other describes the same table, else the first differing field,
  // e.g. "dim is 8 here and 16 in the request".
  std::string differs(const sdk::TableDesc& other) const;

  // Dense: this server's range, count == dense_end - dense_begin.
  // pull waits, in SYNC mode, until every step `worker` pushed is applied or
  // deadline passes.
  virtual void pull_dense(int worker, float* out, uint64_t count, Clock::time_point deadline) = 0;
  virtual void push_dense(int worker, const float* grads, uint64_t count) = 0;
  // Dense, ASYNC and GEO modes: a push applied range by range as its parts
  // arrive, each value of the range exactly once (the caller sees to that):
  // begin_dense_push returns the push's step, which every range of it
  // passes; end_dense_push counts the push applied. The values are those of
  // push_dense with the whole gradient, bit for bit, in whatever order the
  // ranges come. A pull running beside such a push may see some of its
  // ranges applied and not others (a worker's own pulls wait for its pushes).
  // The defaults refuse (a sparse table; SYNC mode takes whole pushes).
  virtual uint64_t begin_dense_push(int worker);
  virtual void push_dense_range(uint64_t step, uint64_t offset, const float* grads, uint64_t len);
  virtual void end_dense_push() {}
  // Sparse: keys all belong to this server; out/grads are n * dim, row-major.
  virtual void pull_sparse(int worker, const uint64_t* keys, uint64_t n, float* out, Clock::time_point deadline) = 0;
  virtual void push_sparse(int worker, const uint64_t* keys, uint64_t n, const float* grads,
                           const float* show_click) = 0;
  // Returns the number of rows deleted. flags: DT_PS_SHRINK_*.
  virtual uint64_t shrink(uint32_t flags) = 0;

  // Writes this server's part file(s) of save `generation` under table_dir
  // (the table's own directory, created by the caller): temporary file,
  // fsync, rename. Returns the file names written (relative to table_dir),
  // for the manifest. mode DT_PS_SAVE_*, format DT_PS_FORMAT_*.
  virtual std::vector<std::string> save(const std::string& table_dir, const std::string& generation, int mode,
                                        int format) = 0;
  // Reads every part file the manifest in table_dir lists and keeps what
  // belongs to this server. FULL/BASE replace the table; DELTA overlays.
  virtual void load(const std::string& table_dir) = 0;
  virtual TableStats stats() const = 0;

 protected:
  explicit Table(sdk::TableDesc desc) : desc_(std::move(desc)) {}
  sdk::TableDesc desc_;
};

}  // namespace dtrain::ps_grpc
