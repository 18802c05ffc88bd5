#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/store_util.h"

namespace dtrain {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(5);
constexpr size_t kMaxNameLength = 200;

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Every key maps to a distinct name that cannot start with '.', which keeps it apart
// from the lock file, temporary files, "." and "..".
std::string escape_key(const std::string& key) {
  static const char* hex = "0123456789ABCDEF";
  if (key.empty()) return "%";
  std::string out;
  out.reserve(key.size());
  for (size_t i = 0; i < key.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(key[i]);
    bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
                (c == '.' && i > 0);
    if (safe) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (out.size() > kMaxNameLength) {
    // File names are limited to 255 bytes: keep a readable head plus a hash of the whole key.
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a64(key)));
    out = out.substr(0, kMaxNameLength - 20) + "~" + buf;
  }
  return out;
}

std::optional<Bytes> read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw IoError("file store: cannot open '" + path + "': " + std::strerror(errno));
  }
  Bytes data;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) data.reserve(static_cast<size_t>(st.st_size));
  uint8_t buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      throw IoError("file store: cannot read '" + path + "': " + std::strerror(err));
    }
    if (n == 0) break;
    data.insert(data.end(), buf, buf + n);
  }
  ::close(fd);
  return data;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT) return false;
  throw IoError("file store: cannot stat '" + path + "': " + std::strerror(errno));
}

void write_atomic(const std::string& dir, const std::string& path, const Bytes& value) {
  // pid + a random nonce keeps names unique across hosts sharing the folder.
  static const uint64_t nonce = std::random_device{}();
  static std::atomic<uint64_t> counter{0};
  std::string tmp =
      dir + "/.tmp." + std::to_string(::getpid()) + "." + std::to_string(nonce) + "." + std::to_string(counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("file store: cannot create '" + tmp + "': " + std::strerror(errno));
  auto fail = [&](const std::string& what) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw IoError("file store: cannot " + what + " '" + tmp + "': " + std::strerror(err));
  };
  size_t off = 0;
  while (off < value.size()) {
    ssize_t n = ::write(fd, value.data() + off, value.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write");
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw IoError("file store: cannot close '" + tmp + "': " + std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw IoError("file store: cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(err));
  }
}

// Exclusive flock on <dir>/.lock. Each instance opens its own descriptor, so threads
// of one process exclude each other as well as other processes.
class DirLock {
 public:
  explicit DirLock(const std::string& dir) {
    std::string path = dir + "/.lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError("file store: cannot open lock file '" + path + "': " + std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd_);
      throw IoError("file store: cannot lock '" + path + "': " + std::strerror(err));
    }
  }
  ~DirLock() { ::close(fd_); }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_;
};

}  // namespace

FileStore::FileStore(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) throw InvalidUsage("file store: the folder path is empty");
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) throw IoError("file store: cannot create the folder '" + dir_ + "': " + ec.message());
  if (!std::filesystem::is_directory(dir_, ec)) throw IoError("file store: '" + dir_ + "' exists but is not a folder");
  if (::access(dir_.c_str(), R_OK | W_OK | X_OK) != 0)
    throw IoError("file store: cannot use the folder '" + dir_ + "': " + std::strerror(errno));
}

std::string FileStore::path_of(const std::string& key) const { return dir_ + "/" + escape_key(key); }

void FileStore::set(const std::string& key, const Bytes& value) {
  DirLock lock(dir_);
  write_atomic(dir_, path_of(key), value);
}

Bytes FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  auto deadline = store_detail::deadline_after(timeout);
  std::string path = path_of(key);
  for (;;) {
    if (auto v = read_file(path)) return std::move(*v);
    auto now = store_detail::Clock::now();
    if (now >= deadline) throw TimeoutError(store_detail::timeout_message({key}, timeout, "the file store at " + dir_));
    std::this_thread::sleep_for(std::min<store_detail::Clock::duration>(kPollInterval, deadline - now));
  }
}

std::optional<Bytes> FileStore::try_get(const std::string& key) { return read_file(path_of(key)); }

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::string path = path_of(key);
  DirLock lock(dir_);
  auto current = read_file(path);
  int64_t value = store_detail::checked_add(key, current ? store_detail::parse_counter(key, *current) : 0, delta);
  write_atomic(dir_, path, store_detail::format_counter(value));
  return value;
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::string path = path_of(key);
  DirLock lock(dir_);
  auto current = read_file(path);
  if (current ? *current == expected : expected.empty()) {
    write_atomic(dir_, path, desired);
    return desired;
  }
  return current ? std::move(*current) : Bytes{};
}

bool FileStore::check(const std::vector<std::string>& keys) {
  for (const auto& key : keys)
    if (!file_exists(path_of(key))) return false;
  return true;
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  auto deadline = store_detail::deadline_after(timeout);
  std::vector<std::string> missing = keys;
  for (;;) {
    std::vector<std::string> still;
    for (const auto& key : missing)
      if (!file_exists(path_of(key))) still.push_back(key);
    if (still.empty()) return;
    missing.swap(still);
    auto now = store_detail::Clock::now();
    if (now >= deadline)
      throw TimeoutError(store_detail::timeout_message(missing, timeout, "the file store at " + dir_));
    std::this_thread::sleep_for(std::min<store_detail::Clock::duration>(kPollInterval, deadline - now));
  }
}

bool FileStore::remove(const std::string& key) {
  std::string path = path_of(key);
  DirLock lock(dir_);
  if (::unlink(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  throw IoError("file store: cannot remove '" + path + "': " + std::strerror(errno));
}

}  // namespace dtrain
