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
}

PsClient::~PsClient() { abort("the communicator was destroyed"); }

grpc::Status PsClient::Server::unary(grpc::ClientContext& ctx, const char* method, const grpc::ByteBuffer& request,
                                     grpc::ByteBuffer* reply) {
  grpc::GenericStub& g = *generic[next.fetch_add(1, std::memory_order_relaxed) % generic.size()];
  grpc::CompletionQueue cq;
  grpc::Status st;
  auto rpc = g.PrepareUnaryCall(&ctx, method, request, &cq);
  rpc->StartCall();
  rpc->Finish(reply, &st, nullptr);
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return st;
}

grpc::Status PsClient::Server::client_stream(grpc::ClientContext& ctx, const char* method,
                                             const std::vector<RawMessage>& msgs) {
  const auto& ch = channel();
  grpc::internal::RpcMethod rpc(method, grpc::internal::RpcMethod::CLIENT_STREAMING, ch);
  Empty reply;
  std::unique_ptr<grpc::ClientWriter<RawMessage>> writer(
      grpc::internal::ClientWriterFactory<RawMessage>::Create(ch.get(), rpc, &ctx, &reply));
  for (const RawMessage& m : msgs)
    if (!writer->Write(m)) break;
  writer->WritesDone();
  return writer->Finish();
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

std::shared_ptr<Op> PsClient::new_op(const std::string& what, int parts, const Opts& o) {
  int64_t ms = o.timeout_ms > 0 ? o.timeout_ms : timeout_ms_;
  return std::make_shared<Op>(what, parts, sdk::deadline_after(ms, timeout_ms_), ms);
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
    dt_status_t code = DT_OK;
    std::string msg;
    try {
      grpc::Status st = call(ctx, srv);
      if (!st.ok()) std::tie(code, msg) = translate(st, ctx, srv, *op);
    } catch (const sdk::Error& e) {
      code = e.status();
      msg = "parameter server " + std::to_string(s) + " (" + srv.endpoint + "): " + e.what();
    } catch (const std::exception& e) {
      code = DT_ERR_INTERNAL;
      msg = e.what();
    }
    untrack(&ctx);
    op->part_done(code, msg);
  });
}

void PsClient::run_unary(const std::shared_ptr<Op>& op, const char* method, std::vector<UnaryPart> parts) {
  pool_.post([this, op, method, parts = std::move(parts)] {
    wait_after(*op);
    struct Pending {
      grpc::ClientContext ctx;
      grpc::ByteBuffer reply;
      grpc::Status status;
      std::unique_ptr<grpc::GenericClientAsyncResponseReader> rpc;
    };
    std::vector<std::unique_ptr<Pending>> calls(parts.size());
    grpc::CompletionQueue cq;
    size_t started = 0;
    const bool done = op->done();
    for (size_t i = 0; i < parts.size(); ++i) {
      if (done) {
        op->part_done(DT_ERR_ABORTED, "");
        continue;
      }
      auto c = std::make_unique<Pending>();
      if (!open_call(*op, c->ctx)) continue;
      Server& srv = *servers_[parts[i].server];
      c->rpc = srv.generic_stub().PrepareUnaryCall(&c->ctx, method, parts[i].request, &cq);
      c->rpc->StartCall();
      c->rpc->Finish(&c->reply, &c->status, reinterpret_cast<void*>(i));
      calls[i] = std::move(c);
      ++started;
    }
    for (size_t k = 0; k < started; ++k) {
      void* tag = nullptr;
      bool ok = false;
      if (!cq.Next(&tag, &ok)) break;  // cannot happen before Shutdown
      const size_t i = reinterpret_cast<size_t>(tag);
      Pending& c = *calls[i];
      Server& srv = *servers_[parts[i].server];
      dt_status_t code = DT_OK;
      std::string msg;
      try {
        if (!c.status.ok())
          std::tie(code, msg) = translate(c.status, c.ctx, srv, *op);
        else
          parts[i].on_reply(c.reply);
      } catch (const sdk::Error& e) {
        code = e.status();
        msg = "parameter server " + std::to_string(srv.index) + " (" + srv.endpoint + "): " + e.what();
      } catch (const std::exception& e) {
        code = DT_ERR_INTERNAL;
        msg = e.what();
      }
      untrack(&c.ctx);
      c.reply.Clear();
      op->part_done(code, msg);
    }
    cq.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
    }
  });
}

void PsClient::run_streams(const std::shared_ptr<Op>& op, const char* method, std::vector<StreamPart> parts) {
  pool_.post([this, op, method, parts = std::move(parts)] {
    wait_after(*op);
    struct Pending {
      grpc::ClientContext ctx;
      Empty reply;
      grpc::Status status;
      std::unique_ptr<grpc::ClientAsyncWriter<RawMessage>> rpc;
      RawMessage msg;   // the message being written
      size_t next = 0;  // the next message to write
    };
    std::vector<std::unique_ptr<Pending>> calls(parts.size());
    grpc::CompletionQueue cq;
    // Tags: 2 * call + 0 (a write) or 1 (the call's end).
    auto tag = [](size_t i, size_t kind) { return reinterpret_cast<void*>(2 * i + kind); };
    // Writes call i's next message, or ends the call after its last (or
    // when the op ended: cancelled).
    auto step = [&](size_t i) {
      Pending& c = *calls[i];
      const StreamPart& p = parts[i];
      c.msg = RawMessage();
      if (c.next < p.count && p.make(c.next, &c.msg)) {
        grpc::WriteOptions wo;
        if (c.next + 1 == p.count) wo.set_last_message();
        c.rpc->Write(c.msg, wo, tag(i, 0));
        ++c.next;
        return;
      }
      if (c.next < p.count) c.ctx.TryCancel();
      c.next = p.count + 1;  // no more writes
      c.rpc->Finish(&c.status, tag(i, 1));
    };
    size_t started = 0;
    const bool done = op->done();
    for (size_t i = 0; i < parts.size(); ++i) {
      if (done) {
        op->part_done(DT_ERR_ABORTED, "");
        continue;
      }
      auto c = std::make_unique<Pending>();
      if (!open_call(*op, c->ctx)) continue;
      c->ctx.set_initial_metadata_corked(true);
      const auto& ch = servers_[parts[i].server]->channel();
      grpc::internal::RpcMethod rpc(method, grpc::internal::RpcMethod::CLIENT_STREAMING, ch);
      c->rpc.reset(grpc::internal::ClientAsyncWriterFactory<RawMessage>::Create(ch.get(), &cq, rpc, &c->ctx, &c->reply,
                                                                                false, nullptr));
      c->rpc->StartCall(nullptr);  // corked: the headers go with the first write
      calls[i] = std::move(c);
      ++started;
      step(i);
    }
    for (size_t ended = 0; ended < started;) {
      void* t = nullptr;
      bool ok = false;
      if (!cq.Next(&t, &ok)) break;  // cannot happen before Shutdown
      const size_t i = reinterpret_cast<size_t>(t) / 2;
      Pending& c = *calls[i];
      if (reinterpret_cast<size_t>(t) % 2 == 0) {
        if (!ok) c.next = parts[i].count;  // the stream broke: its status says why
        step(i);
        continue;
      }
      ++ended;
      Server& srv = *servers_[parts[i].server];
      dt_status_t code = DT_OK;
      std::string msg;
      if (!c.status.ok()) std::tie(code, msg) = translate(c.status, c.ctx, srv, *op);
      untrack(&c.ctx);
      op->part_done(code, msg);
    }
    cq.Shutdown();
    void* t = nullptr;
    bool ok = false;
    while (cq.Next(&t, &ok)) {
    }
  });
}

}  // namespace dtrain::ps_grpc
