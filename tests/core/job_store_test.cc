// The store connection of a job started without the launcher (job/job_store.h):
// on several machines only with a secret, and never on a loopback address.
#include "job/job_store.h"

#include <cstdlib>
#include <optional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/error.h"

using namespace dtrain;
using ::testing::HasSubstr;

namespace {

// Sets (or unsets, with nullopt) environment variables for one test.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, std::optional<std::string>>> vars) {
    for (auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      if (value)
        ::setenv(name, value->c_str(), 1);
      else
        ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    for (auto& [name, value] : saved_) {
      if (value)
        ::setenv(name.c_str(), value->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

RoleInfo self_hosted(int rank, int nnodes, const std::string& endpoint) {
  RoleInfo r;
  r.rank = rank;
  r.world_size = 2;
  r.nnodes = nnodes;
  r.store_endpoint = endpoint;
  r.self_hosted_store = true;
  r.job_id = "torchrun-local";
  r.source = "torchrun env";
  return r;
}

std::string message_of(const RoleInfo& role, bool serves) {
  try {
    connect_job_store(role, serves, role.nnodes > 1, std::chrono::seconds(2));
  } catch (const InvalidUsage& e) {
    return e.what();
  }
  return "(no error)";
}

const std::optional<std::string> kUnset;

}  // namespace

TEST(JobStore, SeveralMachinesWithoutASecretRefuseToStartAndSayHow) {
  ScopedEnv env{{"DTRAIN_JOB_TOKEN", kUnset}, {"DTRAIN_TOKEN_FILE", kUnset}, {"DTRAIN_INSECURE_OPEN_JOB", kUnset}};
  for (int rank : {0, 1}) {
    std::string m = message_of(self_hosted(rank, 2, "10.1.2.3:29500"), rank == 0);
    EXPECT_THAT(m, HasSubstr("needs a shared secret"));
    EXPECT_THAT(m, HasSubstr("DTRAIN_TOKEN_FILE"));
    EXPECT_THAT(m, HasSubstr("DTRAIN_INSECURE_OPEN_JOB=1"));
  }
}

TEST(JobStore, AShortSecretIsRefused) {
  ScopedEnv env{{"DTRAIN_JOB_TOKEN", std::string("short")}, {"DTRAIN_TOKEN_FILE", kUnset}};
  EXPECT_THAT(message_of(self_hosted(0, 2, "10.1.2.3:29500"), true), HasSubstr("at least 16"));
}

TEST(JobStore, ALoopbackStoreAddressOnSeveralMachinesIsRefusedNotBoundToEveryInterface) {
  for (const auto& open : {std::optional<std::string>("1"), kUnset}) {
    ScopedEnv env{{"DTRAIN_JOB_TOKEN", open ? kUnset : std::optional<std::string>("0123456789abcdef0123")},
                  {"DTRAIN_TOKEN_FILE", kUnset},
                  {"DTRAIN_INSECURE_OPEN_JOB", open}};
    for (const char* ep : {"127.0.0.1:29500", "localhost:29500"}) {
      std::string m = message_of(self_hosted(0, 2, ep), true);
      EXPECT_THAT(m, HasSubstr("loopback address on this machine"));
      EXPECT_THAT(m, HasSubstr("MASTER_ADDR"));
    }
  }
}

TEST(JobStore, OneMachineNeedsNoSecretAndRankZeroServes) {
  ScopedEnv env{{"DTRAIN_JOB_TOKEN", kUnset}, {"DTRAIN_TOKEN_FILE", kUnset}};
  uint16_t port = TcpStoreServer("127.0.0.1", 0, "probe").port();
  std::string ep = "127.0.0.1:" + std::to_string(port);
  JobStore host = connect_job_store(self_hosted(0, 1, ep), true, false, std::chrono::seconds(5));
  ASSERT_NE(host.server, nullptr);
  EXPECT_EQ(host.server->host(), "127.0.0.1");
  host.store->set("k", std::string("v"));
  JobStore peer = connect_job_store(self_hosted(1, 1, ep), false, false, std::chrono::seconds(5));
  EXPECT_EQ(peer.server, nullptr);
  EXPECT_EQ(peer.store->get_string("k"), "v");
}
