#pragma once
// The TCP store's server state, shared by its two halves: the event loop and
// connections (tcp_store_server.cc) and the requests, held requests and their
// answers (tcp_store_server_ops.cc). Everything here is owned by the server's
// one thread, but `refused`.

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <queue>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dtrain/store.h"
#include "store/tcp_store_codec.h"

namespace dtrain {

using namespace tcp_store_detail;

// A client that has not sent its token by then is refused.
constexpr auto kHelloTimeout = std::chrono::seconds(30);

struct TcpStoreServer::Impl {
  using Frame = std::shared_ptr<const std::vector<uint8_t>>;
  struct Conn {
    uint64_t id = 0;
    int fd = -1;
    uint32_t events = 0;  // as registered with epoll
    std::string peer;
    bool authed = false;
    bool closing = false;  // flush the output, then close
    bool dead = false;
    std::vector<uint8_t> in;
    size_t in_off = 0;
    // Answers not yet sent; a value many clients wait for is one shared frame.
    std::deque<Frame> out;
    size_t out_off = 0;
    Clock::time_point hello_deadline;
    // A GET, GETS or WAIT the server holds until its keys exist.
    bool waiting = false;
    Op wait_op = Op::Wait;
    std::vector<std::string> wait_keys;  // still missing
    std::vector<std::string> get_keys;   // GET/GETS: the keys answered with
    Clock::time_point deadline;
  };
  // epoll tags of the two descriptors that are not clients (client ids start at 1).
  static constexpr uint64_t kWakeTag = 0;
  static constexpr uint64_t kListenTag = ~uint64_t(0);
  using Deadline = std::pair<Clock::time_point, uint64_t>;

  std::string host;
  uint16_t port = 0;
  std::string token;
  std::string address;
  int listen_fd = -1;
  int wake_fd = -1;
  int epoll_fd = -1;
  std::atomic<int> refused{0};
  std::thread thread;

  // Owned by the server thread.
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  uint64_t next_id = 1;
  std::unordered_map<std::string, Bytes> data;
  std::unordered_map<std::string, std::unordered_set<uint64_t>> waiters;
  // GET's answer for a large value, built once and shared by every client that
  // reads it (a join's table: thousands of reads of one value) until it changes.
  std::unordered_map<std::string, Frame> answers;
  // Every held request's and unauthenticated client's deadline; an entry whose
  // client is gone or no longer due then is skipped when it comes up.
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<>> deadlines;
  std::vector<uint64_t> runnable;
  std::vector<uint64_t> dead;
  std::vector<uint8_t> scratch = std::vector<uint8_t>(65536);
  bool accept_failing = false;

  void bind_and_listen();
  void run();
  void accept_all();
  void read_from(Conn& c);
  void process_frames(Conn& c);
  void handle(Conn& c, Reader& r);
  void handle_hello(Conn& c, Reader& r);
  void reply(Conn& c, std::vector<uint8_t> frame) {
    send_frame(c, std::make_shared<const std::vector<uint8_t>>(std::move(frame)));
  }
  void send_frame(Conn& c, Frame frame);
  void flush(Conn& c);
  void watch(Conn& c);
  void kill(Conn& c);
  void refuse(Conn& c, const std::string& reason);
  void start_wait(Conn& c, Op op, std::vector<std::string> missing, int64_t timeout_ms);
  void key_created(const std::string& key);
  void finish_wait(Conn& c, bool timed_out);
  Frame get_answer(const std::string& key);
  void changed(const std::string& key);
  std::vector<uint8_t> values_frame(const std::vector<std::string>& keys);
  void expire(Clock::time_point now);
  void drain_runnable();
  void reap();
  void drop_waiter(Conn& c);
};

}  // namespace dtrain
