// The Redis reference: a real peer key-value store on loopback, driven
// through hiredis with pipelining.
#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "process.h"
#include "ps_internal.h"
#include "dtrain/error.h"

namespace dtrain::bench::psb {

namespace {

constexpr size_t kBatch = 512;  // keys per HMGET / HSET command
constexpr size_t kWindow = 32;  // commands in flight per connection

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw IoError("cannot find a free loopback port for redis-server");
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

redisContext* connect(int port, std::chrono::seconds wait) {
  auto until = Clock::now() + wait;
  for (;;) {
    redisContext* c = redisConnect("127.0.0.1", port);
    if (c && !c->err) return c;
    std::string err = c ? c->errstr : "out of memory";
    if (c) redisFree(c);
    if (Clock::now() > until)
      throw IoError("cannot reach redis-server on 127.0.0.1:" + std::to_string(port) + ": " + err);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

struct ReplyPtr {
  redisReply* r = nullptr;
  ~ReplyPtr() {
    if (r) freeReplyObject(r);
  }
};

int devnull_fd() {
  static int fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  return fd;
}

class RedisImpl : public Impl {
 public:
  explicit RedisImpl(const std::vector<int>& ports) {
    for (int p : ports) ctx_.push_back(connect(p, std::chrono::seconds(10)));
  }
  ~RedisImpl() override {
    for (auto* c : ctx_) redisFree(c);
  }

  void sparse_pull(const uint64_t* keys, size_t n, size_t dim, float* out) override {
    const std::string table = "t" + std::to_string(dim);
    const size_t row = dim * 4;
    run_batches(
        n,
        [&](size_t b, size_t e, std::vector<const char*>& argv, std::vector<size_t>& lens) {
          argv = {"HMGET", table.c_str()};
          lens = {5, table.size()};
          for (size_t i = b; i < e; ++i) argv.push_back(reinterpret_cast<const char*>(keys + i)), lens.push_back(8);
        },
        [&](size_t b, size_t e, redisReply* r) {
          if (r->type != REDIS_REPLY_ARRAY || r->elements != e - b) fail("HMGET", r);
          for (size_t i = b; i < e; ++i) {
            redisReply* el = r->element[i - b];
            if (el->type == REDIS_REPLY_STRING && el->len == row)
              std::memcpy(out + i * dim, el->str, row);
            else
              std::memset(out + i * dim, 0, row);
          }
        });
  }

  void sparse_push(const uint64_t* keys, size_t n, size_t dim, const float* grads) override {
    const std::string table = "t" + std::to_string(dim);
    const size_t row = dim * 4;
    run_batches(
        n,
        [&](size_t b, size_t e, std::vector<const char*>& argv, std::vector<size_t>& lens) {
          argv = {"HSET", table.c_str()};
          lens = {4, table.size()};
          for (size_t i = b; i < e; ++i) {
            argv.push_back(reinterpret_cast<const char*>(keys + i)), lens.push_back(8);
            argv.push_back(reinterpret_cast<const char*>(grads + i * dim)), lens.push_back(row);
          }
        },
        [&](size_t, size_t, redisReply* r) {
          if (r->type != REDIS_REPLY_INTEGER) fail("HSET", r);
        });
  }

  void dense_pull(float* out, size_t count) override {
    const std::string key = "d" + std::to_string(count);
    for_servers(
        count,
        [&](redisContext* c, size_t b, size_t e) {
          redisAppendCommand(c, "GET %b", key.data(), key.size());
          (void)b, (void)e;
        },
        [&](redisReply* r, size_t b, size_t e) {
          size_t bytes = (e - b) * 4;
          if (r->type == REDIS_REPLY_STRING && r->len == bytes)
            std::memcpy(out + b, r->str, bytes);
          else if (r->type == REDIS_REPLY_NIL)
            std::memset(out + b, 0, bytes);
          else
            fail("GET", r);
        });
  }

  void dense_push(const float* grads, size_t count) override {
    const std::string key = "d" + std::to_string(count);
    for_servers(
        count,
        [&](redisContext* c, size_t b, size_t e) {
          redisAppendCommand(c, "SET %b %b", key.data(), key.size(), grads + b, (e - b) * 4);
        },
        [&](redisReply* r, size_t, size_t) {
          if (r->type != REDIS_REPLY_STATUS) fail("SET", r);
        });
  }

 private:
  [[noreturn]] static void fail(const char* what, redisReply* r) {
    throw IoError(std::string("Redis reference: unexpected reply to ") + what +
                  (r->type == REDIS_REPLY_ERROR ? std::string(": ") + r->str : std::string()));
  }
  redisReply* read(redisContext* c) {
    void* r = nullptr;
    if (redisGetReply(c, &r) != REDIS_OK || !r) throw IoError(std::string("Redis reference: ") + c->errstr);
    return static_cast<redisReply*>(r);
  }

  // Keys [0, n) split evenly over the servers, each part in batches of kBatch
  // keys, at most kWindow batches in flight per connection.
  template <class Build, class Take>
  void run_batches(size_t n, Build&& build, Take&& take) {
    const size_t S = ctx_.size();
    struct Part {
      size_t next, end;
      std::vector<std::pair<size_t, size_t>> inflight;
      size_t head = 0;
    };
    std::vector<Part> parts;
    for (size_t s = 0; s < S; ++s) {
      size_t b = n / S * s + std::min(s, n % S), e = b + n / S + (s < n % S ? 1 : 0);
      parts.push_back({b, e, {}, 0});
    }
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (bool busy = true; busy;) {
      busy = false;
      for (size_t s = 0; s < S; ++s) {
        Part& p = parts[s];
        while (p.next < p.end && p.inflight.size() - p.head < kWindow) {
          size_t e = std::min(p.end, p.next + kBatch);
          build(p.next, e, argv, lens);
          redisAppendCommandArgv(ctx_[s], static_cast<int>(argv.size()), argv.data(), lens.data());
          p.inflight.push_back({p.next, e});
          p.next = e;
        }
        if (p.head < p.inflight.size()) {
          ReplyPtr r{read(ctx_[s])};
          take(p.inflight[p.head].first, p.inflight[p.head].second, r.r);
          ++p.head;
        }
        busy = busy || p.next < p.end || p.head < p.inflight.size();
      }
    }
  }

  template <class Send, class Take>
  void for_servers(size_t count, Send&& send, Take&& take) {
    const size_t S = ctx_.size();
    auto range = [&](size_t s) {
      size_t b = count / S * s + std::min(s, count % S);
      return std::make_pair(b, b + count / S + (s < count % S ? 1 : 0));
    };
    for (size_t s = 0; s < S; ++s) send(ctx_[s], range(s).first, range(s).second);
    for (size_t s = 0; s < S; ++s) {
      ReplyPtr r{read(ctx_[s])};
      take(r.r, range(s).first, range(s).second);
    }
  }

  std::vector<redisContext*> ctx_;
};

}  // namespace

std::unique_ptr<Impl> make_redis_impl(const std::vector<int>& ports) { return std::make_unique<RedisImpl>(ports); }

RedisServer::RedisServer(const std::string& exe) {
  port_ = free_port();
  pid_ = spawn(exe,
               {exe, "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--protected-mode", "no", "--loglevel", "warning", "--logfile", ""},
               {}, devnull_fd());
  redisContext* c = connect(port_, std::chrono::seconds(10));
  redisFree(c);
}

RedisServer::~RedisServer() {
  if (pid_ <= 0) return;
  try {
    redisContext* c = redisConnect("127.0.0.1", port_);
    if (c && !c->err) {
      void* r = redisCommand(c, "SHUTDOWN NOSAVE");
      if (r) freeReplyObject(r);
    }
    if (c) redisFree(c);
  } catch (...) {
  }
  auto until = Clock::now() + std::chrono::seconds(5);
  int st = 0;
  while (::waitpid(pid_, &st, WNOHANG) == 0) {
    if (Clock::now() > until) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace dtrain::bench::psb
