#pragma once
// Uninitialized staging memory for a call's payload, reused across calls: a
// fresh 16 MB vector costs a zero fill and 4,096 page faults per call (and
// malloc gives large frees back to the kernel, so the next call faults again).
// The server stages dense ranges, sparse pull replies and chunked pushes in
// it; the client stages a dense push's values. Keeps at most kKeepBuffers
// buffers and kKeepBytes in all; thread-safe. A lease keeps the pool alive
// (gRPC may release a slice of it after its owner is gone).

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace dtrain::ps_grpc {

class Staging : public std::enable_shared_from_this<Staging> {
 public:
  class Lease {
   public:
    Lease(std::shared_ptr<Staging> pool, std::unique_ptr<char[]> mem, size_t cap)
        : pool_(std::move(pool)), mem_(std::move(mem)), cap_(cap) {}
    Lease(Lease&&) = default;
    ~Lease() {
      if (mem_) pool_->put(std::move(mem_), cap_);
    }
    template <typename T>
    T* as() const {
      return reinterpret_cast<T*>(mem_.get());
    }

   private:
    std::shared_ptr<Staging> pool_;
    std::unique_ptr<char[]> mem_;
    size_t cap_;
  };

  // At least `bytes` bytes (uninitialized, aligned as new char[] is).
  Lease get(size_t bytes) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      // The smallest kept buffer that fits.
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->first >= bytes && (best == free_.end() || it->first < best->first)) best = it;
      if (best != free_.end()) {
        Lease l(shared_from_this(), std::move(best->second), best->first);
        kept_ -= best->first;
        free_.erase(best);
        return l;
      }
    }
    const size_t cap = std::max<size_t>(bytes, 64);
    return Lease(shared_from_this(), std::unique_ptr<char[]>(new char[cap]), cap);
  }

 private:
  static constexpr size_t kKeepBuffers = 8, kKeepBytes = size_t{128} << 20;
  void put(std::unique_ptr<char[]> mem, size_t cap) {
    std::lock_guard<std::mutex> lk(mu_);
    if (cap > kKeepBytes) return;
    // Make room by dropping the smallest kept buffers.
    while (!free_.empty() && (free_.size() >= kKeepBuffers || kept_ + cap > kKeepBytes)) {
      auto smallest =
          std::min_element(free_.begin(), free_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      kept_ -= smallest->first;
      free_.erase(smallest);
    }
    kept_ += cap;
    free_.emplace_back(cap, std::move(mem));
  }
  std::mutex mu_;
  std::vector<std::pair<size_t, std::unique_ptr<char[]>>> free_;  // capacity, memory
  size_t kept_ = 0;
};

}  // namespace dtrain::ps_grpc
