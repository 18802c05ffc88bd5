#pragma once
// The TCP store's wire format, shared by its server (tcp_store_server.cc) and
// its client (tcp_store_client.cc).
//
// Wire format: every message is a frame "u32 length (little-endian) + payload".
// A request payload starts with a u8 opcode, a response payload with a u8 status.
// Strings and byte strings are "u32 length + bytes", integers little-endian.
//   HELLO   u32 magic, u32 version, str token   -> OK | REFUSED str reason
//   SET     str key, bytes value                -> OK
//   GET     str key, i64 timeout_ms             -> OK bytes | TIMEOUT u32 n, n*str
//   GETS    u32 n, n*str, i64 timeout_ms        -> OK u32 n, n*bytes | TIMEOUT u32 n, n*str
//   TRY_GET str key                             -> OK bytes | NOT_FOUND
//   ADD     str key, i64 delta                  -> OK i64 | ERROR str
//   CAS     str key, bytes expected, bytes new  -> OK bytes
//   CHECK   u32 n, n*str                        -> OK u8
//   WAIT    u32 n, n*str, i64 timeout_ms        -> OK | TIMEOUT u32 n, n*str
//   REMOVE  str key                             -> OK u8
// GET, GETS and WAIT block on the server: the connection gets no answer until the keys
// exist or the deadline passes (the server then answers TIMEOUT).

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/store_util.h"

namespace dtrain::tcp_store_detail {

using store_detail::Clock;

enum class Op : uint8_t { Hello = 1, Set, Get, TryGet, Add, CompareSet, Check, Wait, Remove, GetMany };
enum class Status : uint8_t { Ok = 0, NotFound = 1, Timeout = 2, Error = 3, Refused = 4 };

constexpr uint32_t kMagic = 0x31535444;  // "DTS1"
constexpr uint32_t kVersion = 2;         // 2: GETS
constexpr size_t kMaxMessage = size_t(1) << 30;
// A client's first frame (the HELLO with its token) is refused above this size.
constexpr size_t kMaxHelloMessage = 4096;

// A malformed frame; the server closes the connection, the client marks it broken.
struct ProtocolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline std::string errno_text(int err) { return std::strerror(err); }

inline void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

class Writer {
 public:
  Writer() { buf_.resize(4); }
  // Room for a payload of n bytes, so a large answer is one allocation, not a doubling series.
  Writer& reserve(size_t n) {
    buf_.reserve(4 + n);
    return *this;
  }
  Writer& u8(uint8_t v) {
    buf_.push_back(v);
    return *this;
  }
  Writer& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  Writer& i64(int64_t v) {
    auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<uint8_t>(u >> (8 * i)));
    return *this;
  }
  Writer& raw(const void* p, size_t n) {
    u32(static_cast<uint32_t>(n));
    auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
    return *this;
  }
  Writer& str(const std::string& s) { return raw(s.data(), s.size()); }
  Writer& bytes(const Bytes& b) { return raw(b.data(), b.size()); }
  Writer& strs(const std::vector<std::string>& v) {
    u32(static_cast<uint32_t>(v.size()));
    for (const auto& s : v) str(s);
    return *this;
  }
  // Fills in the length prefix and hands out the frame.
  std::vector<uint8_t> frame() {
    size_t n = buf_.size() - 4;
    if (n > kMaxMessage) throw InvalidUsage("store message of " + std::to_string(n) + " bytes exceeds the 1 GiB limit");
    for (int i = 0; i < 4; ++i) buf_[i] = static_cast<uint8_t>(n >> (8 * i));
    return std::move(buf_);
  }

 private:
  std::vector<uint8_t> buf_;
};

inline uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint8_t u8() {
    need(1);
    return p_[off_++];
  }
  uint32_t u32() {
    need(4);
    uint32_t v = load_u32(p_ + off_);
    off_ += 4;
    return v;
  }
  int64_t i64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(p_[off_ + i]) << (8 * i);
    off_ += 8;
    return static_cast<int64_t>(v);
  }
  std::string str() {
    uint32_t n = u32();
    need(n);
    std::string s(reinterpret_cast<const char*>(p_ + off_), n);
    off_ += n;
    return s;
  }
  Bytes bytes() {
    uint32_t n = u32();
    need(n);
    Bytes b(p_ + off_, p_ + off_ + n);
    off_ += n;
    return b;
  }
  std::vector<std::string> strs() {
    uint32_t n = u32();
    if (n > n_ - off_) throw ProtocolError("key count exceeds the message");
    std::vector<std::string> v;
    v.reserve(n);
    for (uint32_t i = 0; i < n; ++i) v.push_back(str());
    return v;
  }
  void end() const {
    if (off_ != n_) throw ProtocolError("trailing bytes in message");
  }

 private:
  void need(size_t k) const {
    if (k > n_ - off_) throw ProtocolError("truncated message");
  }
  const uint8_t* p_;
  size_t n_;
  size_t off_ = 0;
};

inline int poll_timeout_ms(Clock::time_point deadline) {
  auto now = Clock::now();
  if (deadline <= now) return 0;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;  // round up
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

}  // namespace dtrain::tcp_store_detail
