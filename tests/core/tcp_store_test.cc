// The TCP store on its own: the job token, raw and vanishing clients on the
// wire, a late or dead server, timeouts, IPv6, speed; host:port parsing and
// job tokens. The Store interface's typed tests, TCP included: store_test.cc.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/endpoint.h"
#include "dtrain/error.h"
#include "dtrain/job_token.h"
#include "dtrain/log.h"
#include "dtrain/store.h"
#include "store/tcp_store_codec.h"

using namespace std::chrono_literals;
using dtrain::Bytes;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

namespace {

Bytes B(const std::string& s) { return Bytes(s.begin(), s.end()); }

long ms_since(Clock::time_point t) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

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

// Held requests time out at their own deadlines, whatever order they came in.
TEST(TcpStore, HeldRequestsExpireEachAtItsOwnDeadline) {
  dtrain::TcpStoreServer server("127.0.0.1", 0, "t");
  const int timeouts_ms[] = {600, 200, 400};
  std::vector<int64_t> took(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      dtrain::TcpStore c("127.0.0.1", server.port(), "t", 5s);
      auto t0 = Clock::now();
      EXPECT_THROW(c.multi_get({"never", "x"}, std::chrono::milliseconds(timeouts_ms[i])), dtrain::TimeoutError);
      took[i] = ms_since(t0);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_GE(took[i], timeouts_ms[i]) << "request " << i;
    EXPECT_LT(took[i], timeouts_ms[i] + 1500) << "request " << i;
  }
}

// GETS answers only when every key exists at once: a key removed while it
// waits is waited for again, never answered empty (nor created by the answer).
TEST(TcpStore, MultiGetWaitsAgainForAKeyRemovedMeanwhile) {
  dtrain::TcpStoreServer server("127.0.0.1", 0, "t");
  dtrain::TcpStore waiter("127.0.0.1", server.port(), "t", 5s), other("127.0.0.1", server.port(), "t", 5s);
  other.set("a", B("1"));
  std::vector<Bytes> got;
  std::thread t([&] { got = waiter.multi_get({"a", "b"}, 10s); });
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(other.remove("a"));
  other.set("b", B("2"));
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(got.empty()) << "GETS answered without key a";
  EXPECT_FALSE(other.check({"a"})) << "the answer created key a";
  other.set("a", B("3"));
  t.join();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], B("3"));
  EXPECT_EQ(got[1], B("2"));
}

// Hundreds of clients on one server (the event loop's case): each publishes,
// each reads the whole table, and a value many wait for reaches them all.
TEST(TcpStore, HundredsOfClientsJoinAndReadTheTable) {
  constexpr int kClients = 300;
  dtrain::TcpStoreServer server("127.0.0.1", 0, "t");
  std::vector<std::shared_ptr<dtrain::TcpStore>> clients;
  for (int i = 0; i < kClients; ++i)
    clients.push_back(std::make_shared<dtrain::TcpStore>("127.0.0.1", server.port(), "t", 5s));
  std::atomic<int> woke{0};
  std::vector<std::thread> waiters;
  for (int t = 0; t < 4; ++t)
    waiters.emplace_back([&, c = std::make_shared<dtrain::TcpStore>("127.0.0.1", server.port(), "t", 5s)] {
      if (c->get_string("go", 10s) == "now") ++woke;
    });
  for (int i = 0; i < kClients; ++i) dtrain::publish_member(*clients[i], i, kClients, B(std::to_string(i * 7)));
  clients.back()->set("go", B("now"));
  for (auto& t : waiters) t.join();
  EXPECT_EQ(woke.load(), 4);
  for (int i = 0; i < kClients; i += 37) {
    auto table = dtrain::read_members(*clients[i], kClients, 5s);
    ASSERT_EQ(table.size(), size_t(kClients));
    for (int j = 0; j < kClients; ++j) ASSERT_EQ(table[j], std::to_string(j * 7)) << "member " << j;
  }
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
  // HELLO: u8 op=1, u32 magic "DTS1", u32 version 2, str token.
  std::vector<uint8_t> hello = {1, 'D', 'T', 'S', '1', 2, 0, 0, 0, 3, 0, 0, 0, 't', 'o', 'k'};
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

// A server on an IPv6 address; none (and why) where this machine has no IPv6.
std::unique_ptr<dtrain::TcpStoreServer> ipv6_server(const std::string& host, std::string* why) {
  try {
    return std::make_unique<dtrain::TcpStoreServer>(host, 0, "t");
  } catch (const dtrain::IoError& e) {
    *why = e.what();
    return nullptr;
  }
}

TEST(TcpStore, Ipv6Loopback) {
  std::string why;
  auto server = ipv6_server("::1", &why);
  if (!server) GTEST_SKIP() << "no IPv6 loopback here: " << why;
  EXPECT_EQ(server->host(), "::1");
  dtrain::TcpStore client("::1", server->port(), "t", 5s);
  client.set("k", B("v6"));
  EXPECT_EQ(client.get_string("k", 1s), "v6");
}

TEST(TcpStore, WildcardIpv6ServesIpv4Clients) {
  std::string why;
  auto server = ipv6_server("::", &why);
  if (!server) GTEST_SKIP() << "no IPv6 here: " << why;
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
