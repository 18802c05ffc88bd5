#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain {

using Bytes = std::vector<uint8_t>;

// A key-value rendezvous store (as c10d's Store and Gloo's rendezvous::Store).
// Every method is thread-safe. Blocking methods take a timeout; when it passes
// they throw TimeoutError naming the keys still missing. Connection failures
// throw IoError naming the store's address.
class Store {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::seconds(300)};
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until the key exists, then returns its value.
  virtual Bytes get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Returns the value if the key exists now; never blocks on the key.
  virtual std::optional<Bytes> try_get(const std::string& key) = 0;
  // Atomically adds delta to the integer stored at key (created as 0); returns the
  // new value. The value is kept as decimal text, so get() on it reads "42".
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets key to desired if its current value equals expected (a missing key
  // matches an empty expected). Returns the value after the call.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  // True if every key exists now.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Blocks until every key exists.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Removes a key; returns whether it existed.
  virtual bool remove(const std::string& key) = 0;
  // Blocks until every key exists, then returns their values in the order asked.
  // The TCP store answers it in one round trip; the default calls get() per key.
  virtual std::vector<Bytes> multi_get(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  // Convenience for text values.
  void set(const std::string& key, const std::string& value) { set(key, Bytes(value.begin(), value.end())); }
  std::string get_string(const std::string& key, std::chrono::milliseconds timeout = kDefaultTimeout) {
    Bytes b = get(key, timeout);
    return std::string(b.begin(), b.end());
  }
};

// Declares, inside a Store subclass, the overrides of every operation above.
#define DTRAIN_STORE_OPS                                                                           \
  using Store::set;                                                                                \
  void set(const std::string& key, const Bytes& value) override;                                   \
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;                   \
  std::optional<Bytes> try_get(const std::string& key) override;                                   \
  int64_t add(const std::string& key, int64_t delta) override;                                     \
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override; \
  bool check(const std::vector<std::string>& keys) override;                                       \
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;     \
  bool remove(const std::string& key) override

// A join written once, for the launcher and `dtrain-bench store`: `count`
// members each publish one value, and every member reads all of them. The
// member whose publication completes the set assembles the values into one
// key, so each member reads the table with one request, not `count`, and the
// store serves `count` reads of it instead of count x count. The keys
// ("member/<i>", "members/joined", "members/table") are the store's own: give
// each join a PrefixStore of its own.
void publish_member(Store& store, int index, int count, const Bytes& value);
// The members' values by index, as read: one buffer ("u32 n, u32 offsets[n+1],
// the values end to end"), indexed in place, not copied per member.
class MemberTable {
 public:
  MemberTable(Bytes encoded, int count);  // throws InvalidUsage on a malformed table
  size_t size() const { return n_; }
  // A view into this table (valid while it lives).
  std::string_view operator[](size_t i) const {
    size_t a = offset(i), b = offset(i + 1);
    return {reinterpret_cast<const char*>(data_.data()) + values_ + a, b - a};
  }

 private:
  size_t u32_at(size_t pos) const {
    const uint8_t* p = data_.data() + pos;
    return size_t(p[0]) | size_t(p[1]) << 8 | size_t(p[2]) << 16 | size_t(p[3]) << 24;
  }
  size_t offset(size_t i) const { return u32_at(4 + 4 * i); }
  Bytes data_;
  size_t n_ = 0, values_ = 0;  // member count, where the values start
};
// Blocks until the table exists and returns the values by index. `between` runs
// about every 200 ms while waiting (it may throw to give up, e.g. on a signal).
// After `timeout` throws TimeoutError naming the members not yet published.
MemberTable read_members(Store& store, int count, std::chrono::milliseconds timeout,
                         const std::function<void()>& between = {});
// The indices of the members that have not published (after a timeout).
std::vector<int> missing_members(Store& store, int count);

// In-process store (threads of one process, tests). Thread-safe.
class MemoryStore : public Store {
 public:
  MemoryStore();
  ~MemoryStore() override;
  DTRAIN_STORE_OPS;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Prepends "prefix/" to every key of an underlying store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  DTRAIN_STORE_OPS;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string k(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> k(const std::vector<std::string>& keys) const {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& key : keys) full.push_back(k(key));
    return full;
  }
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

// A store in a shared folder (as Paddle's PADDLE_GLOO_FS_PATH / Gloo's FileStore):
// one file per key, written atomically (temporary file + rename); add and
// compare_set are serialized with an flock on a lock file in the folder.
class FileStore : public Store {
 public:
  explicit FileStore(std::string dir);
  DTRAIN_STORE_OPS;

 private:
  std::string path_of(const std::string& key) const;
  std::string dir_;
};

// The TCP store's server. Embeddable in any process (the launcher, rank 0, a
// test): it serves on its own thread from construction until destruction.
// Clients must present the job token in their first message; a client with a
// wrong or missing token is refused (it gets an error reply naming the reason)
// and the refusal is logged with the client's address.
class TcpStoreServer {
 public:
  // host: address to bind ("127.0.0.1", "0.0.0.0", "::"); port 0 picks a free port.
  TcpStoreServer(const std::string& host, uint16_t port, std::string token);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  uint16_t port() const;
  const std::string& host() const;
  // Number of clients refused so far (wrong/missing token).
  int refused_clients() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Client of a TcpStoreServer. Connects in the constructor (retrying until
// connect_timeout while the server is not up yet) and authenticates with the
// token; a refused token throws InvalidUsage saying so. One connection, guarded
// by a mutex, so every method is thread-safe.
class TcpStore : public Store {
 public:
  TcpStore(const std::string& host, uint16_t port, const std::string& token,
           std::chrono::milliseconds connect_timeout = std::chrono::seconds(60));
  ~TcpStore() override;
  DTRAIN_STORE_OPS;
  // How long a request that does not wait on keys (set, add, try_get, check,
  // ...) may go unanswered before the connection counts as lost (IoError);
  // kDefaultTimeout unless set. A process that must notice a cut link soon
  // (the launcher's heartbeat) shortens it.
  void set_answer_timeout(std::chrono::milliseconds timeout);
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain
