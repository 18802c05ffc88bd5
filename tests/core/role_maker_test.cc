#include "dtrain/role_maker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "dtrain/config.h"
#include "dtrain/error.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using Env = std::map<std::string, std::string>;

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "nothing was thrown";
  return "";
}

std::string env_error(const Env& env) {
  return error_of<InvalidUsage>([&] { EnvRoleMaker(env).resolve(); });
}

TEST(EnvRoleMakerTest, EmptyEnvironmentIsSingleProcess) {
  EnvRoleMaker maker(Env{{"HOME", "/root"}, {"DTRAIN_JOB_ID", "j1"}});
  EXPECT_FALSE(maker.applies());
  RoleInfo info = maker.resolve();
  EXPECT_EQ(info.role, Role::Worker);
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_world_size, 1);
  EXPECT_EQ(info.server_index, -1);
  EXPECT_EQ(info.source, "default");
  EXPECT_EQ(info.job_id, "j1");
  EXPECT_EQ(maker.name(), "env");
}

TEST(EnvRoleMakerTest, DtrainWorker) {
  EnvRoleMaker maker(Env{{"DTRAIN_RANK", "3"},
                         {"DTRAIN_WORLD_SIZE", "4"},
                         {"DTRAIN_LOCAL_RANK", "1"},
                         {"DTRAIN_LOCAL_WORLD_SIZE", "2"},
                         {"DTRAIN_NODE_RANK", "1"},
                         {"DTRAIN_NNODES", "2"},
                         {"DTRAIN_ROLE", "Worker"},
                         {"DTRAIN_STORE", "127.0.0.1:6170"},
                         {"DTRAIN_JOB_TOKEN", "secret"},
                         {"DTRAIN_JOB_ID", "job-7"},
                         {"DTRAIN_RESTART_COUNT", "2"},
                         {"DTRAIN_WORKER_ENDPOINTS", "127.0.0.1:6170, 127.0.0.1:6171,127.0.0.2:6170,127.0.0.2:6171"}});
  EXPECT_TRUE(maker.applies());
  RoleInfo info = maker.resolve();
  EXPECT_EQ(info.role, Role::Worker);
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.nnodes, 2);
  EXPECT_EQ(info.store_endpoint, "127.0.0.1:6170");
  EXPECT_EQ(info.job_token, "secret");
  EXPECT_EQ(info.job_id, "job-7");
  EXPECT_EQ(info.restart_count, 2);
  ASSERT_EQ(info.worker_endpoints.size(), 4u);
  EXPECT_EQ(info.worker_endpoints[1], "127.0.0.1:6171");
  EXPECT_EQ(info.current_endpoint, "127.0.0.2:6171");
  EXPECT_EQ(info.source, "dtrain env");
  std::string d = info.describe();
  EXPECT_THAT(d, HasSubstr("worker rank 3/4"));
  EXPECT_THAT(d, HasSubstr("127.0.0.2:6171"));
  EXPECT_THAT(d, HasSubstr("dtrain env"));
  EXPECT_THAT(d, ::testing::Not(HasSubstr("secret")));
}

TEST(EnvRoleMakerTest, DtrainLocalDefaultsOnOneNode) {
  RoleInfo info = EnvRoleMaker(Env{{"DTRAIN_RANK", "1"}, {"DTRAIN_WORLD_SIZE", "2"}}).resolve();
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.node_rank, 0);
  EXPECT_EQ(info.nnodes, 1);
  EXPECT_TRUE(info.current_endpoint.empty());
}

TEST(EnvRoleMakerTest, DtrainServer) {
  RoleInfo info = EnvRoleMaker(Env{{"DTRAIN_ROLE", "server"},
                                   {"DTRAIN_WORLD_SIZE", "3"},
                                   {"DTRAIN_SERVER_ENDPOINTS", "127.0.0.1:7000,127.0.0.1:7001"},
                                   {"DTRAIN_CURRENT_ENDPOINT", "127.0.0.1:7001"}})
                      .resolve();
  EXPECT_EQ(info.role, Role::Server);
  EXPECT_EQ(info.server_index, 1);
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 3);
  EXPECT_THAT(info.describe(), HasSubstr("server 1/2"));

  RoleInfo by_index = EnvRoleMaker(Env{{"DTRAIN_ROLE", "SERVER"},
                                       {"DTRAIN_SERVER_INDEX", "0"},
                                       {"DTRAIN_WORLD_SIZE", "3"},
                                       {"DTRAIN_SERVER_ENDPOINTS", "127.0.0.1:7000,127.0.0.1:7001"}})
                          .resolve();
  EXPECT_EQ(by_index.server_index, 0);
  EXPECT_EQ(by_index.current_endpoint, "127.0.0.1:7000");
}

TEST(EnvRoleMakerTest, PaddleTrainer) {
  EnvRoleMaker maker(Env{{"PADDLE_TRAINER_ID", "2"},
                         {"PADDLE_TRAINER_ENDPOINTS", "127.0.0.1:6170,127.0.0.1:6171,127.0.0.1:6172"},
                         {"TRAINING_ROLE", "TRAINER"}});
  EXPECT_TRUE(maker.applies());
  RoleInfo info = maker.resolve();
  EXPECT_EQ(info.role, Role::Worker);
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 3);  // PADDLE_TRAINERS_NUM defaults to the endpoint count
  EXPECT_EQ(info.current_endpoint, "127.0.0.1:6172");
  EXPECT_EQ(info.source, "paddle env");

  RoleInfo explicit_num = EnvRoleMaker(Env{{"PADDLE_TRAINER_ID", "0"},
                                           {"PADDLE_TRAINERS_NUM", "2"},
                                           {"PADDLE_CURRENT_ENDPOINT", "10.0.0.1:6170"},
                                           {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:7000"}})
                              .resolve();
  EXPECT_EQ(explicit_num.world_size, 2);
  EXPECT_EQ(explicit_num.current_endpoint, "10.0.0.1:6170");
  EXPECT_EQ(explicit_num.server_endpoints, (std::vector<std::string>{"127.0.0.1:7000"}));
}

TEST(EnvRoleMakerTest, PaddleCollectiveVariablesByHandHostTheStoreOnTrainerZero) {
  // As paddle.distributed.launch and a PaddleJob set them: no DTRAIN_STORE.
  const std::string eps = "10.0.0.1:6170,10.0.0.1:6171,10.0.0.2:6170,10.0.0.2:6171";
  RoleInfo info = EnvRoleMaker(Env{{"PADDLE_TRAINER_ID", "3"},
                                   {"PADDLE_TRAINERS_NUM", "4"},
                                   {"PADDLE_TRAINER_ENDPOINTS", eps},
                                   {"PADDLE_CURRENT_ENDPOINT", "10.0.0.2:6171"}})
                      .resolve();
  EXPECT_TRUE(info.self_hosted_store);
  EXPECT_EQ(info.store_endpoint, "10.0.0.1:6170");
  EXPECT_EQ(info.nnodes, 2);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  // Every trainer derives the same job id from the list.
  RoleInfo zero =
      EnvRoleMaker(Env{{"PADDLE_TRAINER_ID", "0"}, {"PADDLE_TRAINERS_NUM", "4"}, {"PADDLE_TRAINER_ENDPOINTS", eps}})
          .resolve();
  EXPECT_EQ(zero.job_id, info.job_id);
  EXPECT_EQ(zero.node_rank, 0);
  EXPECT_EQ(zero.local_rank, 0);
  // A launcher's store wins; a single trainer needs none.
  RoleInfo launched =
      EnvRoleMaker(
          Env{{"PADDLE_TRAINER_ID", "0"}, {"PADDLE_TRAINER_ENDPOINTS", eps}, {"DTRAIN_STORE", "10.0.0.1:7000"}})
          .resolve();
  EXPECT_FALSE(launched.self_hosted_store);
  EXPECT_EQ(launched.store_endpoint, "10.0.0.1:7000");
  EXPECT_FALSE(EnvRoleMaker(Env{{"PADDLE_TRAINER_ID", "0"}, {"PADDLE_TRAINER_ENDPOINTS", "127.0.0.1:6170"}})
                   .resolve()
                   .self_hosted_store);
}

TEST(EnvRoleMakerTest, SlurmHostListsExpand) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_hostlist("node[01-03,07],login1"), (V{"node01", "node02", "node03", "node07", "login1"}));
  EXPECT_EQ(expand_slurm_hostlist("gpu9"), (V{"gpu9"}));
  EXPECT_EQ(expand_slurm_hostlist("r[1-2]n[8-9]"), (V{"r1n8", "r1n9", "r2n8", "r2n9"}));
  EXPECT_EQ(expand_slurm_hostlist("a[098-100]"), (V{"a098", "a099", "a100"}));
  EXPECT_THROW(expand_slurm_hostlist("node[01-03"), InvalidUsage);
  EXPECT_THROW(expand_slurm_hostlist("node[3-1]"), InvalidUsage);
  EXPECT_THROW(expand_slurm_hostlist("node[x]"), InvalidUsage);
}

TEST(EnvRoleMakerTest, SlurmAcrossMachinesServesTheStoreOnTheFirstListedHost) {
  Env env{{"SLURM_PROCID", "2"},    {"SLURM_NTASKS", "4"},  {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "1"},    {"SLURM_NNODES", "2"},  {"SLURM_TASKS_PER_NODE", "2(x2)"},
          {"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "0"}, {"SLURM_JOB_NODELIST", "node[07-08]"}};
  RoleInfo info = EnvRoleMaker(env).resolve();
  EXPECT_TRUE(info.self_hosted_store);
  EXPECT_EQ(info.store_endpoint.rfind("node07:", 0), 0u) << info.store_endpoint;
  EXPECT_EQ(info.nnodes, 2);
  EXPECT_EQ(info.local_world_size, 2);
  // The port is the same on every task of the job (derived from the job id), or MASTER_PORT.
  env["SLURM_PROCID"] = "0";
  env["SLURM_NODEID"] = "0";
  EXPECT_EQ(EnvRoleMaker(env).resolve().store_endpoint, info.store_endpoint);
  env["MASTER_PORT"] = "29555";
  EXPECT_EQ(EnvRoleMaker(env).resolve().store_endpoint, "node07:29555");
  env["SLURM_JOB_NODELIST"] = "node[07-";
  EXPECT_THROW(EnvRoleMaker(env).resolve(), InvalidUsage);
}

TEST(EnvRoleMakerTest, PaddlePserver) {
  Env env{{"TRAINING_ROLE", "PSERVER"},
          {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"},
          {"PADDLE_CURRENT_ENDPOINT", "127.0.0.1:7002"},
          {"PADDLE_TRAINERS_NUM", "4"}};
  RoleInfo info = EnvRoleMaker(env).resolve();
  EXPECT_EQ(info.role, Role::Server);
  EXPECT_EQ(info.server_index, 2);
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.source, "paddle env");

  env.erase("PADDLE_CURRENT_ENDPOINT");
  env["POD_IP"] = "127.0.0.1";
  env["PADDLE_PORT"] = "7001";
  env["TRAINING_ROLE"] = "pserver";
  EXPECT_EQ(EnvRoleMaker(env).resolve().server_index, 1);

  env["TRAINING_ROLE"] = "server";
  env.erase("PADDLE_TRAINERS_NUM");
  env["PADDLE_TRAINER_ENDPOINTS"] = "127.0.0.1:6170,127.0.0.1:6171";
  RoleInfo counted = EnvRoleMaker(env).resolve();
  EXPECT_EQ(counted.world_size, 2);
  EXPECT_EQ(counted.role, Role::Server);
}

TEST(EnvRoleMakerTest, PaddlePserverNotInListFails) {
  std::string m = env_error(Env{{"TRAINING_ROLE", "PSERVER"},
                                {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:7000,127.0.0.1:7001"},
                                {"PADDLE_CURRENT_ENDPOINT", "127.0.0.1:7005"},
                                {"PADDLE_TRAINERS_NUM", "2"}});
  EXPECT_THAT(m, HasSubstr("PADDLE_CURRENT_ENDPOINT=127.0.0.1:7005 is not in PADDLE_PSERVERS_IP_PORT_LIST="));

  std::string pod = env_error(Env{{"TRAINING_ROLE", "PSERVER"},
                                  {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:7000"},
                                  {"POD_IP", "127.0.0.1"},
                                  {"PADDLE_PORT", "7009"},
                                  {"PADDLE_TRAINERS_NUM", "2"}});
  EXPECT_THAT(pod, HasSubstr("POD_IP:PADDLE_PORT=127.0.0.1:7009 is not in PADDLE_PSERVERS_IP_PORT_LIST"));

  std::string none = env_error(Env{
      {"TRAINING_ROLE", "PSERVER"}, {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:7000"}, {"PADDLE_TRAINERS_NUM", "2"}});
  EXPECT_THAT(none, HasSubstr("PADDLE_CURRENT_ENDPOINT"));
}

// Paddle's PS variables set by hand (no launcher): roles, the server index
// from POD_IP:PADDLE_PORT, num_servers, and the store server 0 serves.
TEST(EnvRoleMakerTest, PaddleParameterServerVariablesByHand) {
  Env server{{"TRAINING_ROLE", "PSERVER"},
             {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:7100,127.0.0.1:7101"},
             {"PADDLE_TRAINERS_NUM", "3"},
             {"POD_IP", "127.0.0.1"},
             {"PADDLE_PORT", "7101"}};
  RoleInfo s = EnvRoleMaker(server).resolve();
  EXPECT_EQ(s.role, Role::Server);
  EXPECT_EQ(s.server_index, 1);
  EXPECT_EQ(s.num_servers, 2);
  EXPECT_EQ(s.world_size, 3);
  EXPECT_EQ(s.current_endpoint, "127.0.0.1:7101");
  EXPECT_TRUE(s.self_hosted_store);
  EXPECT_EQ(s.store_endpoint, "127.0.0.1:7100");  // the first server's listed endpoint
  EXPECT_EQ(s.job_id.rfind("paddle-ps-", 0), 0u) << s.job_id;

  Env trainer{{"TRAINING_ROLE", "TRAINER"}, {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:7100,127.0.0.1:7101"},
              {"PADDLE_TRAINERS_NUM", "3"}, {"PADDLE_TRAINER_ID", "2"},
              {"POD_IP", "127.0.0.1"},      {"PADDLE_PORT", "7200"}};
  RoleInfo t = EnvRoleMaker(trainer).resolve();
  EXPECT_EQ(t.role, Role::Worker);
  EXPECT_EQ(t.rank, 2);
  EXPECT_EQ(t.world_size, 3);
  EXPECT_EQ(t.num_servers, 2);
  EXPECT_EQ(t.current_endpoint, "127.0.0.1:7200");
  EXPECT_EQ(t.store_endpoint, s.store_endpoint);
  EXPECT_EQ(t.job_id, s.job_id) << "every process derives the same job id";
  EXPECT_TRUE(t.self_hosted_store);

  // With a launcher's store the launcher serves it.
  trainer["DTRAIN_STORE"] = "127.0.0.1:6000";
  RoleInfo launched = EnvRoleMaker(trainer).resolve();
  EXPECT_FALSE(launched.self_hosted_store);
  EXPECT_EQ(launched.store_endpoint, "127.0.0.1:6000");

  // A collective Paddle job has no servers.
  EXPECT_EQ(EnvRoleMaker(Env{{"PADDLE_TRAINER_ID", "0"}, {"PADDLE_TRAINERS_NUM", "2"}}).resolve().num_servers, 0);
}

TEST(EnvRoleMakerTest, PaddleParameterServerErrorsNameTheVariables) {
  std::string not_listed = env_error(Env{{"TRAINING_ROLE", "PSERVER"},
                                         {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:7100,127.0.0.1:7101"},
                                         {"PADDLE_TRAINERS_NUM", "2"},
                                         {"POD_IP", "10.0.0.5"},
                                         {"PADDLE_PORT", "7101"}});
  EXPECT_THAT(not_listed, HasSubstr("POD_IP:PADDLE_PORT=10.0.0.5:7101 is not in PADDLE_PSERVERS_IP_PORT_LIST="
                                    "127.0.0.1:7100,127.0.0.1:7101"));
  EXPECT_THAT(env_error(Env{{"TRAINING_ROLE", "PSERVER"},
                            {"PADDLE_TRAINERS_NUM", "2"},
                            {"POD_IP", "127.0.0.1"},
                            {"PADDLE_PORT", "7100"}}),
              HasSubstr("TRAINING_ROLE=PSERVER needs PADDLE_PSERVERS_IP_PORT_LIST"));
  EXPECT_THAT(env_error(Env{{"TRAINING_ROLE", "TRAINER"},
                            {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:7100"},
                            {"PADDLE_TRAINER_ID", "0"}}),
              HasSubstr("PADDLE_TRAINERS_NUM is required in parameter-server mode"));
  EXPECT_THAT(env_error(Env{{"TRAINING_ROLE", "TRAINER"},
                            {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:7100"},
                            {"PADDLE_TRAINERS_NUM", "2"}}),
              HasSubstr("PADDLE_TRAINER_ID is not set"));
  EXPECT_THAT(env_error(Env{{"TRAINING_ROLE", "TRAINER"},
                            {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:7100"},
                            {"PADDLE_TRAINERS_NUM", "2"},
                            {"PADDLE_TRAINER_ID", "2"}}),
              HasSubstr("PADDLE_TRAINER_ID=2 is out of range for PADDLE_TRAINERS_NUM=2"));
  EXPECT_THAT(env_error(Env{{"TRAINING_ROLE", "PSERVER"},
                            {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:7100,nonsense"},
                            {"PADDLE_TRAINERS_NUM", "2"},
                            {"POD_IP", "127.0.0.1"},
                            {"PADDLE_PORT", "7100"}}),
              HasSubstr("PADDLE_PSERVERS_IP_PORT_LIST entry 'nonsense' is not host:port"));
}

TEST(EnvRoleMakerTest, DtrainLauncherServerCountsServers) {
  RoleInfo s = EnvRoleMaker(Env{{"DTRAIN_ROLE", "server"},
                                {"DTRAIN_SERVER_INDEX", "1"},
                                {"DTRAIN_WORLD_SIZE", "2"},
                                {"DTRAIN_SERVER_ENDPOINTS", "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"}})
                   .resolve();
  EXPECT_EQ(s.num_servers, 3);
  EXPECT_EQ(s.server_index, 1);
  EXPECT_FALSE(s.self_hosted_store);
}

TEST(EnvRoleMakerTest, DtrainTakesPrecedenceOverPaddle) {
  RoleInfo info = EnvRoleMaker(Env{{"DTRAIN_RANK", "1"},
                                   {"DTRAIN_WORLD_SIZE", "2"},
                                   {"PADDLE_TRAINER_ID", "5"},
                                   {"PADDLE_TRAINERS_NUM", "8"},
                                   {"TRAINING_ROLE", "PSERVER"}})
                      .resolve();
  EXPECT_EQ(info.role, Role::Worker);
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(info.source, "dtrain env");
}

TEST(EnvRoleMakerTest, BadValuesNameTheVariable) {
  EXPECT_THAT(env_error(Env{{"DTRAIN_RANK", "abc"}, {"DTRAIN_WORLD_SIZE", "2"}}),
              HasSubstr("DTRAIN_RANK='abc' is not an integer"));
  EXPECT_THAT(env_error(Env{{"DTRAIN_RANK", "1"}, {"DTRAIN_WORLD_SIZE", "2x"}}),
              HasSubstr("DTRAIN_WORLD_SIZE='2x' is not an integer"));
  EXPECT_THAT(env_error(Env{{"DTRAIN_RANK", "99999999999"}, {"DTRAIN_WORLD_SIZE", "2"}}), HasSubstr("DTRAIN_RANK"));

  std::string range = env_error(Env{{"DTRAIN_RANK", "4"}, {"DTRAIN_WORLD_SIZE", "4"}});
  EXPECT_THAT(range, HasSubstr("DTRAIN_RANK=4"));
  EXPECT_THAT(range, HasSubstr("DTRAIN_WORLD_SIZE=4"));

  std::string paddle_range = env_error(Env{{"PADDLE_TRAINER_ID", "3"}, {"PADDLE_TRAINERS_NUM", "2"}});
  EXPECT_THAT(paddle_range, HasSubstr("PADDLE_TRAINER_ID=3"));
  EXPECT_THAT(paddle_range, HasSubstr("PADDLE_TRAINERS_NUM=2"));

  EXPECT_THAT(env_error(Env{{"DTRAIN_RANK", "-1"}, {"DTRAIN_WORLD_SIZE", "2"}}),
              HasSubstr("DTRAIN_RANK=-1 must not be negative"));
  EXPECT_THAT(env_error(Env{{"DTRAIN_RANK", "0"}, {"DTRAIN_WORLD_SIZE", "0"}}),
              HasSubstr("DTRAIN_WORLD_SIZE=0 must be at least 1"));
  EXPECT_THAT(env_error(Env{{"TRAINING_ROLE", "COORDINATOR"}, {"PADDLE_TRAINER_ID", "0"}}),
              HasSubstr("TRAINING_ROLE='COORDINATOR' must be TRAINER or PSERVER"));
  EXPECT_THAT(env_error(Env{{"DTRAIN_ROLE", "boss"}, {"DTRAIN_RANK", "0"}, {"DTRAIN_WORLD_SIZE", "1"}}),
              HasSubstr("DTRAIN_ROLE='boss' must be worker or server"));
  EXPECT_THAT(env_error(Env{{"DTRAIN_RANK", "0"}}), HasSubstr("DTRAIN_WORLD_SIZE is not set"));
  EXPECT_THAT(env_error(Env{{"PADDLE_TRAINERS_NUM", "2"}}), HasSubstr("PADDLE_TRAINER_ID is not set"));
  EXPECT_THAT(env_error(Env{{"DTRAIN_RANK", "0"}, {"DTRAIN_WORLD_SIZE", "1"}, {"DTRAIN_STORE", "nohost"}}),
              HasSubstr("DTRAIN_STORE='nohost' is not host:port"));
  EXPECT_THAT(
      env_error(Env{
          {"DTRAIN_RANK", "0"}, {"DTRAIN_WORLD_SIZE", "3"}, {"DTRAIN_WORKER_ENDPOINTS", "127.0.0.1:1,127.0.0.1:2"}}),
      HasSubstr("DTRAIN_WORKER_ENDPOINTS lists 2 endpoints but DTRAIN_WORLD_SIZE=3"));
  EXPECT_THAT(env_error(Env{{"PADDLE_TRAINER_ID", "0"}, {"PADDLE_TRAINER_ENDPOINTS", "127.0.0.1:x"}}),
              HasSubstr("PADDLE_TRAINER_ENDPOINTS entry '127.0.0.1:x' is not host:port"));
  EXPECT_THAT(env_error(Env{{"DTRAIN_RANK", "0"}, {"DTRAIN_WORLD_SIZE", "2"}, {"DTRAIN_LOCAL_RANK", "2"}}),
              HasSubstr("DTRAIN_LOCAL_RANK=2 is out of range for DTRAIN_LOCAL_WORLD_SIZE=2"));
  EXPECT_THAT(env_error(Env{{"DTRAIN_RANK", "0"}, {"DTRAIN_WORLD_SIZE", "2"}, {"DTRAIN_NODE_RANK", "1"}}),
              HasSubstr("DTRAIN_NODE_RANK=1 is out of range for DTRAIN_NNODES=1"));
  EXPECT_THAT(env_error(Env{{"DTRAIN_ROLE", "server"}, {"DTRAIN_WORLD_SIZE", "2"}}), HasSubstr("DTRAIN_SERVER_INDEX"));
}

TEST(EnvRoleMakerTest, CurrentEnvironmentSnapshot) {
  Env env = current_environment();
  if (const char* path = std::getenv("PATH")) {
    ASSERT_EQ(env.count("PATH"), 1u);
    EXPECT_EQ(env["PATH"], path);
  }
}

TEST(RoleInfoTest, DescribeAndNames) {
  EXPECT_STREQ(to_string(Role::Worker), "worker");
  EXPECT_STREQ(to_string(Role::Server), "server");
  RoleInfo info;
  info.source = "test";
  EXPECT_THAT(info.describe(), HasSubstr("worker rank 0/1"));
  EXPECT_THAT(info.describe(), HasSubstr("(test)"));
}

TEST(TomlRoleMakerTest, Worker) {
  Config c = Config::from_string(
      "[role]\n"
      "role = \"worker\"\n"
      "rank = 1\n"
      "world_size = 2\n"
      "worker_endpoints = [\"127.0.0.1:6170\", \"127.0.0.1:6171\"]\n"
      "server_endpoints = []\n"
      "store = \"127.0.0.1:6170\"\n"
      "job_id = \"j\"\n",
      "job.toml");
  TomlRoleMaker maker(c);
  EXPECT_EQ(maker.name(), "toml");
  RoleInfo info = maker.resolve();
  EXPECT_EQ(info.role, Role::Worker);
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.current_endpoint, "127.0.0.1:6171");
  EXPECT_EQ(info.store_endpoint, "127.0.0.1:6170");
  EXPECT_EQ(info.job_id, "j");
  EXPECT_TRUE(info.server_endpoints.empty());
  EXPECT_EQ(info.source, "toml");
}

TEST(TomlRoleMakerTest, ServerFromOtherTable) {
  Config c = Config::from_string(
      "[me]\n"
      "role = \"PSERVER\"\n"
      "world_size = 4\n"
      "server_endpoints = [\"127.0.0.1:7000\", \"127.0.0.1:7001\"]\n"
      "current_endpoint = \"127.0.0.1:7001\"\n",
      "job.toml");
  RoleInfo info = TomlRoleMaker(c, "me").resolve();
  EXPECT_EQ(info.role, Role::Server);
  EXPECT_EQ(info.server_index, 1);
  EXPECT_EQ(info.world_size, 4);
}

TEST(TomlRoleMakerTest, BadTablesReportKeyLocation) {
  auto toml_error = [](const std::string& text) {
    Config c = Config::from_string(text, "job.toml");
    try {
      TomlRoleMaker(c).resolve();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "no ConfigError for:\n" << text;
    return std::string();
  };
  EXPECT_THAT(toml_error("[role]\nworld_size = 2\nrank = 2\n"),
              HasSubstr("job.toml:3:8: role.rank = 2 is out of range for role.world_size = 2"));
  EXPECT_THAT(toml_error("[role]\nworld_size = 2\nrank = \"1\"\n"),
              HasSubstr("job.toml:3:8: key 'role.rank': must be int, got string \"1\""));
  EXPECT_THAT(toml_error("[role]\nworld_size = 2\nrnak = 1\n"),
              HasSubstr("job.toml:3:8: unknown key 'role.rnak'; did you mean 'role.rank'?"));
  EXPECT_THAT(toml_error("[role]\nrole = \"boss\"\nrank = 0\nworld_size = 1\n"),
              HasSubstr("job.toml:2:8: role.role = \"boss\" must be \"worker\" or \"server\""));
  EXPECT_THAT(toml_error("[role]\nrank = 0\nworld_size = 1\nstore = \"x\"\n"),
              HasSubstr("job.toml:4:9: role.store = 'x' is not host:port"));
  EXPECT_THAT(toml_error("[role]\nrank = 0\n"), HasSubstr("job.toml:1:1: role.world_size is not set"));
  EXPECT_THAT(toml_error("[role]\nrole = \"server\"\nworld_size = 2\nserver_endpoints = [\"127.0.0.1:7000\"]\n"
                         "current_endpoint = \"127.0.0.1:7001\"\n"),
              HasSubstr("job.toml:5:20: role.current_endpoint = 127.0.0.1:7001 is not in role.server_endpoints"));
  EXPECT_THAT(toml_error("[train]\nepochs = 1\n"), HasSubstr("[role] table is missing"));
}

}  // namespace
}  // namespace dtrain
