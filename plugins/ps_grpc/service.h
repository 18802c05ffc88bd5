#pragma once
// The server side of ps_grpc: the gRPC service holding this server's part of
// every declared table. Requests run on gRPC's synchronous server threads
// (a sync-mode pull or a barrier blocks its thread until the step is applied
// or the client's deadline, less a margin, passes).

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>

#include "dtrain/sdk/backend.h"
#include "options.h"
#include "plugins/ps_grpc/ps.grpc.pb.h"
#include "table.h"
#include "wire.h"
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
  grpc::Status PushSparse(grpc::ServerContext*, grpc::ServerReader<SparsePush>*, Empty*) override;
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

  // Uninitialized staging memory for a call's payload (a dense range, a sparse pull's reply, a
  // push sent in several chunks), reused across calls: a fresh 16 MB vector
  // costs a zero fill and 4,096 page faults per call. Keeps at most
  // kKeepBuffers buffers and kKeepBytes in all; thread-safe. A lease keeps
  // the pool alive (gRPC may release a slice of it after the service is gone).
  class Staging : public std::enable_shared_from_this<Staging> {
   public:
    class Lease {
     public:
      Lease(std::shared_ptr<Staging> pool, std::unique_ptr<char[]> mem, size_t cap)
          : pool_(std::move(pool)), mem_(std::move(mem)), cap_(cap) {}
      Lease(Lease&&) = default;
      ~Lease() {
        if (mem_) pool_->put(std::move(mem_), cap_);
      }
      template <typename T>
      T* as() const {
        return reinterpret_cast<T*>(mem_.get());
      }

     private:
      std::shared_ptr<Staging> pool_;
      std::unique_ptr<char[]> mem_;
      size_t cap_;
    };
    Lease get(size_t bytes);

   private:
    static constexpr size_t kKeepBuffers = 8, kKeepBytes = size_t{128} << 20;
    void put(std::unique_ptr<char[]> mem, size_t cap);
    std::mutex mu_;
    std::vector<std::pair<size_t, std::unique_ptr<char[]>>> free_;  // capacity, memory
    size_t kept_ = 0;
  };

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
};

}  // namespace dtrain::ps_grpc
