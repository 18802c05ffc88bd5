#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/store_util.h"

namespace dtrain {

struct MemoryStore::Impl {
  std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<std::string, Bytes> data;

  bool has_all(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; });
  }

  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout) {
    auto deadline = store_detail::deadline_after(timeout);
    while (!has_all(keys)) {
      if (cv.wait_until(lock, deadline) == std::cv_status::timeout && !has_all(keys)) {
        std::vector<std::string> missing;
        for (const auto& k : keys)
          if (!data.count(k)) missing.push_back(k);
        throw TimeoutError(store_detail::timeout_message(missing, timeout, "the in-memory store"));
      }
    }
  }
};

MemoryStore::MemoryStore() : impl_(std::make_unique<Impl>()) {}
MemoryStore::~MemoryStore() = default;

void MemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->data[key] = value;
  }
  impl_->cv.notify_all();
}

Bytes MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->wait_locked(lock, {key}, timeout);
  return impl_->data.at(key);
}

std::optional<Bytes> MemoryStore::try_get(const std::string& key) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->data.find(key);
  if (it == impl_->data.end()) return std::nullopt;
  return it->second;
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t result;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->data.find(key);
    int64_t current = it == impl_->data.end() ? 0 : store_detail::parse_counter(key, it->second);
    result = store_detail::checked_add(key, current, delta);
    impl_->data[key] = store_detail::format_counter(result);
  }
  impl_->cv.notify_all();
  return result;
}

Bytes MemoryStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Bytes result;
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->data.find(key);
    if (it == impl_->data.end()) {
      if (expected.empty()) {
        impl_->data[key] = desired;
        result = desired;
        changed = true;
      }
    } else if (it->second == expected) {
      it->second = desired;
      result = desired;
      changed = true;
    } else {
      result = it->second;
    }
  }
  if (changed) impl_->cv.notify_all();
  return result;
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->has_all(keys);
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->wait_locked(lock, keys, timeout);
}

bool MemoryStore::remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->data.erase(key) > 0;
}

std::vector<Bytes> Store::multi_get(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  auto deadline = store_detail::deadline_after(timeout);
  std::vector<Bytes> out;
  out.reserve(keys.size());
  for (const auto& key : keys) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - store_detail::Clock::now());
    out.push_back(get(key, std::max(left, std::chrono::milliseconds(0))));
  }
  return out;
}

// PrefixStore

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  if (!base_) throw InvalidUsage("PrefixStore '" + prefix_ + "' needs a base store, got null");
}

void PrefixStore::set(const std::string& key, const Bytes& value) { base_->set(k(key), value); }
Bytes PrefixStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return base_->get(k(key), timeout);
}
std::optional<Bytes> PrefixStore::try_get(const std::string& key) { return base_->try_get(k(key)); }
int64_t PrefixStore::add(const std::string& key, int64_t delta) { return base_->add(k(key), delta); }
Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return base_->compare_set(k(key), expected, desired);
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return base_->check(k(keys)); }
void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  base_->wait(k(keys), timeout);
}
std::vector<Bytes> PrefixStore::multi_get(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  return base_->multi_get(k(keys), timeout);
}
bool PrefixStore::remove(const std::string& key) { return base_->remove(k(key)); }

}  // namespace dtrain
