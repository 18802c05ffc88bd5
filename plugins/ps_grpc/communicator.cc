#include "communicator.h"

#include <grpcpp/resource_quota.h>

namespace dtrain::ps_grpc {

namespace {

float* f32(const sdk::Communicator::Buf& b, const char* op, const char* what) {
  sdk::require_cpu(b, "ps_grpc");
  if (b.dtype != DT_DTYPE_F32)
    sdk::fail(DT_ERR_NOT_SUPPORTED, std::string(op) + ": " + what + " are " + sdk::dtype_name(b.dtype) +
                                        "; parameter-server tables hold f32 only");
  if (b.count && !b.ptr) sdk::fail(DT_ERR_INVALID_USAGE, std::string(op) + ": " + what + " is null");
  return static_cast<float*>(b.ptr);
}

}  // namespace

PsCommunicator::PsCommunicator(const sdk::CommInit& init) : options_(PsOptions::parse(init)), rank_(init.rank) {
  if (init.num_servers < 1 || init.num_workers < 1)
    sdk::fail(DT_ERR_INVALID_USAGE,
              "ps_grpc: a parameter-server communicator needs num_servers >= 1 and "
              "num_workers >= 1 (got " +
                  std::to_string(init.num_servers) + " and " + std::to_string(init.num_workers) + ")");
  if (!init.is_server()) {
    client_ = std::make_unique<PsClient>(init, options_);
    return;
  }
  if (rank_ < 0 || rank_ >= init.num_servers)
    sdk::fail(DT_ERR_INVALID_USAGE, "ps_grpc: server rank " + std::to_string(rank_) + " is not in [0, " +
                                        std::to_string(init.num_servers) + ")");
  if (options_.keep_memory) keep_freed_memory();
  service_ = std::make_unique<PsService>(init, options_);
  std::string host = options_.bind_host(init);
  std::string bind =
      (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(options_.port);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(bind, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes());
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (options_.threads > 0) {
    grpc::ResourceQuota quota("dtrain-ps-server");
    quota.SetMaxThreads(options_.threads);
    builder.SetResourceQuota(quota);
  }
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0)
    sdk::fail(DT_ERR_SYSTEM, "ps_grpc: parameter server " + std::to_string(rank_) + " could not listen on " + bind);
  endpoint_ = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  service_->set_endpoint(endpoint_);
  init.store.set("ps/server/" + std::to_string(rank_), endpoint_);
  sdk::Log::info("ps_grpc: parameter server " + std::to_string(rank_) + " listening on " + endpoint_);
}

PsCommunicator::~PsCommunicator() {
  if (server_) {
    service_->stop(DT_ERR_ABORTED, "the communicator was destroyed");
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
  }
  client_.reset();
}

PsClient& PsCommunicator::client(const char* op) {
  if (!client_)
    sdk::fail(DT_ERR_INVALID_USAGE, std::string(op) + " is a worker operation; this communicator is parameter server " +
                                        std::to_string(rank_));
  return *client_;
}

std::shared_ptr<sdk::Work> PsCommunicator::ps_table(const sdk::TableDesc& desc, uint32_t* table, const Opts& o) {
  return client("ps_table").declare(desc, table, o);
}

std::shared_ptr<sdk::Work> PsCommunicator::ps_pull_dense(uint32_t table, const Buf& values, const Opts& o) {
  PsClient& c = client("ps_pull_dense");
  return c.pull_dense(table, f32(values, "ps_pull_dense", "values"), values.count, o);
}

std::shared_ptr<sdk::Work> PsCommunicator::ps_push_dense(uint32_t table, const Buf& grads, const Opts& o) {
  PsClient& c = client("ps_push_dense");
  return c.push_dense(table, f32(grads, "ps_push_dense", "grads"), grads.count, o);
}

std::shared_ptr<sdk::Work> PsCommunicator::ps_pull_sparse(uint32_t table, const uint64_t* keys, uint64_t n,
                                                          const Buf& values, const Opts& o) {
  PsClient& c = client("ps_pull_sparse");
  return c.pull_sparse(table, keys, n, f32(values, "ps_pull_sparse", "values"), values.count, o);
}

std::shared_ptr<sdk::Work> PsCommunicator::ps_push_sparse(uint32_t table, const uint64_t* keys, uint64_t n,
                                                          const Buf& grads, const float* show_click, const Opts& o) {
  PsClient& c = client("ps_push_sparse");
  return c.push_sparse(table, keys, n, f32(grads, "ps_push_sparse", "grads"), grads.count, show_click, o);
}

std::shared_ptr<sdk::Work> PsCommunicator::ps_save(uint32_t table, const std::string& dir, int32_t mode, int32_t format,
                                                   const Opts& o) {
  return client("ps_save").save(table, dir, mode, format, o);
}

std::shared_ptr<sdk::Work> PsCommunicator::ps_load(uint32_t table, const std::string& dir, const Opts& o) {
  return client("ps_load").load(table, dir, o);
}

std::shared_ptr<sdk::Work> PsCommunicator::ps_shrink(uint32_t table, uint32_t flags, const Opts& o) {
  return client("ps_shrink").shrink(table, flags, o);
}

std::shared_ptr<sdk::Work> PsCommunicator::ps_barrier(const Opts& o) { return client("ps_barrier").barrier(o); }

std::shared_ptr<sdk::Work> PsCommunicator::ps_finish(const Opts& o) { return client("ps_finish").finish(o); }

std::shared_ptr<sdk::Work> PsCommunicator::ps_serve(const Opts&) {
  if (!service_)
    sdk::fail(DT_ERR_INVALID_USAGE,
              "ps_serve is a server operation; this communicator is worker " + std::to_string(rank_));
  return service_->serve_work();
}

void PsCommunicator::ps_stop(const std::string& reason) {
  if (service_) {
    sdk::Log::info("ps_grpc: parameter server " + std::to_string(rank_) + " stopping: " + reason);
    service_->stop(DT_OK, reason);
  }
}

void PsCommunicator::abort(const std::string& reason) {
  if (service_) service_->stop(DT_ERR_ABORTED, "ps_grpc: aborted: " + reason);
  if (client_) client_->abort(reason);
}

}  // namespace dtrain::ps_grpc
