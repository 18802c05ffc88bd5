// The TCP store's client: one blocking connection per TcpStore object, guarded
// by a mutex.

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <thread>

#include "dtrain/endpoint.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/store_util.h"
#include "store/tcp_store_codec.h"

namespace dtrain {
namespace {

using namespace tcp_store_detail;
using std::chrono::milliseconds;

constexpr auto kConnectRetry = milliseconds(50);
// How much longer than the server-side timeout a client waits for an answer before
// it declares the server dead.
constexpr auto kClientSlack = std::chrono::seconds(3);
const char* const kTokenHint = " (the job's token is passed in DTRAIN_JOB_TOKEN)";

}  // namespace

struct TcpStore::Impl {
  std::string host;
  uint16_t port = 0;
  std::string address;
  int fd = -1;
  std::mutex mu;
  std::string broken;  // why the connection is unusable; empty while healthy
  // Received bytes live in rbuf[rpos, rlen) of rcap, never zero-filled; an
  // answer is decoded where it landed. A buffer grown for a large answer is
  // dropped once read, so thousands of idle connections hold no tables.
  std::unique_ptr<uint8_t[]> rbuf;
  size_t rcap = 0, rpos = 0, rlen = 0;

  ~Impl() {
    if (fd >= 0) ::close(fd);
  }

  [[noreturn]] void fail(const std::string& why) {
    broken = why;
    throw IoError("lost the connection to the store at " + address + ": " + why);
  }

  void connect(const std::string& token, milliseconds connect_timeout);
  bool try_connect_once(Clock::time_point deadline, std::string& last_error);
  void send_all(const std::vector<uint8_t>& frame, Clock::time_point deadline);
  // The next answer's payload, valid until the next receive.
  Reader recv_frame(Clock::time_point deadline, milliseconds waited);
  static constexpr size_t kSmallBuffer = 4096;  // enough for every answer but values
  void drop_large_buffer() {
    if (rpos != rlen || rcap <= kSmallBuffer) return;
    rbuf.reset();
    rcap = rpos = rlen = 0;
  }
  Reader call(const std::vector<uint8_t>& frame, Clock::time_point deadline, milliseconds waited) {
    if (!broken.empty()) throw IoError("the connection to the store at " + address + " was lost earlier: " + broken);
    send_all(frame, deadline);
    return recv_frame(deadline, waited);
  }
  // Sends a request under the connection mutex and lets f decode the answer.
  template <class F>
  auto exchange(const std::vector<uint8_t>& frame, Clock::time_point deadline, milliseconds waited, F&& f) {
    std::lock_guard<std::mutex> lock(mu);
    return exchange_locked(frame, deadline, waited, f);
  }
  // The same for a request that does not wait on keys: answer_timeout from now (after the lock).
  template <class F>
  auto exchange(const std::vector<uint8_t>& frame, F&& f) {
    std::lock_guard<std::mutex> lock(mu);
    return exchange_locked(frame, Clock::now() + answer_timeout, answer_timeout, f);
  }
  template <class F>
  auto exchange_locked(const std::vector<uint8_t>& frame, Clock::time_point deadline, milliseconds waited, F& f) {
    struct Release {
      Impl* m;
      ~Release() { m->drop_large_buffer(); }
    } release{this};
    Reader r = call(frame, deadline, waited);
    try {
      return f(static_cast<Status>(r.u8()), r);
    } catch (const ProtocolError& e) {
      fail(std::string("malformed answer: ") + e.what());
    }
  }
  milliseconds answer_timeout = Store::kDefaultTimeout;  // guarded by mu
  [[noreturn]] void throw_status(Status s, Reader& r) {
    if (s == Status::Error) throw InvalidUsage("store at " + address + ": " + r.str());
    fail("unexpected answer status " + std::to_string(int(s)));
  }
};

bool TcpStore::Impl::try_connect_once(Clock::time_point deadline, std::string& last_error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
  if (rc != 0) {
    last_error = std::string("cannot resolve '") + host + "': " + ::gai_strerror(rc);
    return false;
  }
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int s = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (s < 0) {
      last_error = errno_text(errno);
      continue;
    }
    int err = 0;
    if (::connect(s, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{s, POLLOUT, 0};
        int prc;
        while ((prc = ::poll(&p, 1, poll_timeout_ms(deadline))) < 0 && errno == EINTR) {
        }
        socklen_t len = sizeof err;
        if (prc == 0)
          err = ETIMEDOUT;
        else if (::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
          err = errno;
      }
    }
    if (err == 0) {
      // Repeated connects to a local port with no listener can connect the socket
      // to itself (TCP simultaneous open); that is no server.
      sockaddr_storage a{}, b{};
      socklen_t la = sizeof a, lb = sizeof b;
      if (::getsockname(s, reinterpret_cast<sockaddr*>(&a), &la) == 0 &&
          ::getpeername(s, reinterpret_cast<sockaddr*>(&b), &lb) == 0 && la == lb && std::memcmp(&a, &b, la) == 0) {
        err = ECONNREFUSED;
      }
    }
    if (err == 0) {
      ::freeaddrinfo(res);
      fd = s;
      set_nodelay(fd);
      return true;
    }
    last_error = errno_text(err);
    ::close(s);
  }
  ::freeaddrinfo(res);
  return false;
}

void TcpStore::Impl::connect(const std::string& token, milliseconds connect_timeout) {
  connect_timeout = store_detail::clamp_timeout(connect_timeout);
  auto deadline = Clock::now() + connect_timeout;
  std::string last_error;
  while (!try_connect_once(deadline, last_error)) {
    auto now = Clock::now();
    if (now >= deadline)
      throw IoError("cannot connect to the store at " + address + " within " + std::to_string(connect_timeout.count()) +
                    " ms: " + last_error + " (is the launcher or rank 0 serving it?)");
    std::this_thread::sleep_for(std::min<Clock::duration>(kConnectRetry, deadline - now));
  }
  auto hello_deadline = std::max(deadline, Clock::now() + std::chrono::seconds(10));
  auto frame = Writer().u8(uint8_t(Op::Hello)).u32(kMagic).u32(kVersion).str(token).frame();
  std::string refusal;
  // exchange() takes the mutex; nobody else can hold this object yet, but it keeps
  // the decoding in one place.
  exchange(frame, hello_deadline, connect_timeout, [&](Status s, Reader& r) {
    if (s == Status::Refused)
      refusal = r.str();
    else if (s != Status::Ok)
      throw_status(s, r);
  });
  if (!refusal.empty()) {
    broken = "refused: " + refusal;
    throw InvalidUsage("store at " + address + " refused this process: " + refusal + kTokenHint);
  }
}

void TcpStore::Impl::send_all(const std::vector<uint8_t>& frame, Clock::time_point deadline) {
  size_t off = 0;
  while (off < frame.size()) {
    ssize_t n = ::send(fd, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      int rc = ::poll(&p, 1, poll_timeout_ms(deadline));
      if (rc == 0) fail("the store did not accept the request in time");
      continue;
    }
    fail(errno_text(errno));
  }
}

Reader TcpStore::Impl::recv_frame(Clock::time_point deadline, milliseconds waited) {
  if (rpos == rlen) rpos = rlen = 0;
  auto fill = [&](size_t want) {
    pollfd p{fd, POLLIN, 0};
    for (;;) {
      int rc = ::poll(&p, 1, poll_timeout_ms(deadline));
      if (rc > 0) break;
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) fail(errno_text(errno));
      fail("no answer within " + std::to_string(waited.count()) + " ms (+" +
           std::to_string(std::chrono::duration_cast<milliseconds>(kClientSlack).count()) +
           " ms grace); the server looks dead");
    }
    if (rcap - rlen < want) {
      size_t cap = std::max(rlen - rpos + want, kSmallBuffer);
      std::unique_ptr<uint8_t[]> grown(new uint8_t[cap]);
      if (rlen > rpos) std::memcpy(grown.get(), rbuf.get() + rpos, rlen - rpos);
      rbuf = std::move(grown);
      rcap = cap;
      rlen -= rpos;
      rpos = 0;
    }
    ssize_t n;
    while ((n = ::recv(fd, rbuf.get() + rlen, rcap - rlen, 0)) < 0 && errno == EINTR) {
    }
    if (n == 0) fail("the server closed the connection");
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) fail(errno_text(errno));
    rlen += static_cast<size_t>(std::max<ssize_t>(n, 0));
  };
  while (rlen - rpos < 4) fill(4);
  size_t len = load_u32(rbuf.get() + rpos);
  if (len > kMaxMessage) fail("answer of " + std::to_string(len) + " bytes exceeds the 1 GiB limit");
  while (rlen - rpos < 4 + len) fill(4 + len - (rlen - rpos));
  if (len == 0) fail("empty answer");
  Reader r(rbuf.get() + rpos + 4, len);
  rpos += 4 + len;
  return r;
}

TcpStore::TcpStore(const std::string& host, uint16_t port, const std::string& token,
                   std::chrono::milliseconds connect_timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = host;
  impl_->port = port;
  impl_->address = format_host_port(host, port);
  impl_->connect(token, connect_timeout);
}

TcpStore::~TcpStore() = default;

void TcpStore::set_answer_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->answer_timeout = store_detail::clamp_timeout(timeout);
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  auto frame = Writer().u8(uint8_t(Op::Set)).str(key).bytes(value).frame();
  impl_->exchange(frame, [&](Status s, Reader& r) {
    if (s != Status::Ok) impl_->throw_status(s, r);
  });
}

Bytes TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  timeout = store_detail::clamp_timeout(timeout);
  auto frame = Writer().u8(uint8_t(Op::Get)).str(key).i64(timeout.count()).frame();
  return impl_->exchange(frame, Clock::now() + timeout + kClientSlack, timeout, [&](Status s, Reader& r) -> Bytes {
    if (s == Status::Ok) return r.bytes();
    if (s == Status::Timeout)
      throw TimeoutError(store_detail::timeout_message({key}, timeout, "the store at " + impl_->address));
    impl_->throw_status(s, r);
  });
}

std::optional<Bytes> TcpStore::try_get(const std::string& key) {
  auto frame = Writer().u8(uint8_t(Op::TryGet)).str(key).frame();
  return impl_->exchange(frame, [&](Status s, Reader& r) -> std::optional<Bytes> {
    if (s == Status::Ok) return r.bytes();
    if (s == Status::NotFound) return std::nullopt;
    impl_->throw_status(s, r);
  });
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  auto frame = Writer().u8(uint8_t(Op::Add)).str(key).i64(delta).frame();
  return impl_->exchange(frame, [&](Status s, Reader& r) -> int64_t {
    if (s == Status::Ok) return r.i64();
    impl_->throw_status(s, r);
  });
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  auto frame = Writer().u8(uint8_t(Op::CompareSet)).str(key).bytes(expected).bytes(desired).frame();
  return impl_->exchange(frame, [&](Status s, Reader& r) -> Bytes {
    if (s == Status::Ok) return r.bytes();
    impl_->throw_status(s, r);
  });
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  auto frame = Writer().u8(uint8_t(Op::Check)).strs(keys).frame();
  return impl_->exchange(frame, [&](Status s, Reader& r) -> bool {
    if (s == Status::Ok) return r.u8() != 0;
    impl_->throw_status(s, r);
  });
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  timeout = store_detail::clamp_timeout(timeout);
  auto frame = Writer().u8(uint8_t(Op::Wait)).strs(keys).i64(timeout.count()).frame();
  impl_->exchange(frame, Clock::now() + timeout + kClientSlack, timeout, [&](Status s, Reader& r) {
    if (s == Status::Ok) return;
    if (s == Status::Timeout)
      throw TimeoutError(store_detail::timeout_message(r.strs(), timeout, "the store at " + impl_->address));
    impl_->throw_status(s, r);
  });
}

std::vector<Bytes> TcpStore::multi_get(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  timeout = store_detail::clamp_timeout(timeout);
  auto frame = Writer().u8(uint8_t(Op::GetMany)).strs(keys).i64(timeout.count()).frame();
  return impl_->exchange(
      frame, Clock::now() + timeout + kClientSlack, timeout, [&](Status s, Reader& r) -> std::vector<Bytes> {
        if (s == Status::Timeout)
          throw TimeoutError(store_detail::timeout_message(r.strs(), timeout, "the store at " + impl_->address));
        if (s != Status::Ok) impl_->throw_status(s, r);
        uint32_t n = r.u32();
        if (n != keys.size()) throw ProtocolError("value count differs from the key count");
        std::vector<Bytes> values(n);
        for (auto& v : values) v = r.bytes();
        return values;
      });
}

bool TcpStore::remove(const std::string& key) {
  auto frame = Writer().u8(uint8_t(Op::Remove)).str(key).frame();
  return impl_->exchange(frame, [&](Status s, Reader& r) -> bool {
    if (s == Status::Ok) return r.u8() != 0;
    impl_->throw_status(s, r);
  });
}

}  // namespace dtrain
