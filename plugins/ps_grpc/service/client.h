#pragma once
// The worker side of ps_grpc: a channel (or a few) to every server, and the
// PS operations as works fanned out to the servers. Parts of an op run on a
// TaskPool as blocking gRPC calls with the op's deadline; every call in
// flight is registered so abort() can cancel it.

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>

#include "dtrain/sdk/backend.h"
#include "options.h"
#include "plugins/ps_grpc/service/ps.grpc.pb.h"
#include "service/wire.h"
#include "engine/table.h"
#include "work.h"

namespace dtrain::ps_grpc {

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
    // A blocking unary call of `method` in raw bytes (ctx's deadline holds).
    grpc::Status unary(grpc::ClientContext& ctx, const char* method, const grpc::ByteBuffer& request,
                       grpc::ByteBuffer* reply);
    // A blocking client-streamed call of `method` sending raw messages (a
    // sparse push's chunks, built in place: no serialization copy).
    grpc::Status client_stream(grpc::ClientContext& ctx, const char* method, const std::vector<RawMessage>& msgs);
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
  std::shared_ptr<Op> new_op(const std::string& what, int parts, const Opts& o);
  // Queues part `call` of op to server s.
  void run(const std::shared_ptr<Op>& op, int s, Call call);
  // One unary call in raw bytes of an op, and what to do with its reply
  // (may throw sdk::Error, named after the server).
  struct UnaryPart {
    int server = 0;
    grpc::ByteBuffer request;
    std::function<void(const grpc::ByteBuffer& reply)> on_reply;
  };
  // Queues every part of op as one task: it starts all the calls at once on
  // one completion queue and handles each reply as it comes (no thread
  // hand-off per call), each call a part of op.
  void run_unary(const std::shared_ptr<Op>& op, const char* method, std::vector<UnaryPart> parts);
  // One client-streamed call in raw bytes of an op (its reply empty): its
  // number of messages, and what builds message i just before it is written
  // (false: the op ended, the call is cancelled).
  struct StreamPart {
    int server = 0;
    size_t count = 0;
    std::function<bool(size_t i, RawMessage* m)> make;
  };
  // Queues every part of op as one task, as run_unary: it starts every
  // stream at once on one completion queue and writes a stream's next
  // message when its last write completes (no thread per call, so the
  // writes leave a core to the server beside it on one host; the headers go
  // with the first message, the end of the stream with the last).
  void run_streams(const std::shared_ptr<Op>& op, const char* method, std::vector<StreamPart> parts);
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

  TaskPool pool_;  // last: joined first, while everything its tasks use is alive
};

}  // namespace dtrain::ps_grpc
