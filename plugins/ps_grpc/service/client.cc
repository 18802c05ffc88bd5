// The client's connections and calls: the servers' channels and handshake, an
// op's fan-out into calls (unary and streaming parts) and their errors, abort.
// The table operations on top of these are in client_tables.cc.

#include "service/client.h"

#include <algorithm>
#include <cstring>

#include "service/wire.h"

namespace dtrain::ps_grpc {

namespace {

std::chrono::system_clock::time_point wall_deadline(sdk::Clock::time_point deadline) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - sdk::Clock::now());
}

// Runs f, a part's own work after its call: DT_OK, or the error it threw
// (an sdk::Error named after the server).
template <typename F>
std::pair<dt_status_t, std::string> part_status(int server, const std::string& endpoint, F&& f) {
  try {
    f();
    return {DT_OK, ""};
  } catch (const sdk::Error& e) {
    return {e.status(), "parameter server " + std::to_string(server) + " (" + endpoint + "): " + e.what()};
  } catch (const std::exception& e) {
    return {DT_ERR_INTERNAL, e.what()};
  }
}

}  // namespace

PsClient::PsClient(const sdk::CommInit& init, const PsOptions& options)
    : rank_(init.rank),
      num_servers_(init.num_servers),
      num_workers_(init.num_workers),
      timeout_ms_(init.timeout_ms > 0 ? init.timeout_ms : 300000),
      token_(init.job_token),
      options_(options),
      chunk_bytes_(options.chunk_bytes) {
  if (num_servers_ < 1) sdk::fail(DT_ERR_INVALID_USAGE, "ps_grpc: a worker needs num_servers >= 1");
  if (num_workers_ < 1 || rank_ < 0 || rank_ >= num_workers_)
    sdk::fail(DT_ERR_INVALID_USAGE,
              "ps_grpc: worker rank " + std::to_string(rank_) + " is not in [0, " + std::to_string(num_workers_) + ")");
  sharding_.num_servers = num_servers_;
  sharding_.num_shards = options.shard_num;
  auto start = sdk::Clock::now();
  for (int s = 0; s < num_servers_; ++s) {
    auto srv = std::make_unique<Server>();
    srv->index = s;
    int64_t left = std::max<int64_t>(
        1, timeout_ms_ - std::chrono::duration_cast<std::chrono::milliseconds>(sdk::Clock::now() - start).count());
    try {
      srv->endpoint = init.store.get("ps/server/" + std::to_string(s), left);
    } catch (const sdk::Error& e) {
      sdk::fail(e.status(),
                "ps_grpc: parameter server " + std::to_string(s) + " did not publish its address: " + e.what());
    }
    for (int c = 0; c < options.channels; ++c) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(options.max_message_bytes());
      args.SetMaxSendMessageSize(-1);
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt("dtrain.channel_index", c);
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      auto ch = grpc::CreateCustomChannel(srv->endpoint, grpc::InsecureChannelCredentials(), args);
      srv->stubs.push_back(ParameterServer::NewStub(ch));
      srv->generic.push_back(std::make_unique<grpc::GenericStub>(ch));
      srv->channels.push_back(ch);
    }
    hello(*srv, left);
    servers_.push_back(std::move(srv));
  }
  poller_ = std::thread([this] { poll(); });
}

PsClient::~PsClient() {
  abort("the communicator was destroyed");
  pool_.join();  // its tasks may still start batches (each call then refused)
  {
    std::unique_lock<std::mutex> lk(live_mu_);
    live_cv_.wait(lk, [&] { return live_ == 0; });
  }
  cq_.Shutdown();
  poller_.join();
}

void PsClient::hello(Server& s, int64_t timeout_ms) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  if (!token_.empty()) ctx.AddMetadata(kTokenKey, token_);
  HelloRequest req;
  req.set_worker(rank_);
  req.set_server(s.index);
  req.set_num_servers(num_servers_);
  req.set_num_workers(num_workers_);
  req.set_shard_num(options_.shard_num);
  HelloReply reply;
  grpc::Status st = s.stub().Hello(&ctx, req, &reply);
  if (!st.ok()) {
    Op op("the handshake", 1, sdk::Clock::now(), timeout_ms);
    auto [code, msg] = translate(st, ctx, s, op);
    sdk::fail(code, "ps_grpc: " + msg);
  }
  chunk_bytes_ = std::min<uint64_t>(chunk_bytes_, std::max<uint64_t>(reply.chunk_bytes(), 4096));
}

std::pair<dt_status_t, std::string> PsClient::translate(const grpc::Status& st, grpc::ClientContext& ctx,
                                                        const Server& s, const Op& op) {
  std::string who = "parameter server " + std::to_string(s.index) + " (" + s.endpoint + ")";
  const auto& md = ctx.GetServerTrailingMetadata();
  if (auto it = md.find(kStatusKey); it != md.end()) {
    int code = std::atoi(std::string(it->second.data(), it->second.size()).c_str());
    if (code >= DT_ERR_ABORTED && code < DT_OK) return {code, who + ": " + st.error_message()};
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_) return {DT_ERR_ABORTED, "ps_grpc: " + op.what() + " aborted: " + reason_};
  }
  switch (st.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
      return {DT_ERR_INVALID_USAGE, who + " refused this client: " + st.error_message()};
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return {DT_ERR_TIMEOUT,
              who + " did not answer " + op.what() + " within " + std::to_string(op.timeout_ms()) + " ms"};
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      if (st.error_message().find("larger than max") != std::string::npos)
        return {DT_ERR_INVALID_USAGE, who + " refused " + op.what() + ": " + st.error_message()};
      return {DT_ERR_REMOTE, who + " is overloaded: " + st.error_message()};
    default: return {DT_ERR_REMOTE, who + " is unreachable: " + st.error_message()};
  }
}

bool PsClient::open_call(Op& op, grpc::ClientContext& ctx) {
  ctx.set_deadline(wall_deadline(op.deadline()));
  if (!token_.empty()) ctx.AddMetadata(kTokenKey, token_);
  if (track(&ctx)) return true;
  op.part_done(DT_ERR_ABORTED, "ps_grpc: " + op.what() + " aborted");
  return false;
}

bool PsClient::track(grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_) return false;
  calls_.insert(ctx);
  return true;
}

void PsClient::untrack(grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> lk(mu_);
  calls_.erase(ctx);
}

void PsClient::check_open(const char* op) {
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_) sdk::fail(DT_ERR_ABORTED, std::string("ps_grpc: ") + op + " after abort: " + reason_);
}

void PsClient::abort(const std::string& reason) {
  std::vector<std::shared_ptr<Op>> ops;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!aborted_) {
      aborted_ = true;
      reason_ = reason;
    }
    for (auto* c : calls_) c->TryCancel();
    for (auto& w : ops_)
      if (auto op = w.lock()) ops.push_back(std::move(op));
    ops_.clear();
  }
  for (auto& op : ops) op->abort("ps_grpc: " + op->what() + " aborted: " + reason);
}

PsClient::ClientTable& PsClient::table(uint32_t id, int kind, const char* op) {
  check_open(op);
  if (id >= tables_.size())
    sdk::fail(DT_ERR_INVALID_USAGE, std::string(op) + ": table id " + std::to_string(id) + " was not declared here (" +
                                        std::to_string(tables_.size()) + " tables)");
  ClientTable& t = tables_[id];
  if (kind >= 0 && t.desc.kind != kind)
    sdk::fail(DT_ERR_INVALID_USAGE, std::string(op) + ": table '" + t.desc.name + "' is " + kind_name(t.desc.kind) +
                                        ", not " + kind_name(kind));
  return t;
}

std::shared_ptr<Op> PsClient::new_op(const std::string& what, int parts, const Opts& o, uint64_t payload_bytes) {
  int64_t ms = o.timeout_ms > 0 ? o.timeout_ms : timeout_ms_;
  auto op = std::make_shared<Op>(what, parts, sdk::deadline_after(ms, timeout_ms_), ms);
  if (payload_bytes <= kSpinMaxBytes) op->set_wait_spin(std::chrono::microseconds(options_.wait_spin_us));
  return op;
}

std::shared_ptr<sdk::Work> PsClient::submit(const std::shared_ptr<Op>& op) {
  std::lock_guard<std::mutex> lk(mu_);
  ops_.erase(std::remove_if(ops_.begin(), ops_.end(),
                            [](const std::weak_ptr<Op>& w) {
                              auto p = w.lock();
                              return !p || p->done();
                            }),
             ops_.end());
  if (!op->done()) ops_.push_back(op);
  return op;
}

void PsClient::wait_after(Op& op) {
  for (auto& w : op.after) {
    auto a = w.lock();
    if (!a || a.get() == &op) continue;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(op.deadline() - sdk::Clock::now()).count();
    a->wait(std::max<int64_t>(0, left));
  }
}

void PsClient::run(const std::shared_ptr<Op>& op, int s, Call call) {
  pool_.post([this, op, s, call = std::move(call)] {
    wait_after(*op);
    if (op->done()) {
      op->part_done(DT_ERR_ABORTED, "");
      return;
    }
    Server& srv = *servers_[s];
    grpc::ClientContext ctx;
    if (!open_call(*op, ctx)) return;
    grpc::Status st;
    auto [code, msg] = part_status(s, srv.endpoint, [&] { st = call(ctx, srv); });
    if (code == DT_OK && !st.ok()) std::tie(code, msg) = translate(st, ctx, srv, *op);
    untrack(&ctx);
    op->part_done(code, msg);
  });
}

void PsClient::launch(const std::shared_ptr<Op>& op, std::unique_ptr<Batch> batch) {
  {
    std::lock_guard<std::mutex> lk(live_mu_);
    ++live_;
  }
  Batch* b = batch.release();
  auto go = [this, b] {
    {
      std::lock_guard<std::mutex> lk(b->mu);
      b->start();
    }
    if (b->release()) end_batch(b);
  };
  bool ready = true;
  for (auto& w : op->after)
    if (auto a = w.lock(); a && a.get() != op.get() && !a->done()) ready = false;
  if (ready) {
    go();
    return;
  }
  pool_.post([op, go] {
    wait_after(*op);
    go();
  });
}

void PsClient::end_batch(Batch* b) {
  delete b;
  // Notified under the lock: the destructor may return as soon as it sees 0.
  std::lock_guard<std::mutex> lk(live_mu_);
  --live_;
  live_cv_.notify_all();
}

void PsClient::poll() {
  void* tag = nullptr;
  bool ok = false;
  while (cq_.Next(&tag, &ok)) {
    auto* t = static_cast<Tag*>(tag);
    Batch* b = t->batch.load(std::memory_order_acquire);
    bool ended = false;
    {
      std::lock_guard<std::mutex> lk(b->mu);
      ended = b->on_event(t->call, t->kind, ok);
    }
    if (ended && b->release()) end_batch(b);
  }
}

// The calls of one op, one per part (Part: what the op asked of that call;
// C: the call's state, a CallState): start() skips every call once the op
// has ended and every call the client refuses (aborted), and begin() starts
// the others; end() reports a call's outcome to the op.
template <typename Part, typename C>
class PsClient::PartsBatch : public Batch {
 public:
  PartsBatch(PsClient* c, std::shared_ptr<Op> op, std::vector<Part> parts)
      : Batch(parts.size()), c_(c), op_(std::move(op)), parts_(std::move(parts)) {}

  void start() override {
    calls_.resize(parts_.size());
    const bool done = op_->done();
    for (size_t i = 0; i < parts_.size(); ++i) {
      if (done) {
        op_->part_done(DT_ERR_ABORTED, "");
        release();
        continue;
      }
      calls_[i] = std::make_unique<C>();
      C& call = *calls_[i];
      for (unsigned k = 0; k < 3; ++k) call.tags[k].set(this, i, k);
      if (!c_->open_call(*op_, call.ctx)) {
        release();
        continue;
      }
      begin(i, call, *c_->servers_[parts_[i].server]);
    }
  }

 protected:
  virtual void begin(size_t i, C& call, Server& srv) = 0;
  // Call i ended: DT_OK, or the error of the part's own work, else the
  // call's status translated.
  void end(size_t i, C& call, std::pair<dt_status_t, std::string> outcome) {
    if (outcome.first == DT_OK && !call.status.ok())
      outcome = c_->translate(call.status, call.ctx, *c_->servers_[parts_[i].server], *op_);
    c_->untrack(&call.ctx);
    op_->part_done(outcome.first, outcome.second);
  }
  // Runs f, the part's own work on what the call brought (a throw fails the part).
  template <typename F>
  std::pair<dt_status_t, std::string> work(size_t i, F&& f) {
    const Server& srv = *c_->servers_[parts_[i].server];
    return part_status(srv.index, srv.endpoint, std::forward<F>(f));
  }

  PsClient* c_;
  std::shared_ptr<Op> op_;
  std::vector<Part> parts_;
  std::vector<std::unique_ptr<C>> calls_;
};

namespace {

// A call's tags (kinds 0-2), context and final status.
struct CallState {
  Tag tags[3];
  grpc::ClientContext ctx;
  grpc::Status status;
};

struct UnaryCall : CallState {
  grpc::ByteBuffer reply;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> rpc;
};

struct StreamCall : CallState {
  Empty reply;
  std::unique_ptr<grpc::ClientAsyncWriter<RawMessage>> rpc;
  RawMessage msg;   // the message being written
  size_t next = 0;  // the next message to write
};

struct PullCall : CallState {
  DenseChunk chunk;
  std::unique_ptr<grpc::ClientAsyncReader<DenseChunk>> rpc;
  bool started = false, read_all = false;
  std::pair<dt_status_t, std::string> error{DT_OK, ""};  // a chunk's (the call then cancelled)
};

}  // namespace

class PsClient::UnaryBatch final : public PartsBatch<UnaryPart, UnaryCall> {
 public:
  UnaryBatch(PsClient* c, std::shared_ptr<Op> op, const char* method, std::vector<UnaryPart> parts)
      : PartsBatch(c, std::move(op), std::move(parts)), method_(method) {}

  bool on_event(size_t i, unsigned, bool) override {
    UnaryCall& call = *calls_[i];
    std::pair<dt_status_t, std::string> outcome{DT_OK, ""};
    if (call.status.ok()) outcome = work(i, [&] { parts_[i].on_reply(call.reply); });
    call.reply.Clear();
    end(i, call, std::move(outcome));
    return true;
  }

 private:
  void begin(size_t i, UnaryCall& call, Server& srv) override {
    call.rpc = srv.generic_stub().PrepareUnaryCall(&call.ctx, method_, parts_[i].request, &c_->cq_);
    call.rpc->StartCall();
    call.rpc->Finish(&call.reply, &call.status, &call.tags[0]);
  }

  const char* method_;
};

void PsClient::run_unary(const std::shared_ptr<Op>& op, const char* method, std::vector<UnaryPart> parts) {
  launch(op, std::make_unique<UnaryBatch>(this, op, method, std::move(parts)));
}

class PsClient::StreamBatch final : public PartsBatch<StreamPart, StreamCall> {
 public:
  StreamBatch(PsClient* c, std::shared_ptr<Op> op, const char* method, std::vector<StreamPart> parts)
      : PartsBatch(c, std::move(op), std::move(parts)), method_(method) {}

  bool on_event(size_t i, unsigned kind, bool ok) override {
    StreamCall& call = *calls_[i];
    if (kind == kWrite) {
      if (!ok) call.next = parts_[i].count;  // the stream broke: its status says why
      step(i);
      return false;
    }
    end(i, call, {DT_OK, ""});
    return true;
  }

 private:
  static constexpr unsigned kWrite = 0, kFinish = 1;
  void begin(size_t i, StreamCall& call, Server& srv) override {
    call.ctx.set_initial_metadata_corked(true);
    const auto& ch = srv.channel();
    grpc::internal::RpcMethod rpc(method_, grpc::internal::RpcMethod::CLIENT_STREAMING, ch);
    call.rpc.reset(grpc::internal::ClientAsyncWriterFactory<RawMessage>::Create(ch.get(), &c_->cq_, rpc, &call.ctx,
                                                                                &call.reply, false, nullptr));
    call.rpc->StartCall(nullptr);  // corked: the headers go with the first write, no event
    step(i);
  }
  // Writes call i's next message, or ends the call after its last (or when
  // the op ended: cancelled).
  void step(size_t i) {
    StreamCall& call = *calls_[i];
    const StreamPart& p = parts_[i];
    call.msg = RawMessage();
    if (call.next < p.count && p.make(call.next, &call.msg)) {
      grpc::WriteOptions wo;
      if (call.next + 1 == p.count) wo.set_last_message();
      ++call.next;
      call.rpc->Write(call.msg, wo, &call.tags[kWrite]);
      return;
    }
    if (call.next < p.count) call.ctx.TryCancel();
    call.next = p.count + 1;  // no more writes
    call.rpc->Finish(&call.status, &call.tags[kFinish]);
  }

  const char* method_;
};

void PsClient::run_streams(const std::shared_ptr<Op>& op, const char* method, std::vector<StreamPart> parts) {
  launch(op, std::make_unique<StreamBatch>(this, op, method, std::move(parts)));
}

class PsClient::PullBatch final : public PartsBatch<PullPart, PullCall> {
 public:
  using PartsBatch::PartsBatch;

  bool on_event(size_t i, unsigned kind, bool ok) override {
    PullCall& call = *calls_[i];
    const PullPart& p = parts_[i];
    if (kind == kFinish) {
      auto outcome = call.error;
      if (outcome.first == DT_OK && call.status.ok()) outcome = work(i, [&] { p.on_end(); });
      end(i, call, std::move(outcome));
      return true;
    }
    if (kind == kStart) {
      call.started = true;
    } else if (ok) {
      bool more = false;
      call.error = work(i, [&] { more = p.on_chunk(call.chunk); });
      if (more) {
        call.rpc->Read(&call.chunk, &call.tags[kRead]);
        return false;
      }
      call.ctx.TryCancel();
      call.read_all = true;
    } else {
      call.read_all = true;
    }
    if (call.started && call.read_all) call.rpc->Finish(&call.status, &call.tags[kFinish]);
    return false;
  }

 private:
  static constexpr unsigned kStart = 0, kRead = 1, kFinish = 2;
  void begin(size_t i, PullCall& call, Server& srv) override {
    call.rpc = srv.stub().PrepareAsyncPullDense(&call.ctx, parts_[i].request, &c_->cq_);
    // The first read goes with the start: two events, then one per chunk.
    call.rpc->StartCall(&call.tags[kStart]);
    call.rpc->Read(&call.chunk, &call.tags[kRead]);
  }
};

void PsClient::run_pulls(const std::shared_ptr<Op>& op, std::vector<PullPart> parts) {
  launch(op, std::make_unique<PullBatch>(this, op, std::move(parts)));
}

}  // namespace dtrain::ps_grpc
