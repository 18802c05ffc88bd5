#pragma once
// An open-addressing hash map from a u64 key to a u32 value (a row index or
// a counter): linear probing, power-of-two capacity, load <= 3/8 (at 1/2 a
// 64K-key pull took ~10% longer: longer probes, mispredicted probe loops;
// slots are 16 bytes, so 43-85 bytes of slots per key), erase by backward
// shift (no tombstones). The caller passes h = mix64(key) (init.h) so one
// hash serves the shard choice (low bits) and the slot (high bits).
// Not thread-safe: the owning shard's lock guards it.

#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/init.h"

namespace dtrain::ps_grpc {

class FlatMap {
  struct Slot {
    uint64_t key = 0;
    uint32_t val = 0xffffffffu;
  };

 public:
  static constexpr uint32_t kNone = 0xffffffffu;

  size_t size() const { return size_; }
  size_t capacity() const { return slots_.size(); }

  // The slot index to prefetch before find/insert of h.
  const void* probe_address(uint64_t h) const { return slots_.empty() ? nullptr : &slots_[home(h)]; }

  uint32_t find(uint64_t key, uint64_t h) const {
    if (slots_.empty()) return kNone;
    for (size_t i = home(h);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.val == kNone) return kNone;
      if (s.key == key) return s.val;
    }
  }
  uint32_t* find_mut(uint64_t key, uint64_t h) {
    if (slots_.empty()) return nullptr;
    for (size_t i = home(h);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.val == kNone) return nullptr;
      if (s.key == key) return &s.val;
    }
  }
  // key must not be present; val != kNone.
  void insert(uint64_t key, uint64_t h, uint32_t val) {
    if ((size_ + 1) * 8 > slots_.size() * 3) grow();
    size_t i = home(h);
    while (slots_[i].val != kNone) i = (i + 1) & mask_;
    slots_[i] = Slot{key, val};
    ++size_;
  }
  bool erase(uint64_t key, uint64_t h) {
    if (slots_.empty()) return false;
    size_t i = home(h);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].val == kNone) return false;
      if (slots_[i].key == key) break;
    }
    for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      if (slots_[j].val == kNone) break;
      const size_t k = home(mix64(slots_[j].key));
      // Move j back to i unless its home lies cyclically in (i, j].
      const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i].val = kNone;
    --size_;
    return true;
  }
  void clear() {
    slots_.clear();
    slots_.shrink_to_fit();
    size_ = 0;
    mask_ = 0;
  }
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap * 3 < 8 * n) cap *= 2;
    if (cap > slots_.size()) rehash(cap);
  }
  // A read-only view for a lookup loop: the slot array and its mask, without
  // the indirection through the map (a pull keeps one per shard on its
  // stack). Valid while the map is neither changed nor destroyed.
  class View {
   public:
    View() = default;
    explicit View(const FlatMap& m) : slots_(m.slots_.empty() ? nullptr : m.slots_.data()), mask_(m.mask_) {}
    const void* probe_address(uint64_t h) const { return slots_ + home(h); }
    uint32_t find(uint64_t key, uint64_t h) const {
      if (!slots_) return kNone;
      for (size_t i = home(h);; i = (i + 1) & mask_) {
        const Slot& s = slots_[i];
        if (s.val == kNone) return kNone;
        if (s.key == key) return s.val;
      }
    }

   private:
    size_t home(uint64_t h) const { return static_cast<size_t>((h >> 32) | (h << 32)) & mask_; }
    const Slot* slots_ = nullptr;
    size_t mask_ = 0;
  };

  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.val != kNone) f(s.key, s.val);
  }

 private:
  size_t home(uint64_t h) const { return static_cast<size_t>((h >> 32) | (h << 32)) & mask_; }
  void grow() { rehash(slots_.empty() ? 16 : slots_.size() * 2); }
  void rehash(size_t cap) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    for (const Slot& s : old) {
      if (s.val == kNone) continue;
      size_t i = home(mix64(s.key));
      while (slots_[i].val != kNone) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace dtrain::ps_grpc
