#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "service/client.h"
#include "dtrain/sdk/backend.h"
#include "options.h"
#include "service/service.h"

namespace dtrain::ps_grpc {

// One PS communicator: on a server (DT_ROLE_SERVER) the gRPC server with
// this server's part of every table, started and published in the store
// (`ps/server/<rank>` = "host:port") at creation; on a worker a PsClient
// connected to every server. Operations of the other role are refused.
class PsCommunicator : public sdk::Communicator {
 public:
  explicit PsCommunicator(const sdk::CommInit& init);
  ~PsCommunicator() override;

  std::shared_ptr<sdk::Work> ps_table(const sdk::TableDesc& desc, uint32_t* table, const Opts& o) override;
  std::shared_ptr<sdk::Work> ps_pull_dense(uint32_t table, const Buf& values, const Opts& o) override;
  std::shared_ptr<sdk::Work> ps_push_dense(uint32_t table, const Buf& grads, const Opts& o) override;
  std::shared_ptr<sdk::Work> ps_pull_sparse(uint32_t table, const uint64_t* keys, uint64_t n, const Buf& values,
                                            const Opts& o) override;
  std::shared_ptr<sdk::Work> ps_push_sparse(uint32_t table, const uint64_t* keys, uint64_t n, const Buf& grads,
                                            const float* show_click, const Opts& o) override;
  std::shared_ptr<sdk::Work> ps_save(uint32_t table, const std::string& dir, int32_t mode, int32_t format,
                                     const Opts& o) override;
  std::shared_ptr<sdk::Work> ps_load(uint32_t table, const std::string& dir, const Opts& o) override;
  std::shared_ptr<sdk::Work> ps_shrink(uint32_t table, uint32_t flags, const Opts& o) override;
  std::shared_ptr<sdk::Work> ps_barrier(const Opts& o) override;
  std::shared_ptr<sdk::Work> ps_finish(const Opts& o) override;
  std::shared_ptr<sdk::Work> ps_serve(const Opts& o) override;
  void ps_stop(const std::string& reason) override;
  void abort(const std::string& reason) override;

 private:
  PsClient& client(const char* op);
  PsOptions options_;
  int rank_;
  std::string endpoint_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<PsClient> client_;
};

}  // namespace dtrain::ps_grpc
