#pragma once
// The sparse table of the engine (internal to plugins/ps_grpc): its part on
// one server is the local shards (Sharding: shard = mix64(key) % num_shards,
// held by server shard % num_servers), each a flat hash map key -> row index
// over rows kept in contiguous arrays (keys, counters, and dim values +
// optimizer state per row in one float arena), with its own reader-writer
// lock. A pull (and an async/GEO push) takes every local shard's lock at
// once and goes through the keys in the caller's order, pipelined (hash,
// find, copy or apply of keys 16 apart); a sync step, or a table of more
// than 256 local shards, groups the keys by shard (a counting sort into
// per-thread scratch) and locks each shard once per call. No heap
// allocation per key on the pull and push paths. Row removal (shrink) moves
// the last row into the hole, so the arena stays dense.
// sparse_table.cc: the pull/push/shrink paths; sparse_save.cc: save and load.

#include <atomic>
#include <cstddef>
#include <memory>
#include <new>
#include <shared_mutex>
#include <string>
#include <vector>

#include "engine/files.h"
#include "engine/flat_map.h"
#include "engine/init.h"
#include "engine/rules.h"
#include "engine/sync_steps.h"

namespace dtrain::ps_grpc {

enum : uint32_t { kClean = 0, kChanged = 1, kSaving = 2 };  // RowMeta::changed

struct RowMeta {
  float show = 0, click = 0;
  uint32_t unseen = 0, t = 0, changed = kClean;
};

// Storage aligned to a cache line (64 bytes). A row arena from malloc is
// only 16-byte aligned, so half the 32-byte rows of a dim-8 SGD table would
// straddle two lines, the second never prefetched (measured: 27-35 ns a key
// for a pull against 13 with aligned rows, the table out of cache).
template <typename T>
struct LineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  LineAllocator() = default;
  template <typename U>
  LineAllocator(const LineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <typename U>
  bool operator==(const LineAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const LineAllocator<U>&) const {
    return false;
  }
};

struct ShardData {
  FlatMap index;  // key -> row
  std::vector<uint64_t> keys;
  std::vector<RowMeta> meta;
  std::vector<float, LineAllocator<float>> data;  // rows * stride: values, then the rule's state
  FlatMap pending;                                // key without a row -> pushes counted (admission)
};

struct alignas(64) Shard {
  mutable std::shared_mutex mu;
  ShardData d;
};

// One push's distinct keys, repeats summed in order of appearance. apply()
// reads the view (n, k, h, g, sc, np): into the owned vectors, or straight
// into the caller's arrays when a push had no repeated key (no copy).
struct Pushed {
  std::vector<uint64_t> keys, hashes;
  std::vector<float> grads;       // keys.size() * dim
  std::vector<float> show_click;  // 2 per key
  std::vector<uint32_t> npush;    // pushes of the key merged here (sync: workers)

  uint64_t n = 0;
  const uint64_t *k = nullptr, *h = nullptr;
  const float *g = nullptr, *sc = nullptr;  // sc null: show 1, click 0 per key
  const uint32_t* np = nullptr;             // null: 1 per key
  float show(uint64_t i) const { return sc ? sc[2 * i] : 1.0f; }
  float click(uint64_t i) const { return sc ? sc[2 * i + 1] : 0.0f; }
  uint32_t pushes(uint64_t i) const { return np ? np[i] : 1; }
  void clear() {
    keys.clear();
    hashes.clear();
    grads.clear();
    show_click.clear();
    npush.clear();
  }
  void view_owned() {
    n = keys.size();
    k = keys.data();
    h = hashes.data();
    g = grads.data();
    sc = show_click.data();
    np = npush.data();
  }
};

struct Scratch {
  std::vector<uint64_t> hash;
  std::vector<uint32_t> local, order, start, slots, rows;
  Pushed pushed, merged;
};

class SparseTable final : public Table {
 public:
  SparseTable(const sdk::TableDesc& desc, const Sharding& sh, int server, int workers);

  void pull_dense(int, float*, uint64_t, Clock::time_point) override { dense_op("pull"); }
  void push_dense(int, const float*, uint64_t) override { dense_op("push"); }
  void pull_sparse(int worker, const uint64_t* keys, uint64_t n, float* out, Clock::time_point deadline) override;
  void push_sparse(int worker, const uint64_t* keys, uint64_t n, const float* grads, const float* show_click) override;
  uint64_t shrink(uint32_t flags) override;
  std::vector<std::string> save(const std::string& dir, const std::string& generation, int mode, int format) override;
  void load(const std::string& dir) override;
  TableStats stats() const override;

 private:
  struct Staged;
  [[noreturn]] void dense_op(const char* op) const {
    sdk::fail(DT_ERR_INVALID_USAGE, "table '" + desc_.name + "' is sparse; dense " + op + " refused");
  }
  uint32_t shard_of_hash(uint64_t h) const { return static_cast<uint32_t>(h % sh_.num_shards); }
  uint32_t local_of_hash(uint64_t h) const {
    const uint32_t shard = shard_mask_ ? static_cast<uint32_t>(h & shard_mask_) : shard_of_hash(h);
    return sh_.num_servers == 1 ? shard : shard / static_cast<uint32_t>(sh_.num_servers);
  }

  // A pull takes every local shard's read lock at once when there are at
  // most this many (the job's default shard_num is 64), else one at a time.
  static constexpr uint32_t kLockAllShards = 256;
  void check_keys(const uint64_t* keys, uint64_t n) const;
  struct ShardView {
    FlatMap::View index;
    const float* rows = nullptr;
  };
  void pull_in_order(const uint64_t* keys, uint64_t n, float* out) const;
  template <bool kMasked>
  void pull_rows(const ShardView* views, const uint64_t* keys, uint64_t n, float* out) const;
  void hash_and_check(const uint64_t* keys, uint64_t n, Scratch& s) const;
  void bucket(const uint64_t* h, uint64_t n, Scratch& s) const;
  void dedupe(const uint64_t* keys, uint64_t n, const float* grads, const float* show_click, bool own, Scratch& s,
              Pushed& p) const;
  void merge(const std::vector<const Pushed*>& by_worker, Scratch& s) const;
  uint32_t create_row(ShardData& d, uint64_t key, uint64_t h) const;
  uint32_t admit(ShardData& d, uint64_t key, uint64_t h, uint32_t npush) const;
  void remove_row(ShardData& d, size_t r) const;
  void apply(const Pushed& p, Scratch& s, bool lock_all);
  void apply_in_order(const Pushed& p);
  template <bool kMasked>
  void apply_rows(const Pushed& p);
  // The rule (or GEO's delta) on row r of d with the push's entry i, and the counters.
  void apply_one(ShardData& d, uint32_t r, const Pushed& p, uint32_t i, bool geo, Rule::AdamCache& adam) const;
  void finish_marks(bool saved);
  void read_part(const Manifest& m, const std::string& dir, const std::string& name, Staged& st) const;

  Sharding sh_;
  int server_, workers_;
  uint64_t dim_;
  Rule rule_;
  uint64_t state_, stride_;
  Initializer init_;
  uint32_t nlocal_ = 0;
  uint64_t shard_mask_ = 0;  // num_shards - 1 if a power of two, else 0
  std::unique_ptr<Shard[]> shards_;
  std::atomic<uint64_t> applied_{0};
  SyncSteps<Pushed> sync_;
};

}  // namespace dtrain::ps_grpc
