#pragma once
// The server side of ps_grpc: the gRPC service holding this server's part of
// every declared table. Requests run on gRPC's synchronous server threads
// (a sync-mode pull or a barrier blocks its thread until the step is applied
// or the client's deadline, less a margin, passes).

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>

#include "dtrain/sdk/backend.h"
#include "options.h"
#include "service/staging.h"
#include "plugins/ps_grpc/service/ps.grpc.pb.h"
#include "engine/table.h"
#include "service/wire.h"
#include "work.h"

namespace dtrain::ps_grpc {

class PsService final : public ParameterServer::Service {
 public:
  PsService(const sdk::CommInit& init, const PsOptions& options);

  // Completes with DT_OK when every worker called Finish or stop() was called.
  std::shared_ptr<sdk::Work> serve_work() const { return serve_; }
  // Ends serving (status DT_OK or DT_ERR_ABORTED) and wakes every barrier wait.
  void stop(dt_status_t status, const std::string& reason);
  void set_endpoint(const std::string& endpoint) { endpoint_ = endpoint; }

  grpc::Status Hello(grpc::ServerContext*, const HelloRequest*, HelloReply*) override;
  grpc::Status DeclareTable(grpc::ServerContext*, const DeclareRequest*, Empty*) override;
  // PullDense, registered as a split server-streamed method (one request,
  // the chunks as RawMessages pointing into one staging buffer, no copy).
  grpc::Status PullDenseRaw(grpc::ServerContext*, grpc::ServerSplitStreamer<DensePull, RawMessage>*);
  // PushDense, registered as a streamed method reading raw chunks (their
  // values copied from gRPC's slices straight into the staging buffer).
  grpc::Status PushDenseRaw(grpc::ServerContext*, grpc::ServerReaderWriter<Empty, RawRequest>*);
  // PullSparse, registered as a streamed unary method (one request, one
  // reply) so the reply is a RawMessage the table fills in place.
  grpc::Status PullSparseRaw(grpc::ServerContext*, grpc::ServerUnaryStreamer<SparsePull, RawMessage>*);
  // PushSparse, registered as a streamed method reading raw chunks (keys,
  // gradients and show/click copied from gRPC's slices straight into one
  // staging buffer).
  grpc::Status PushSparseRaw(grpc::ServerContext*, grpc::ServerReaderWriter<Empty, RawRequest>*);
  grpc::Status Save(grpc::ServerContext*, const SaveRequest*, SaveReply*) override;
  grpc::Status Load(grpc::ServerContext*, const TableRequest*, Empty*) override;
  grpc::Status Shrink(grpc::ServerContext*, const TableRequest*, ShrinkReply*) override;
  grpc::Status Barrier(grpc::ServerContext*, const BarrierRequest*, Empty*) override;
  grpc::Status Finish(grpc::ServerContext*, const FinishRequest*, Empty*) override;

 private:
  // Checks the job token, runs f, and turns an sdk::Error into a gRPC status
  // carrying the dtrain status in the trailing metadata.
  template <typename F>
  grpc::Status guarded(grpc::ServerContext* ctx, F&& f);
  Table& table(const std::string& name, int kind);
  int worker(int32_t w) const;
  // The client's deadline less a margin, so a sync wait ends (naming the
  // missing workers) before the client gives up.
  Clock::time_point deadline(grpc::ServerContext* ctx) const;
  // Runs f(until) (an engine call that may wait for a sync step) in slices
  // of the deadline, so a wait ends soon after the client cancels or the
  // server stops, not only at the deadline.
  template <typename F>
  void interruptible(grpc::ServerContext* ctx, F&& f);
  void check_size(const Table& t, uint64_t bytes, const std::string& what) const;
  std::string who() const;

  // A dense push to this server, its parts arriving as calls at once, every
  // value exactly once: SYNC mode stages the values until all have come
  // (one sync step), ASYNC and GEO apply each chunk as it comes (the table's
  // push_dense_range with the push's step). Thread-safe.
  struct DensePush {
    DensePush(uint64_t push_id, std::optional<Staging::Lease> l, uint64_t s)
        : id(push_id), lease(std::move(l)), step(s) {}
    // Reserves values [offset, offset + len); fails (DT_ERR_INVALID_USAGE) if
    // any of them was reserved before or another part failed.
    void claim(uint64_t offset, uint64_t len, const std::string& table);
    // len reserved values were copied in.
    void arrived(uint64_t len);
    void fail();
    // True once, for the caller that finds all n values in: it applies the
    // push. Fails if another part failed.
    bool complete(uint64_t n, const std::string& table);

    const uint64_t id;
    const std::optional<Staging::Lease> lease;  // SYNC: the staged values
    const uint64_t step;                        // ASYNC, GEO: begin_dense_push's
    std::mutex mu;
    std::vector<std::pair<uint64_t, uint64_t>> spans;  // reserved [begin, end)
    uint64_t got = 0;                                  // values copied in
    bool failed = false, applied = false;
  };
  // The push `id` of worker to t, joined or started (a pending push of
  // another id is dropped: it failed part-way).
  std::shared_ptr<DensePush> join_push(Table& t, int worker, uint64_t id, uint64_t n);
  void drop_push(const Table& t, int worker, const std::shared_ptr<DensePush>& p);

  int server_;
  int num_servers_;
  int num_workers_;
  int64_t default_timeout_ms_;
  std::string token_;
  PsOptions options_;
  Sharding sharding_;
  std::string endpoint_;

  mutable std::shared_mutex tables_mu_;
  std::map<std::string, std::unique_ptr<Table>> tables_;  // never erased while serving

  std::mutex mu_;  // barrier, finish, stop
  std::condition_variable cv_;
  uint64_t barriers_done_ = 0;
  std::map<uint64_t, std::set<int>> barrier_arrived_;
  std::set<int> finished_;
  bool stopping_ = false;
  std::shared_ptr<sdk::Work> serve_;
  std::shared_ptr<Staging> staging_ = std::make_shared<Staging>();
  std::mutex pushes_mu_;
  std::map<std::pair<const Table*, int>, std::shared_ptr<DensePush>> pushes_;  // by table and worker
};

}  // namespace dtrain::ps_grpc
