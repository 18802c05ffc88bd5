// The Store interface on every implementation (memory, file, TCP: the same
// typed tests), PrefixStore, and what only the FileStore does (a new object
// on the folder, nested folders, processes adding at once). The TCP store's
// own protocol, failures and addresses: tcp_store_test.cc.

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/error.h"
#include "dtrain/job_token.h"
#include "dtrain/store.h"

using namespace std::chrono_literals;
using dtrain::Bytes;
using dtrain::Store;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

namespace {

Bytes B(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string S(const Bytes& b) { return std::string(b.begin(), b.end()); }

long ms_since(Clock::time_point t) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/dtrain_store_test_XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    if (!p) throw std::runtime_error("mkdtemp failed");
    path = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Each backend gives a primary store plus independent clients of the same data
// (the same object, a new FileStore on the folder, a new TCP connection).
struct MemoryBackend {
  static constexpr const char* kName = "Memory";
  static constexpr int kConcurrentAdds = 1000;  // per thread
  std::shared_ptr<dtrain::MemoryStore> store = std::make_shared<dtrain::MemoryStore>();
  std::shared_ptr<Store> primary() { return store; }
  std::shared_ptr<Store> client() { return store; }
};

struct FileBackend {
  static constexpr const char* kName = "File";
  // Every add is a locked, fsync'ed file write: 1000 a thread took 20-40 s on
  // a slow disk; 150 still interleave the 8 threads' adds throughout.
  static constexpr int kConcurrentAdds = 150;
  TempDir dir;
  std::shared_ptr<Store> store = std::make_shared<dtrain::FileStore>(dir.path);
  std::shared_ptr<Store> primary() { return store; }
  std::shared_ptr<Store> client() { return std::make_shared<dtrain::FileStore>(dir.path); }
};

struct TcpBackend {
  static constexpr const char* kName = "Tcp";
  static constexpr int kConcurrentAdds = 1000;
  std::string token = dtrain::make_job_token();
  std::unique_ptr<dtrain::TcpStoreServer> server = std::make_unique<dtrain::TcpStoreServer>("127.0.0.1", 0, token);
  std::shared_ptr<Store> store = client();
  std::shared_ptr<Store> primary() { return store; }
  std::shared_ptr<Store> client() {
    return std::make_shared<dtrain::TcpStore>("127.0.0.1", server->port(), token, std::chrono::seconds(5));
  }
};

template <class Backend>
class StoreTest : public ::testing::Test {
 protected:
  Backend backend;
  Store& store() { return *backend.primary(); }
};

struct BackendNames {
  template <class T>
  static std::string GetName(int) {
    return T::kName;
  }
};

using Backends = ::testing::Types<MemoryBackend, FileBackend, TcpBackend>;
TYPED_TEST_SUITE(StoreTest, Backends, BackendNames);

TYPED_TEST(StoreTest, SetThenGetAndOverwrite) {
  this->store().set("k", B("v1"));
  EXPECT_EQ(this->store().get_string("k", 1s), "v1");
  this->store().set("k", B("v2"));
  EXPECT_EQ(this->store().get_string("k", 1s), "v2");
  auto other = this->backend.client();
  EXPECT_EQ(S(other->get("k", 1s)), "v2");
}

TYPED_TEST(StoreTest, BinaryAndLargeValuesRoundTrip) {
  Bytes all;
  for (int i = 0; i < 512; ++i) all.push_back(static_cast<uint8_t>(i));
  this->store().set("bin", all);
  EXPECT_EQ(this->store().get("bin", 1s), all);

  Bytes big(4 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7 + (i >> 12));
  this->store().set("big", big);
  EXPECT_EQ(this->backend.client()->get("big", 5s), big);

  this->store().set("empty", Bytes{});
  auto v = this->store().try_get("empty");
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->empty());
}

TYPED_TEST(StoreTest, TryGetDoesNotBlock) {
  auto t0 = Clock::now();
  EXPECT_FALSE(this->store().try_get("nope").has_value());
  EXPECT_LT(ms_since(t0), 500);
  this->store().set("yes", B("1"));
  auto v = this->store().try_get("yes");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(S(*v), "1");
}

TYPED_TEST(StoreTest, AddCreatesAndAccumulatesAsDecimalText) {
  EXPECT_EQ(this->store().add("c", 5), 5);
  EXPECT_EQ(this->store().add("c", -7), -2);
  EXPECT_EQ(this->store().add("c", 0), -2);
  EXPECT_EQ(this->store().get_string("c", 1s), "-2");
  this->store().set("n", B("41"));
  EXPECT_EQ(this->store().add("n", 1), 42);
  EXPECT_EQ(this->store().get_string("n", 1s), "42");
}

TYPED_TEST(StoreTest, AddOnNonIntegerValueIsInvalidUsage) {
  this->store().set("t", B("abc"));
  try {
    this->store().add("t", 1);
    FAIL() << "add on a text value did not throw";
  } catch (const dtrain::InvalidUsage& e) {
    EXPECT_THAT(e.what(), HasSubstr("'t'"));
  }
  EXPECT_EQ(this->store().get_string("t", 1s), "abc");
  this->store().set("max", std::to_string(INT64_MAX));
  EXPECT_THROW(this->store().add("max", 1), dtrain::InvalidUsage);
}

TYPED_TEST(StoreTest, CompareSet) {
  Store& s = this->store();
  // Missing key with a non-empty expectation: nothing changes.
  EXPECT_TRUE(s.compare_set("cas", B("x"), B("a")).empty());
  EXPECT_FALSE(s.try_get("cas").has_value());
  // Missing key matches an empty expectation.
  EXPECT_EQ(S(s.compare_set("cas", {}, B("a"))), "a");
  EXPECT_EQ(s.get_string("cas", 1s), "a");
  // Wrong expectation returns the current value and leaves it.
  EXPECT_EQ(S(s.compare_set("cas", B("z"), B("b"))), "a");
  EXPECT_EQ(s.get_string("cas", 1s), "a");
  // Right expectation swaps.
  EXPECT_EQ(S(s.compare_set("cas", B("a"), B("b"))), "b");
  EXPECT_EQ(s.get_string("cas", 1s), "b");
  // An existing key does not match an empty expectation.
  EXPECT_EQ(S(s.compare_set("cas", {}, B("c"))), "b");
}

TYPED_TEST(StoreTest, CheckAndRemove) {
  Store& s = this->store();
  EXPECT_TRUE(s.check({}));
  EXPECT_FALSE(s.check({"a"}));
  s.set("a", B("1"));
  EXPECT_TRUE(s.check({"a"}));
  EXPECT_FALSE(s.check({"a", "b"}));
  s.set("b", B("2"));
  EXPECT_TRUE(s.check({"a", "b"}));
  EXPECT_TRUE(s.remove("a"));
  EXPECT_FALSE(s.remove("a"));
  EXPECT_FALSE(s.check({"a"}));
  EXPECT_FALSE(s.try_get("a").has_value());
  EXPECT_EQ(s.get_string("b", 1s), "2");
}

TYPED_TEST(StoreTest, GetOnMissingKeyTimesOut) {
  auto t0 = Clock::now();
  try {
    this->store().get("never-set", 150ms);
    FAIL() << "get returned for a key nobody set";
  } catch (const dtrain::TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("never-set"));
  }
  long elapsed = ms_since(t0);
  EXPECT_GE(elapsed, 140);
  EXPECT_LT(elapsed, 150 + 1000);
  // The store stays usable after a timeout.
  this->store().set("after", B("ok"));
  EXPECT_EQ(this->store().get_string("after", 1s), "ok");
}

TYPED_TEST(StoreTest, WaitTimesOutNamingOnlyMissingKeys) {
  this->store().set("here", B("1"));
  auto t0 = Clock::now();
  try {
    this->store().wait({"here", "absent"}, 100ms);
    FAIL() << "wait returned with a key missing";
  } catch (const dtrain::TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'absent'"));
    EXPECT_THAT(e.what(), Not(HasSubstr("'here'")));
  }
  long elapsed = ms_since(t0);
  EXPECT_GE(elapsed, 90);
  EXPECT_LT(elapsed, 100 + 1000);
}

TYPED_TEST(StoreTest, WaitReturnsAtOnceWhenKeysExist) {
  this->store().set("p", B("1"));
  auto t0 = Clock::now();
  this->store().wait({"p"}, 5s);
  this->store().wait({}, 5s);
  EXPECT_LT(ms_since(t0), 1000);
}

TYPED_TEST(StoreTest, WaitAndGetWakeWhenAnotherThreadSets) {
  auto other = this->backend.client();
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    other->set("late1", B("x"));
    std::this_thread::sleep_for(50ms);
    other->set("late2", B("y"));
    std::this_thread::sleep_for(50ms);
    other->add("late3", 7);
  });
  auto t0 = Clock::now();
  this->store().wait({"late1", "late2"}, 10s);
  long waited = ms_since(t0);
  EXPECT_EQ(this->store().get_string("late3", 10s), "7");
  setter.join();
  EXPECT_GE(waited, 100);
  EXPECT_LT(ms_since(t0), 3000);
}

TYPED_TEST(StoreTest, ManyWaitersAllWake) {
  std::atomic<int> woke{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, client = this->backend.client()] {
      if (client->get_string("go", 10s) == "now") ++woke;
    });
  }
  std::this_thread::sleep_for(100ms);
  this->store().set("go", B("now"));
  for (auto& t : threads) t.join();
  EXPECT_EQ(woke.load(), 4);
}

TYPED_TEST(StoreTest, ConcurrentAddIsAtomic) {
  constexpr int kThreads = 8;
  constexpr int kAdds = TypeParam::kConcurrentAdds;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t, client = this->backend.client()] {
      for (int i = 0; i < kAdds; ++i) seen[t].push_back(client->add("counter", 1));
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(this->store().get_string("counter", 1s), std::to_string(kThreads * kAdds));
  std::set<int64_t> all;
  for (const auto& v : seen) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), size_t(kThreads * kAdds)) << "two adds returned the same value";
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
}

TYPED_TEST(StoreTest, OddKeysStayDistinct) {
  std::vector<std::string> keys = {"",
                                   ".",
                                   "..",
                                   ".lock",
                                   "a/b/../c",
                                   "a%2Fb",
                                   "a/b",
                                   "with space",
                                   "tab\there",
                                   "\xc3\xbcnic\xc3\xb6"
                                   "de",
                                   "A",
                                   "%41",
                                   std::string(1000, 'k'),
                                   std::string(999, 'k') + "j",
                                   std::string("nul\0byte", 8)};
  for (size_t i = 0; i < keys.size(); ++i) this->store().set(keys[i], "value" + std::to_string(i));
  for (size_t i = 0; i < keys.size(); ++i)
    EXPECT_EQ(this->store().get_string(keys[i], 1s), "value" + std::to_string(i)) << "key #" << i;
  EXPECT_EQ(this->store().add("counter", 1), 1);
}

TYPED_TEST(StoreTest, PrefixStoreIsolatesKeys) {
  auto base = this->backend.primary();
  dtrain::PrefixStore a("job1", base), b("job2", base);
  a.set("k", B("1"));
  EXPECT_FALSE(b.try_get("k").has_value());
  b.set("k", B("2"));
  EXPECT_EQ(a.get_string("k", 1s), "1");
  EXPECT_EQ(b.get_string("k", 1s), "2");
  EXPECT_EQ(base->get_string("job1/k", 1s), "1");
  EXPECT_FALSE(base->try_get("k").has_value());

  EXPECT_EQ(a.add("n", 3), 3);
  EXPECT_FALSE(b.check({"n"}));
  EXPECT_TRUE(a.check({"k", "n"}));
  a.wait({"k", "n"}, 1s);
  EXPECT_THROW(b.wait({"n"}, 50ms), dtrain::TimeoutError);
  EXPECT_EQ(S(a.compare_set("k", B("1"), B("3"))), "3");
  EXPECT_EQ(b.get_string("k", 1s), "2");
  EXPECT_TRUE(a.remove("k"));
  EXPECT_EQ(b.get_string("k", 1s), "2");
  EXPECT_EQ(a.base(), base);
}

TYPED_TEST(StoreTest, MultiGetAnswersInOrderOnceEveryKeyExists) {
  auto client = this->backend.client();
  dtrain::PrefixStore prefixed("p", client);
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    this->store().set("p/b", B("2"));
  });
  this->store().set("p/a", B("1"));
  auto values = prefixed.multi_get({"b", "a", "b"}, 10s);
  setter.join();
  ASSERT_EQ(values.size(), 3u);
  EXPECT_EQ(S(values[0]), "2");
  EXPECT_EQ(S(values[1]), "1");
  EXPECT_EQ(S(values[2]), "2");
  try {
    client->multi_get({"p/a", "missing"}, 50ms);
    ADD_FAILURE() << "multi_get of a missing key returned";
  } catch (const dtrain::TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'missing'"));
    EXPECT_THAT(e.what(), Not(HasSubstr("'p/a'")));
  }
}

// publish_member/read_members: the launcher's join, each member on its own connection.
TYPED_TEST(StoreTest, MembersReadOneTableWithEveryValue) {
  constexpr int kMembers = 12;
  std::vector<std::optional<dtrain::MemberTable>> seen(kMembers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kMembers; ++i) {
    threads.emplace_back([&, i, client = this->backend.client()] {
      dtrain::PrefixStore join("join", client);
      dtrain::publish_member(join, i, kMembers, B("endpoint-" + std::to_string(i)));
      seen[i] = dtrain::read_members(join, kMembers, 10s);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kMembers; ++i) {
    ASSERT_EQ(seen[i]->size(), size_t(kMembers)) << "member " << i;
    for (int j = 0; j < kMembers; ++j) EXPECT_EQ((*seen[i])[j], "endpoint-" + std::to_string(j));
  }
  EXPECT_EQ(this->store().get_string("join/members/joined", 1s), std::to_string(kMembers));
}

TYPED_TEST(StoreTest, MembersTimeOutNamingTheMissingOnes) {
  dtrain::PrefixStore join("join", this->backend.primary());
  dtrain::publish_member(join, 1, 4, B("x"));
  dtrain::publish_member(join, 2, 4, B("y"));
  int slices = 0;
  try {
    dtrain::read_members(join, 4, 500ms, [&] { ++slices; });
    ADD_FAILURE() << "read_members returned without members 0 and 3";
  } catch (const dtrain::TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("members 0, 3 of 4 have not joined"));
  }
  EXPECT_GE(slices, 2);
  EXPECT_EQ(dtrain::missing_members(join, 4), (std::vector<int>{0, 3}));
  EXPECT_THROW(dtrain::publish_member(join, 4, 4, B("z")), dtrain::InvalidUsage);
}

TEST(MemberTable, AMalformedTableIsInvalidUsageNotACrash) {
  EXPECT_THROW(dtrain::MemberTable(Bytes{1, 0}, 1), dtrain::InvalidUsage);
  EXPECT_THROW(dtrain::MemberTable(Bytes{1, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 'a'}, 1), dtrain::InvalidUsage);
  EXPECT_THROW(dtrain::MemberTable(Bytes{2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 'a', 'b'}, 2),
               dtrain::InvalidUsage);
  try {
    dtrain::MemberTable(Bytes{2, 0, 0, 0, 0, 0, 0, 0}, 3);
    ADD_FAILURE() << "a table of 2 read as 3";
  } catch (const dtrain::InvalidUsage& e) {
    EXPECT_THAT(e.what(), HasSubstr("lists 2 members, expected 3"));
  }
  dtrain::MemberTable ok(Bytes{2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 'h', 'i', '!'}, 2);
  EXPECT_EQ(ok[0], "hi");
  EXPECT_EQ(ok[1], "!");
}

TEST(PrefixStore, NullBaseIsInvalidUsage) { EXPECT_THROW(dtrain::PrefixStore("p", nullptr), dtrain::InvalidUsage); }

// ---------------------------------------------------------------------------
// FileStore

TEST(FileStore, ValuesSurviveANewStoreObject) {
  TempDir dir;
  {
    dtrain::FileStore s(dir.path);
    s.set("addr", B("10.0.0.1:1234"));
    s.add("count", 5);
  }
  dtrain::FileStore again(dir.path);
  EXPECT_EQ(again.get_string("addr", 1s), "10.0.0.1:1234");
  EXPECT_EQ(again.add("count", 1), 6);
}

TEST(FileStore, CreatesAMissingNestedFolder) {
  TempDir dir;
  std::string nested = dir.path + "/a/b/c";
  dtrain::FileStore s(nested);
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  s.set("k", B("v"));
  EXPECT_EQ(s.get_string("k", 1s), "v");
}

TEST(FileStore, UncreatableFolderIsIoErrorNamingThePath) {
  TempDir dir;
  std::string file = dir.path + "/plain_file";
  std::ofstream(file) << "x";
  std::string bad = file + "/sub";
  try {
    dtrain::FileStore s(bad);
    FAIL() << "FileStore accepted a folder under a regular file";
  } catch (const dtrain::IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(bad));
  }
}

TEST(FileStore, AddIsAtomicAcrossProcesses) {
  TempDir dir;
  constexpr int kChildren = 3;
  constexpr int kAdds = 200;
  std::vector<pid_t> pids;
  for (int c = 0; c < kChildren; ++c) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        dtrain::FileStore s(dir.path);
        for (int i = 0; i < kAdds; ++i) s.add("n", 1);
      } catch (...) {
        rc = 1;
      }
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  dtrain::FileStore s(dir.path);
  for (int i = 0; i < kAdds; ++i) s.add("n", 1);
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(s.get_string("n", 1s), std::to_string((kChildren + 1) * kAdds));
}

}  // namespace
