#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/error.h"
#include "dtrain/log.h"
#include "dtrain/store.h"
#include "dtrain/endpoint.h"
#include "dtrain/job_token.h"
#include "store/tcp_store_codec.h"

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
  std::shared_ptr<dtrain::MemoryStore> store = std::make_shared<dtrain::MemoryStore>();
  std::shared_ptr<Store> primary() { return store; }
  std::shared_ptr<Store> client() { return store; }
};

struct FileBackend {
  static constexpr const char* kName = "File";
  TempDir dir;
  std::shared_ptr<Store> store = std::make_shared<dtrain::FileStore>(dir.path);
  std::shared_ptr<Store> primary() { return store; }
  std::shared_ptr<Store> client() { return std::make_shared<dtrain::FileStore>(dir.path); }
};

struct TcpBackend {
  static constexpr const char* kName = "Tcp";
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
  constexpr int kAdds = 1000;
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

// ---------------------------------------------------------------------------
// TcpStore

// Minimal raw client for protocol-level tests.
int raw_connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

uint16_t local_port(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// Reads until the peer closes; returns what came, or "<timeout>" if it never closed.
std::string read_until_close(int fd) {
  std::string got;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return got;
    if (n < 0) return errno == EAGAIN ? got + "<timeout>" : got;
    got.append(buf, static_cast<size_t>(n));
  }
}

bool eventually(const std::function<bool()>& f, std::chrono::milliseconds within = 3s) {
  auto deadline = Clock::now() + within;
  while (Clock::now() < deadline) {
    if (f()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return f();
}

// A port that was free a moment ago (nothing listens there now).
uint16_t dead_port() {
  dtrain::TcpStoreServer s("127.0.0.1", 0, "t");
  return s.port();
}

TEST(TcpStore, WrongTokenIsRefusedAndLogged) {
  dtrain::set_log_level("warn");
  dtrain::TcpStoreServer server("127.0.0.1", 0, "right-token");
  std::string addr = "127.0.0.1:" + std::to_string(server.port());
  ::testing::internal::CaptureStderr();
  try {
    dtrain::TcpStore client("127.0.0.1", server.port(), "wrong-token", 5s);
    ::testing::internal::GetCapturedStderr();
    FAIL() << "a client with a wrong token was accepted";
  } catch (const dtrain::InvalidUsage& e) {
    EXPECT_THAT(e.what(), HasSubstr("wrong job token"));
    EXPECT_THAT(e.what(), HasSubstr("DTRAIN_JOB_TOKEN"));
    EXPECT_THAT(e.what(), HasSubstr(addr));
  }
  EXPECT_TRUE(eventually([&] { return server.refused_clients() == 1; }));
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("wrong job token"));
  EXPECT_THAT(log, HasSubstr("127.0.0.1:"));
  EXPECT_EQ(server.refused_clients(), 1);

  try {
    dtrain::TcpStore client("127.0.0.1", server.port(), "", 5s);
    FAIL() << "a client without a token was accepted";
  } catch (const dtrain::InvalidUsage& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing job token"));
  }
  EXPECT_EQ(server.refused_clients(), 2);

  dtrain::TcpStore good("127.0.0.1", server.port(), "right-token", 5s);
  good.set("k", B("v"));
  EXPECT_EQ(good.get_string("k", 1s), "v");
  EXPECT_EQ(server.refused_clients(), 2);
}

TEST(TcpStore, RawSocketWithoutTokenIsRefused) {
  dtrain::set_log_level("warn");
  dtrain::TcpStoreServer server("127.0.0.1", 0, "tok");
  ::testing::internal::CaptureStderr();
  int fd = raw_connect(server.port());
  ASSERT_GE(fd, 0);
  uint16_t me = local_port(fd);
  const char garbage[] = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_GT(::send(fd, garbage, sizeof garbage - 1, MSG_NOSIGNAL), 0);
  std::string reply = read_until_close(fd);
  ::close(fd);
  EXPECT_THAT(reply, HasSubstr("missing job token"));
  EXPECT_THAT(reply, Not(HasSubstr("<timeout>"))) << "the server did not close the socket";
  EXPECT_TRUE(eventually([&] { return server.refused_clients() == 1; }));
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("127.0.0.1:" + std::to_string(me)));
  EXPECT_THAT(log, HasSubstr("missing job token"));

  // A connection that closes before saying anything counts too.
  int fd2 = raw_connect(server.port());
  ASSERT_GE(fd2, 0);
  ::close(fd2);
  EXPECT_TRUE(eventually([&] { return server.refused_clients() == 2; }));

  // A well-formed length with a payload that is not a HELLO.
  int fd3 = raw_connect(server.port());
  ASSERT_GE(fd3, 0);
  const uint8_t not_hello[] = {5, 0, 0, 0, 2, 0, 0, 0, 0};
  ASSERT_GT(::send(fd3, not_hello, sizeof not_hello, MSG_NOSIGNAL), 0);
  EXPECT_THAT(read_until_close(fd3), HasSubstr("missing job token"));
  ::close(fd3);
  EXPECT_TRUE(eventually([&] { return server.refused_clients() == 3; }));

  dtrain::TcpStore good("127.0.0.1", server.port(), "tok", 5s);
  EXPECT_EQ(good.add("x", 2), 2);
}

TEST(TcpStore, DisconnectingClientsDoNotDisturbOthers) {
  std::string token = dtrain::make_job_token();
  dtrain::TcpStoreServer server("127.0.0.1", 0, token);
  dtrain::TcpStore waiter("127.0.0.1", server.port(), token, 5s);
  std::string got;
  std::thread t([&] { got = waiter.get_string("k", 10s); });

  {
    dtrain::TcpStore brief("127.0.0.1", server.port(), token, 5s);
    brief.set("other", B("1"));
  }
  int half = raw_connect(server.port());
  const uint8_t partial[] = {100, 0, 0, 0, 1, 2};
  ::send(half, partial, sizeof partial, MSG_NOSIGNAL);
  ::close(half);

  // A client that vanishes while the server holds its GET: a raw connection
  // speaking the wire format, reset as the kernel resets a killed process's
  // socket. (A forked child would do the same, but fork in a threaded test
  // deadlocks under the sanitizers' allocators.)
  {
    using namespace dtrain::tcp_store_detail;
    int doomed = raw_connect(server.port());
    ASSERT_GE(doomed, 0);
    auto hello = Writer().u8(uint8_t(Op::Hello)).u32(kMagic).u32(kVersion).str(token).frame();
    ASSERT_EQ(::send(doomed, hello.data(), hello.size(), MSG_NOSIGNAL), ssize_t(hello.size()));
    uint8_t answer[5] = {};
    ASSERT_EQ(::recv(doomed, answer, sizeof answer, MSG_WAITALL), ssize_t(sizeof answer));
    ASSERT_EQ(answer[4], uint8_t(Status::Ok));
    auto get = Writer().u8(uint8_t(Op::Get)).str("never").i64(60000).frame();
    ASSERT_EQ(::send(doomed, get.data(), get.size(), MSG_NOSIGNAL), ssize_t(get.size()));
    std::this_thread::sleep_for(50ms);
    linger reset{1, 0};
    ::setsockopt(doomed, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    ::close(doomed);
  }
  dtrain::TcpStore setter("127.0.0.1", server.port(), token, 5s);
  std::this_thread::sleep_for(50ms);
  setter.set("never", B("now set"));

  setter.set("k", B("v"));
  t.join();
  EXPECT_EQ(got, "v");
  EXPECT_EQ(waiter.get_string("other", 1s), "1");
  EXPECT_EQ(waiter.add("n", 1), 1);
}

TEST(TcpStore, ServerDestructorWakesAWaitingClient) {
  std::string token = dtrain::make_job_token();
  auto server = std::make_unique<dtrain::TcpStoreServer>("127.0.0.1", 0, token);
  std::string addr = "127.0.0.1:" + std::to_string(server->port());
  dtrain::TcpStore client("127.0.0.1", server->port(), token, 5s);
  std::string error;
  bool io_error = false;
  Clock::time_point woke;
  std::thread t([&] {
    try {
      client.get("never", 60s);
    } catch (const dtrain::IoError& e) {
      io_error = true;
      error = e.what();
    } catch (const std::exception& e) {
      error = e.what();
    }
    woke = Clock::now();
  });
  std::this_thread::sleep_for(100ms);
  auto t0 = Clock::now();
  server.reset();
  EXPECT_LT(ms_since(t0), 1000) << "server destructor was slow";
  t.join();
  EXPECT_TRUE(io_error) << error;
  EXPECT_THAT(error, HasSubstr(addr));
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(woke - t0).count(), 1000);
  EXPECT_THROW(client.set("k", B("v")), dtrain::IoError);
}

TEST(TcpStore, ClientWaitsForALateServer) {
  uint16_t port = dead_port();
  std::string token = "late";
  std::unique_ptr<dtrain::TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<dtrain::TcpStoreServer>("127.0.0.1", port, token);
  });
  auto t0 = Clock::now();
  std::unique_ptr<dtrain::TcpStore> client;
  try {
    client = std::make_unique<dtrain::TcpStore>("127.0.0.1", port, token, 10s);
  } catch (...) {
    starter.join();
    throw;
  }
  starter.join();
  EXPECT_GE(ms_since(t0), 250);
  client->set("k", B("v"));
  EXPECT_EQ(client->get_string("k", 1s), "v");
  client.reset();
}

TEST(TcpStore, ConnectTimeoutIsIoErrorNamingTheAddress) {
  uint16_t port = dead_port();
  auto t0 = Clock::now();
  try {
    dtrain::TcpStore client("127.0.0.1", port, "t", 300ms);
    FAIL() << "connected to a port nobody serves";
  } catch (const dtrain::IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("127.0.0.1:" + std::to_string(port)));
  }
  long elapsed = ms_since(t0);
  EXPECT_GE(elapsed, 250);
  EXPECT_LT(elapsed, 2000);
}

TEST(TcpStore, TimeoutNamesKeyAndStoreAndKeepsConnection) {
  dtrain::TcpStoreServer server("127.0.0.1", 0, "t");
  dtrain::TcpStore client("127.0.0.1", server.port(), "t", 5s);
  try {
    client.wait({"x", "y"}, 50ms);
    FAIL();
  } catch (const dtrain::TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'x'"));
    EXPECT_THAT(e.what(), HasSubstr("'y'"));
    EXPECT_THAT(e.what(), HasSubstr("127.0.0.1:" + std::to_string(server.port())));
  }
  EXPECT_THROW(client.get("x", 0ms), dtrain::TimeoutError);
  client.set("x", B("1"));
  EXPECT_EQ(client.get_string("x", 1s), "1");
}

TEST(TcpStore, SharedClientIsThreadSafe) {
  dtrain::TcpStoreServer server("127.0.0.1", 0, "t");
  dtrain::TcpStore client("127.0.0.1", server.port(), "t", 5s);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) client.add("c", 1);
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(client.get_string("c", 1s), "8000");
}

TEST(TcpStore, DeadButConnectedServerGivesIoErrorAfterGrace) {
  // A fake server that accepts the HELLO and then never answers again.
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  uint16_t port = local_port(lfd);
  int conn = -1;
  std::thread fake([&] {
    conn = ::accept(lfd, nullptr, nullptr);
    char buf[256];
    ::recv(conn, buf, sizeof buf, 0);
    const uint8_t ok[] = {1, 0, 0, 0, 0};
    ::send(conn, ok, sizeof ok, MSG_NOSIGNAL);
  });
  dtrain::TcpStore client("127.0.0.1", port, "t", 5s);
  fake.join();
  auto t0 = Clock::now();
  EXPECT_THROW(client.get("k", 100ms), dtrain::IoError);
  long elapsed = ms_since(t0);
  EXPECT_GE(elapsed, 100);
  EXPECT_LT(elapsed, 10000);
  ::close(conn);
  ::close(lfd);
}

TEST(TcpStore, OversizedMessageClosesOnlyThatConnection) {
  dtrain::set_log_level("error");
  dtrain::TcpStoreServer server("127.0.0.1", 0, "tok");
  dtrain::TcpStore good("127.0.0.1", server.port(), "tok", 5s);
  int fd = raw_connect(server.port());
  ASSERT_GE(fd, 0);
  // HELLO: u8 op=1, u32 magic "DTS1", u32 version 1, str token.
  std::vector<uint8_t> hello = {1, 'D', 'T', 'S', '1', 1, 0, 0, 0, 3, 0, 0, 0, 't', 'o', 'k'};
  std::vector<uint8_t> frame = {static_cast<uint8_t>(hello.size()), 0, 0, 0};
  frame.insert(frame.end(), hello.begin(), hello.end());
  ASSERT_EQ(::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL), ssize_t(frame.size()));
  uint8_t ok[5];
  ASSERT_EQ(::recv(fd, ok, sizeof ok, MSG_WAITALL), 5);
  EXPECT_EQ(ok[4], 0) << "HELLO was not accepted";
  const uint8_t huge[] = {0xff, 0xff, 0xff, 0x7f, 2};
  ::send(fd, huge, sizeof huge, MSG_NOSIGNAL);
  std::string reply = read_until_close(fd);
  ::close(fd);
  EXPECT_THAT(reply, Not(HasSubstr("<timeout>")));
  EXPECT_THAT(reply, HasSubstr("too large"));
  EXPECT_EQ(server.refused_clients(), 0);
  good.set("still", B("fine"));
  EXPECT_EQ(good.get_string("still", 1s), "fine");
  dtrain::set_log_level("warn");
}

TEST(TcpStore, Ipv6Loopback) {
  std::unique_ptr<dtrain::TcpStoreServer> server;
  try {
    server = std::make_unique<dtrain::TcpStoreServer>("::1", 0, "t");
  } catch (const dtrain::IoError& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  EXPECT_EQ(server->host(), "::1");
  dtrain::TcpStore client("::1", server->port(), "t", 5s);
  client.set("k", B("v6"));
  EXPECT_EQ(client.get_string("k", 1s), "v6");
}

TEST(TcpStore, WildcardIpv6ServesIpv4Clients) {
  std::unique_ptr<dtrain::TcpStoreServer> server;
  try {
    server = std::make_unique<dtrain::TcpStoreServer>("::", 0, "t");
  } catch (const dtrain::IoError& e) {
    GTEST_SKIP() << "no IPv6 here: " << e.what();
  }
  dtrain::TcpStore v4("127.0.0.1", server->port(), "t", 5s);
  v4.set("k", B("both"));
  dtrain::TcpStore v6("::1", server->port(), "t", 5s);
  EXPECT_EQ(v6.get_string("k", 1s), "both");
}

TEST(TcpStore, SmallRoundTripsAreFast) {
  dtrain::TcpStoreServer server("127.0.0.1", 0, "t");
  dtrain::TcpStore client("127.0.0.1", server.port(), "t", 5s);
  Bytes v(64, 1);
  for (int i = 0; i < 200; ++i) client.set("warm", v);
  constexpr int kIters = 2000;
  auto t0 = Clock::now();
  for (int i = 0; i < kIters; ++i) {
    client.set("k", v);
    client.get("k", 1s);
  }
  double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / (2 * kIters);
  std::printf("TcpStore loopback round trip: %.1f us\n", us);
  EXPECT_LT(us, 1000.0);
}

// ---------------------------------------------------------------------------

TEST(ParseHostPort, AcceptsHostsAndBracketedIpv6) {
  EXPECT_EQ(dtrain::parse_host_port("127.0.0.1:29500"), std::make_pair(std::string("127.0.0.1"), uint16_t(29500)));
  EXPECT_EQ(dtrain::parse_host_port("[::1]:80"), std::make_pair(std::string("::1"), uint16_t(80)));
  EXPECT_EQ(dtrain::parse_host_port("[fe80::1%eth0]:1"), std::make_pair(std::string("fe80::1%eth0"), uint16_t(1)));
  EXPECT_EQ(dtrain::parse_host_port("localhost:0"), std::make_pair(std::string("localhost"), uint16_t(0)));
  EXPECT_EQ(dtrain::parse_host_port("node-3.cluster.local:65535"),
            std::make_pair(std::string("node-3.cluster.local"), uint16_t(65535)));
}

TEST(ParseHostPort, RejectsMalformedInputNamingIt) {
  for (std::string bad : {"", "host", ":80", "host:", "host:abc", "host:65536", "host:-1", "host:80x", "::1:80",
                          "[::1]80", "[::1", "[]:80", "host:123456", "host: 80"}) {
    try {
      dtrain::parse_host_port(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const dtrain::InvalidUsage& e) {
      EXPECT_THAT(e.what(), HasSubstr("'" + bad + "'"));
    }
  }
}

TEST(MakeJobToken, Is32RandomHexChars) {
  std::string a = dtrain::make_job_token(), b = dtrain::make_job_token();
  ASSERT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, b);
}

}  // namespace
