// The raw-gRPC reference: a bare echo service with the threading of the
// ps_grpc plugin's server (gRPC's synchronous server), and a client that
// sends the same payloads a PS call would, chunked the same way.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "bench/ps_echo.grpc.pb.h"
#include "ps_internal.h"
#include "dtrain/error.h"

namespace dtrain::bench::psb {

namespace {

class EchoService final : public dtrain::bench::Echo::Service {
 public:
  explicit EchoService(size_t max_reply) : block_(max_reply, '\x5a') {}
  grpc::Status Call(grpc::ServerContext*, const EchoRequest* req, EchoReply* reply) override {
    if (req->reply_bytes() > block_.size())
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "reply larger than a chunk");
    if (req->reply_bytes()) reply->mutable_payload()->assign(block_.data(), req->reply_bytes());
    return grpc::Status::OK;
  }

 private:
  std::string block_;
};

// One message of a call: its request bytes (copied in, as the plugin copies
// keys and values into its messages) and where its reply goes.
struct Pending {
  grpc::ClientContext ctx;
  EchoRequest req;
  EchoReply reply;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<EchoReply>> rpc;
  char* out = nullptr;
  size_t out_bytes = 0;
};

class GrpcImpl : public Impl {
 public:
  GrpcImpl(const std::vector<std::string>& endpoints, size_t chunk) : chunk_(chunk) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    for (auto& e : endpoints)
      stubs_.push_back(Echo::NewStub(grpc::CreateCustomChannel(e, grpc::InsecureChannelCredentials(), args)));
  }

  void sparse_pull(const uint64_t* keys, size_t n, size_t dim, float* out) override {
    const size_t row = dim * 4, per = std::max<size_t>(1, chunk_ / (8 + row));
    start();
    for_ranges(n, [&](int s, size_t b, size_t e) {
      for (size_t off = b; off < e; off += per) {
        size_t len = std::min(per, e - off);
        auto& p = add(s, len * row, reinterpret_cast<char*>(out + off * dim));
        p.req.set_payload(reinterpret_cast<const char*>(keys + off), len * 8);
      }
    });
    finish_all();
  }

  void sparse_push(const uint64_t* keys, size_t n, size_t dim, const float* grads) override {
    const size_t row = dim * 4, per = std::max<size_t>(1, chunk_ / (8 + row));
    start();
    for_ranges(n, [&](int s, size_t b, size_t e) {
      for (size_t off = b; off < e; off += per) {
        size_t len = std::min(per, e - off);
        auto& p = add(s, 0, nullptr);
        std::string* pl = p.req.mutable_payload();
        pl->resize(len * (8 + row));
        std::memcpy(pl->data(), keys + off, len * 8);
        std::memcpy(pl->data() + len * 8, grads + off * dim, len * row);
      }
    });
    finish_all();
  }

  void dense_pull(float* out, size_t count) override {
    const size_t per = std::max<size_t>(1, chunk_ / 4);
    start();
    for_ranges(count, [&](int s, size_t b, size_t e) {
      for (size_t off = b; off < e || off == b; off += per) {
        size_t len = std::min(per, e - off);
        add(s, len * 4, reinterpret_cast<char*>(out + off));
        if (len == 0) break;
      }
    });
    finish_all();
  }

  void dense_push(const float* grads, size_t count) override {
    const size_t per = std::max<size_t>(1, chunk_ / 4);
    start();
    for_ranges(count, [&](int s, size_t b, size_t e) {
      for (size_t off = b; off < e || off == b; off += per) {
        size_t len = std::min(per, e - off);
        add(s, 0, nullptr).req.set_payload(reinterpret_cast<const char*>(grads + off), len * 4);
        if (len == 0) break;
      }
    });
    finish_all();
  }

 private:
  // Even split over the servers, like a dense table's.
  template <class F>
  void for_ranges(size_t n, F&& f) {
    const int S = static_cast<int>(stubs_.size());
    for (int s = 0; s < S; ++s) {
      size_t b = n / S * s + std::min<size_t>(s, n % S), e = b + n / S + (size_t(s) < n % S ? 1 : 0);
      if (e > b || s == 0) f(s, b, e);
    }
  }
  void start() { pending_.clear(); }
  Pending& add(int s, size_t reply_bytes, char* out) {
    pending_.push_back(std::make_unique<Pending>());
    Pending& p = *pending_.back();
    p.req.set_reply_bytes(reply_bytes);
    p.out = out;
    p.out_bytes = reply_bytes;
    server_of_.resize(pending_.size());
    server_of_.back() = s;
    return p;
  }
  void finish_all() {
    for (size_t i = 0; i < pending_.size(); ++i) {
      Pending& p = *pending_[i];
      p.rpc = stubs_[server_of_[i]]->AsyncCall(&p.ctx, p.req, &cq_);
      p.rpc->Finish(&p.reply, &p.status, &p);
    }
    for (size_t left = pending_.size(); left > 0; --left) {
      void* tag = nullptr;
      bool ok = false;
      if (!cq_.Next(&tag, &ok)) throw IoError("raw gRPC reference: the completion queue shut down");
      auto* p = static_cast<Pending*>(tag);
      if (!ok || !p->status.ok()) throw IoError("raw gRPC reference: a call failed: " + p->status.error_message());
      if (p->reply.payload().size() != p->out_bytes) throw IoError("raw gRPC reference: a reply of the wrong size");
      if (p->out_bytes) std::memcpy(p->out, p->reply.payload().data(), p->out_bytes);
    }
  }

  size_t chunk_;
  std::vector<std::unique_ptr<Echo::Stub>> stubs_;
  grpc::CompletionQueue cq_;
  std::vector<std::unique_ptr<Pending>> pending_;
  std::vector<int> server_of_;
};

}  // namespace

std::unique_ptr<Impl> make_grpc_impl(const std::vector<std::string>& endpoints, size_t chunk_bytes) {
  return std::make_unique<GrpcImpl>(endpoints, chunk_bytes);
}

int echo_server_main(Store& store, int index, size_t chunk_bytes) {
  EchoService service(chunk_bytes);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(chunk_bytes + (1 << 20)));
  builder.SetMaxSendMessageSize(-1);
  auto server = builder.BuildAndStart();
  if (!server || port == 0) throw IoError("raw gRPC reference: the echo server could not listen on 127.0.0.1");
  store.set("echo/" + std::to_string(index), "127.0.0.1:" + std::to_string(port));
  store.wait({"stop"}, std::chrono::hours(24));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}

}  // namespace dtrain::bench::psb
