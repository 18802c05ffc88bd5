#pragma once
// The worker side of ps_grpc: a channel (or a few) to every server, and the
// PS operations as works fanned out to the servers. Pulls and pushes start
// their calls on one completion queue from the submitting thread (a pool
// thread when they must wait for an earlier op) and one poller thread
// handles the replies; the other ops run on a TaskPool as blocking gRPC
// calls. Every call has the op's deadline and is registered while in flight
// so abort() can cancel it.

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>

#include "dtrain/sdk/backend.h"
#include "options.h"
#include "plugins/ps_grpc/service/ps.grpc.pb.h"
#include "service/wire.h"
#include "engine/table.h"
#include "work.h"

namespace dtrain::ps_grpc {

// The calls of one op started together on PsClient's completion queue (a
// PartsBatch in client.cc). start() runs on the submitting thread when the
// ops op runs after are done, else on a pool thread after wait_after();
// every event of its calls is handled on the poller thread. Both run under
// mu (the happens-before gRPC's queue gives is invisible to
// ThreadSanitizer). It holds one count per call and one for start(); the
// last release deletes it (PsClient::end_batch).
class Batch {
 public:
  explicit Batch(size_t calls) : holds_(calls + 1) {}
  virtual ~Batch() = default;
  virtual void start() = 0;
  // An event of call i; true when it was the call's last (its Finish).
  virtual bool on_event(size_t i, unsigned kind, bool ok) = 0;
  bool release() { return holds_.fetch_sub(1) == 1; }
  std::mutex mu;

 private:
  std::atomic<size_t> holds_;
};
// A completion-queue tag: the batch, its call and which of the call's ops
// (batch published last, for the poller to read before it locks the batch).
struct Tag {
  std::atomic<Batch*> batch{nullptr};
  size_t call = 0;
  unsigned kind = 0;
  void set(Batch* b, size_t i, unsigned k) {
    call = i;
    kind = k;
    batch.store(b, std::memory_order_release);
  }
};

class PsClient {
 public:
  using Opts = dt_call_opts_v1_t;
  // Reads every server's address from the store, connects and says Hello
  // (token, num_servers, num_workers, shard_num); throws sdk::Error naming
  // the server that is unreachable or refuses.
  PsClient(const sdk::CommInit& init, const PsOptions& options);
  ~PsClient();

  std::shared_ptr<sdk::Work> declare(const sdk::TableDesc& desc, uint32_t* id, const Opts& o);
  std::shared_ptr<sdk::Work> pull_dense(uint32_t id, float* values, uint64_t count, const Opts& o);
  std::shared_ptr<sdk::Work> push_dense(uint32_t id, const float* grads, uint64_t count, const Opts& o);
  std::shared_ptr<sdk::Work> pull_sparse(uint32_t id, const uint64_t* keys, uint64_t n, float* values, uint64_t count,
                                         const Opts& o);
  std::shared_ptr<sdk::Work> push_sparse(uint32_t id, const uint64_t* keys, uint64_t n, const float* grads,
                                         uint64_t count, const float* show_click, const Opts& o);
  std::shared_ptr<sdk::Work> save(uint32_t id, const std::string& dir, int32_t mode, int32_t format, const Opts& o);
  std::shared_ptr<sdk::Work> load(uint32_t id, const std::string& dir, const Opts& o);
  std::shared_ptr<sdk::Work> shrink(uint32_t id, uint32_t flags, const Opts& o);
  std::shared_ptr<sdk::Work> barrier(const Opts& o);
  std::shared_ptr<sdk::Work> finish(const Opts& o);
  void abort(const std::string& reason);

 private:
  struct Server {
    int index = 0;
    std::string endpoint;
    std::vector<std::unique_ptr<ParameterServer::Stub>> stubs;
    std::vector<std::shared_ptr<grpc::Channel>> channels;     // stubs[i]'s
    std::vector<std::unique_ptr<grpc::GenericStub>> generic;  // per channel, for calls in raw bytes
    std::atomic<uint32_t> next{0};
    ParameterServer::Stub& stub() { return *stubs[next.fetch_add(1, std::memory_order_relaxed) % stubs.size()]; }
    grpc::GenericStub& generic_stub() {
      return *generic[next.fetch_add(1, std::memory_order_relaxed) % generic.size()];
    }
    const std::shared_ptr<grpc::Channel>& channel() {
      return channels[next.fetch_add(1, std::memory_order_relaxed) % channels.size()];
    }
  };
  struct ClientTable {
    sdk::TableDesc desc;
    std::shared_ptr<Op> declared;
    std::shared_ptr<Op> last_push;
  };
  // One gRPC call: gets a prepared context, returns its status; may throw sdk::Error.
  using Call = std::function<grpc::Status(grpc::ClientContext&, Server&)>;

  ClientTable& table(uint32_t id, int kind, const char* op);
  // A pull or push of at most kSpinMaxBytes (keys and values) polls its
  // wait for wait_spin_us before sleeping; other ops sleep at once.
  static constexpr uint64_t kSpinMaxBytes = 64 << 10;
  std::shared_ptr<Op> new_op(const std::string& what, int parts, const Opts& o, uint64_t payload_bytes = UINT64_MAX);
  // Queues part `call` of op to server s.
  void run(const std::shared_ptr<Op>& op, int s, Call call);
  // `rpc(ctx, server, req)` to every server, after t's declaration and last
  // push; later pulls of t wait for it.
  template <typename Rpc>
  std::shared_ptr<sdk::Work> every_server(ClientTable& t, const std::string& what,
                                          std::shared_ptr<const TableRequest> req, const Opts& o, Rpc rpc);
  // One unary call in raw bytes of an op, and what to do with its reply
  // (may throw sdk::Error, named after the server).
  struct UnaryPart {
    int server = 0;
    grpc::ByteBuffer request;
    std::function<void(const grpc::ByteBuffer& reply)> on_reply;
  };
  // Starts every part of op at once on cq_ and handles each reply on
  // poller_ as it comes, each call a part of op.
  void run_unary(const std::shared_ptr<Op>& op, const char* method, std::vector<UnaryPart> parts);
  // One client-streamed call in raw bytes of an op (its reply empty): its
  // number of messages, and what builds message i just before it is written
  // (false: the op ended, the call is cancelled).
  struct StreamPart {
    int server = 0;
    size_t count = 0;
    std::function<bool(size_t i, RawMessage* m)> make;
  };
  // Starts every stream at once on cq_, as run_unary; poller_ writes a
  // stream's next message when its last write completes (no thread per
  // call, so the writes leave a core to the server beside it on one host;
  // the headers go with the first message, the end of the stream with the
  // last).
  void run_streams(const std::shared_ptr<Op>& op, const char* method, std::vector<StreamPart> parts);
  // One dense pull from a server (a server-streamed call): each chunk as it
  // comes (false: the op ended, the call is cancelled), then the end of a
  // call that succeeded; both may throw sdk::Error (a chunk's error cancels
  // the call and fails the part).
  struct PullPart {
    int server = 0;
    DensePull request;
    std::function<bool(const DenseChunk& chunk)> on_chunk;
    std::function<void()> on_end;
  };
  void run_pulls(const std::shared_ptr<Op>& op, std::vector<PullPart> parts);

  // The batches of calls (client.cc): a shared base and one per kind of call.
  template <typename Part, typename C>
  class PartsBatch;
  class UnaryBatch;
  class StreamBatch;
  class PullBatch;
  void launch(const std::shared_ptr<Op>& op, std::unique_ptr<Batch> batch);
  void end_batch(Batch* b);
  void poll();
  // Waits (up to op's deadline) for the ops op runs after.
  static void wait_after(Op& op);
  std::shared_ptr<sdk::Work> submit(const std::shared_ptr<Op>& op);
  void hello(Server& s, int64_t timeout_ms);
  std::pair<dt_status_t, std::string> translate(const grpc::Status& st, grpc::ClientContext& ctx, const Server& s,
                                                const Op& op);
  bool track(grpc::ClientContext* ctx);
  // A call's context: op's deadline, the job token, tracked for abort. False
  // (the part reported aborted) when the client is being aborted.
  bool open_call(Op& op, grpc::ClientContext& ctx);
  void untrack(grpc::ClientContext* ctx);
  void check_open(const char* op);

  int rank_;
  int num_servers_;
  int num_workers_;
  int64_t timeout_ms_;
  std::string token_;
  PsOptions options_;
  Sharding sharding_;
  uint64_t chunk_bytes_;
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<ClientTable> tables_;
  uint64_t barriers_ = 0;
  uint64_t dense_pushes_ = 0;
  std::shared_ptr<Staging> staging_ = std::make_shared<Staging>();  // dense pushes' values

  std::mutex mu_;  // aborted_, reason_, calls_, ops_
  bool aborted_ = false;
  std::string reason_;
  std::set<grpc::ClientContext*> calls_;
  std::vector<std::weak_ptr<Op>> ops_;

  grpc::CompletionQueue cq_;  // every batch's calls
  std::thread poller_;        // handles cq_'s events; started once the constructor cannot fail
  std::mutex live_mu_;
  std::condition_variable live_cv_;
  size_t live_ = 0;  // batches not yet ended

  TaskPool pool_;  // last: joined first, while everything its tasks use is alive
};

}  // namespace dtrain::ps_grpc
