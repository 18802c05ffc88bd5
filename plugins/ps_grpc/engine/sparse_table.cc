// The sparse table's pull, push and shrink paths (layout: sparse_table.h).

#include "engine/sparse_table.h"

#include <cstring>

#include "engine/factories.h"

namespace dtrain::ps_grpc {
namespace {
thread_local Scratch tls;
constexpr uint32_t kAhead = 16;  // prefetch distance in keys

// A row copy short enough that a call to memcpy would cost more than the copy.
// Blocks of 8 floats as fixed-size copies (one vector move each).
inline void copy_row(float* dst, const float* src, uint64_t n) {
  uint64_t c = 0;
  for (; c + 8 <= n; c += 8) std::memcpy(dst + c, src + c, 8 * sizeof(float));
  for (; c < n; ++c) dst[c] = src[c];
}

// Prefetches every cache line of n floats at p (a row can span several, and
// a row of a stride that is not a divisor of 16 floats can straddle two).
template <int RW>
inline void prefetch_row(const float* p, uint64_t n) {
  const uintptr_t end = reinterpret_cast<uintptr_t>(p + n);
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; a < end; a += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(a), RW);
}

// A request thread's scratch keeps its capacity between calls (no
// allocation on the hot path) unless a call was huge: then it is let go.
struct ScratchGuard {
  Scratch& s;
  ~ScratchGuard() {
    if (s.hash.capacity() > (1u << 20) || s.pushed.grads.capacity() > (1u << 24) ||
        s.merged.grads.capacity() > (1u << 24))
      s = Scratch();
  }
};
}  // namespace

SparseTable::SparseTable(const sdk::TableDesc& desc, const Sharding& sh, int server, int workers)
    : Table(desc),
      sh_(sh),
      server_(server),
      workers_(workers),
      dim_(desc.dim),
      rule_(desc),
      state_(rule_.row_state(desc.dim)),
      stride_(desc.dim + state_),
      init_(desc.initializer, desc.init_a, desc.init_b, desc.seed),
      sync_(workers) {
  const uint32_t s = static_cast<uint32_t>(sh.num_servers), srv = static_cast<uint32_t>(server);
  nlocal_ = srv < sh.num_shards ? (sh.num_shards - srv + s - 1) / s : 0;
  shards_ = std::make_unique<Shard[]>(nlocal_);
  if (sh.num_shards > 1 && (sh.num_shards & (sh.num_shards - 1)) == 0) shard_mask_ = sh.num_shards - 1;
}

void SparseTable::pull_sparse(int worker, const uint64_t* keys, uint64_t n, float* out, Clock::time_point deadline) {
  check_worker(desc_.name, worker, workers_);
  if (nlocal_ <= kLockAllShards) {
    check_keys(keys, n);
    if (desc_.mode == DT_PS_MODE_SYNC) sync_.wait(worker, deadline, desc_.name);
    pull_in_order(keys, n, out);
    return;
  }
  Scratch& s = tls;
  ScratchGuard guard{s};
  hash_and_check(keys, n, s);
  if (desc_.mode == DT_PS_MODE_SYNC) sync_.wait(worker, deadline, desc_.name);
  bucket(s.hash.data(), n, s);
  s.rows.resize(n);
  for (uint32_t l = 0; l < nlocal_; ++l) {
    const uint32_t b = s.start[l], e = s.start[l + 1];
    if (b == e) continue;
    const Shard& sh = shards_[l];
    std::shared_lock<std::shared_mutex> lk(sh.mu);
    const ShardData& d = sh.d;
    // Two passes, each prefetching ahead: find the rows, then copy them.
    for (uint32_t k = b; k < e; ++k) {
      if (k + kAhead < e) __builtin_prefetch(d.index.probe_address(s.hash[s.order[k + kAhead]]));
      const uint32_t i = s.order[k];
      s.rows[k] = d.index.find(keys[i], s.hash[i]);
    }
    for (uint32_t k = b; k < e; ++k) {
      if (k + kAhead < e) {
        const uint32_t ra = s.rows[k + kAhead];
        if (ra != FlatMap::kNone) prefetch_row<0>(&d.data[static_cast<size_t>(ra) * stride_], dim_);
        __builtin_prefetch(out + s.order[k + kAhead] * dim_, 1);
      }
      const uint32_t i = s.order[k], r = s.rows[k];
      float* dst = out + i * dim_;
      if (r != FlatMap::kNone)
        copy_row(dst, &d.data[r * stride_], dim_);
      else
        init_.fill(keys[i], dst, dim_);
    }
  }
}

// Refuses a key of another server before anything waits or is written.
void SparseTable::check_keys(const uint64_t* keys, uint64_t n) const {
  const uint32_t ns = static_cast<uint32_t>(sh_.num_servers), srv = static_cast<uint32_t>(server_);
  if (ns == 1) return;
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t shard = shard_of_hash(mix64(keys[i]));
    if (shard % ns != srv)
      sdk::fail(DT_ERR_INVALID_USAGE, "table '" + desc_.name + "': key " + std::to_string(keys[i]) + " (shard " +
                                          std::to_string(shard) + " of " + std::to_string(sh_.num_shards) +
                                          ") belongs to server " + std::to_string(shard % ns) + ", not to server " +
                                          std::to_string(server_));
  }
}

// A pull under every local shard's read lock, in the caller's order, as a
// three-stage pipeline over a ring of kRing keys: hash key i and prefetch its
// slot; find key i - kAhead's row and prefetch it; copy key i - 2 kAhead's row.
// No sort by shard, no scratch, the output written in order. The shards'
// slot arrays and rows are read through a table of views on the stack (no
// indirection through the shard objects per key); kMasked: one server and a
// power-of-two shard count, so a key's local shard is its hash's low bits.
void SparseTable::pull_in_order(const uint64_t* keys, uint64_t n, float* out) const {
  std::shared_lock<std::shared_mutex> locks[kLockAllShards];
  ShardView views[kLockAllShards];
  for (uint32_t l = 0; l < nlocal_; ++l) {
    locks[l] = std::shared_lock<std::shared_mutex>(shards_[l].mu);
    views[l].index = FlatMap::View(shards_[l].d.index);
    views[l].rows = shards_[l].d.data.data();
  }
  if (shard_mask_ && sh_.num_servers == 1)
    pull_rows<true>(views, keys, n, out);
  else
    pull_rows<false>(views, keys, n, out);
}

template <bool kMasked>
void SparseTable::pull_rows(const ShardView* views, const uint64_t* keys, uint64_t n, float* out) const {
  constexpr uint32_t kRing = 64;  // > 2 * kAhead, a power of two
  static_assert(kRing > 2 * kAhead && (kRing & (kRing - 1)) == 0);
  const uint64_t dim = dim_, stride = stride_, mask = shard_mask_;
  uint64_t hash[kRing];
  uint32_t local[kRing], row[kRing];
  for (uint64_t i = 0; i < n + 2 * kAhead; ++i) {
    if (i < n) {
      const uint64_t h = mix64(keys[i]);
      const uint32_t l = kMasked ? static_cast<uint32_t>(h & mask) : local_of_hash(h);
      hash[i % kRing] = h;
      local[i % kRing] = l;
      __builtin_prefetch(views[l].index.probe_address(h));
    }
    if (i >= kAhead && i - kAhead < n) {
      const uint64_t j = i - kAhead;
      const ShardView& v = views[local[j % kRing]];
      const uint32_t r = v.index.find(keys[j], hash[j % kRing]);
      row[j % kRing] = r;
      if (r != FlatMap::kNone) prefetch_row<0>(v.rows + static_cast<size_t>(r) * stride, dim);
    }
    if (i >= 2 * kAhead) {
      const uint64_t j = i - 2 * kAhead;
      const uint32_t r = row[j % kRing];
      float* dst = out + j * dim;
      if (r != FlatMap::kNone)
        copy_row(dst, views[local[j % kRing]].rows + static_cast<size_t>(r) * stride, dim);
      else
        init_.fill(keys[j], dst, dim);
    }
  }
}

void SparseTable::push_sparse(int worker, const uint64_t* keys, uint64_t n, const float* grads,
                              const float* show_click) {
  check_worker(desc_.name, worker, workers_);
  Scratch& s = tls;
  ScratchGuard guard{s};
  hash_and_check(keys, n, s);
  if (desc_.mode != DT_PS_MODE_SYNC) {
    dedupe(keys, n, grads, show_click, false, s, s.pushed);
    apply(s.pushed, s, true);
    return;
  }
  Pushed step;
  dedupe(keys, n, grads, show_click, true, s, step);
  sync_.push(worker, std::move(step), [&](const std::vector<const Pushed*>& by_worker) {
    merge(by_worker, s);
    apply(s.merged, s, false);
  });
}

uint64_t SparseTable::shrink(uint32_t flags) {
  const float decay = static_cast<float>(desc_.decay_rate);
  const uint32_t days = desc_.delete_after_unseen_days;
  uint64_t deleted = 0;
  for (uint32_t l = 0; l < nlocal_; ++l) {
    std::unique_lock<std::shared_mutex> lk(shards_[l].mu);
    ShardData& d = shards_[l].d;
    for (size_t r = d.keys.size(); r-- > 0;) {
      RowMeta& m = d.meta[r];
      if (flags & DT_PS_SHRINK_NEW_DAY) ++m.unseen;
      m.show *= decay;
      m.click *= decay;
      const double score = (static_cast<double>(m.show) - static_cast<double>(m.click)) * desc_.nonclk_coeff +
                           static_cast<double>(m.click) * desc_.click_coeff;
      if (score < desc_.delete_threshold || (days > 0 && m.unseen > days)) {
        remove_row(d, r);
        ++deleted;
      }
    }
  }
  return deleted;
}

TableStats SparseTable::stats() const {
  TableStats st;
  for (uint32_t l = 0; l < nlocal_; ++l) {
    std::shared_lock<std::shared_mutex> lk(shards_[l].mu);
    st.rows += shards_[l].d.keys.size();
    st.pending += shards_[l].d.pending.size();
  }
  st.applied_steps = applied_.load();
  return st;
}

// s.hash[i] = mix64(keys[i]); refuses a key of another server (nothing changed yet).
void SparseTable::hash_and_check(const uint64_t* keys, uint64_t n, Scratch& s) const {
  if (n > 0xffffffffull)
    sdk::fail(DT_ERR_INVALID_USAGE, "table '" + desc_.name + "': " + std::to_string(n) + " keys in one call");
  s.hash.resize(n);
  const uint32_t ns = static_cast<uint32_t>(sh_.num_servers), srv = static_cast<uint32_t>(server_);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t h = mix64(keys[i]);
    s.hash[i] = h;
    if (ns == 1) continue;
    const uint32_t shard = shard_of_hash(h);
    if (shard % ns != srv)
      sdk::fail(DT_ERR_INVALID_USAGE, "table '" + desc_.name + "': key " + std::to_string(keys[i]) + " (shard " +
                                          std::to_string(shard) + " of " + std::to_string(sh_.num_shards) +
                                          ") belongs to server " + std::to_string(shard % ns) + ", not to server " +
                                          std::to_string(server_));
  }
}

// Counting sort of n keys by local shard (of their hashes h): s.order[s.start[l] .. s.start[l+1]).
void SparseTable::bucket(const uint64_t* h, uint64_t n, Scratch& s) const {
  s.local.resize(n);
  for (uint64_t i = 0; i < n; ++i) s.local[i] = local_of_hash(h[i]);
  s.start.assign(nlocal_ + 1, 0);
  for (uint64_t i = 0; i < n; ++i) ++s.start[s.local[i] + 1];
  for (uint32_t l = 0; l < nlocal_; ++l) s.start[l + 1] += s.start[l];
  s.order.resize(n);
  // Fill using start[l] as a cursor, then shift back.
  for (uint64_t i = 0; i < n; ++i) s.order[s.start[s.local[i]]++] = static_cast<uint32_t>(i);
  for (uint32_t l = nlocal_; l > 0; --l) s.start[l] = s.start[l - 1];
  s.start[0] = 0;
}

// Repeated keys summed, in order of appearance (s.hash holds the hashes).
// Without repeats and without own, p views the caller's arrays.
void SparseTable::dedupe(const uint64_t* keys, uint64_t n, const float* grads, const float* show_click, bool own,
                         Scratch& s, Pushed& p) const {
  p.clear();
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  s.slots.assign(cap, 0);
  const size_t mask = cap - 1;
  // Pass 1: slot -> first occurrence + 1; rows[i] = the first occurrence of keys[i].
  s.rows.resize(n);
  uint64_t unique = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t h = s.hash[i];
    for (size_t j = static_cast<size_t>((h >> 32) | (h << 32)) & mask;; j = (j + 1) & mask) {
      const uint32_t first = s.slots[j];
      if (first == 0) {
        s.slots[j] = static_cast<uint32_t>(i + 1);
        s.rows[i] = static_cast<uint32_t>(i);
        ++unique;
        break;
      }
      if (keys[first - 1] == keys[i]) {
        s.rows[i] = first - 1;
        break;
      }
    }
  }
  if (unique == n && !own) {
    p.n = n;
    p.k = keys;
    p.h = s.hash.data();
    p.g = grads;
    p.sc = show_click;
    p.np = nullptr;
    return;
  }
  // Pass 2: the distinct keys in order of first appearance, repeats summed.
  p.keys.reserve(unique);
  p.grads.reserve(unique * dim_);
  std::vector<uint32_t>& at = s.slots;  // reused: first occurrence -> position in p
  at.resize(std::max<size_t>(at.size(), n));
  for (uint64_t i = 0; i < n; ++i) {
    const float sh = show_click ? show_click[2 * i] : 1.0f, cl = show_click ? show_click[2 * i + 1] : 0.0f;
    const float* g = grads + i * dim_;
    const uint32_t first = s.rows[i];
    if (first == i) {
      at[i] = static_cast<uint32_t>(p.keys.size());
      p.keys.push_back(keys[i]);
      p.hashes.push_back(s.hash[i]);
      p.grads.insert(p.grads.end(), g, g + dim_);
      p.show_click.push_back(sh);
      p.show_click.push_back(cl);
      p.npush.push_back(1);
      continue;
    }
    const uint32_t pos = at[first];
    float* acc = &p.grads[pos * dim_];
    for (uint64_t c = 0; c < dim_; ++c) acc[c] += g[c];
    p.show_click[2 * pos] += sh;
    p.show_click[2 * pos + 1] += cl;
  }
  p.view_owned();
}

// A sync step: the workers' pushes summed per key in worker order, / num_workers.
void SparseTable::merge(const std::vector<const Pushed*>& by_worker, Scratch& s) const {
  Pushed& m = s.merged;
  m.clear();
  size_t total = 0;
  for (const Pushed* p : by_worker) total += p->n;
  size_t cap = 16;
  while (cap < 2 * total) cap *= 2;
  s.slots.assign(cap, 0);
  const size_t mask = cap - 1;
  for (const Pushed* p : by_worker) {
    for (uint64_t i = 0; i < p->n; ++i) {
      const uint64_t h = p->h[i], key = p->k[i];
      const float* g = p->g + i * dim_;
      for (size_t j = static_cast<size_t>((h >> 32) | (h << 32)) & mask;; j = (j + 1) & mask) {
        const uint32_t pos = s.slots[j];
        if (pos == 0) {
          s.slots[j] = static_cast<uint32_t>(m.keys.size() + 1);
          m.keys.push_back(key);
          m.hashes.push_back(h);
          m.grads.insert(m.grads.end(), g, g + dim_);
          m.show_click.push_back(p->show(i));
          m.show_click.push_back(p->click(i));
          m.npush.push_back(1);
          break;
        }
        if (m.keys[pos - 1] == key) {
          float* acc = &m.grads[(pos - 1) * dim_];
          for (uint64_t c = 0; c < dim_; ++c) acc[c] += g[c];
          m.show_click[2 * (pos - 1)] += p->show(i);
          m.show_click[2 * (pos - 1) + 1] += p->click(i);
          ++m.npush[pos - 1];
          break;
        }
      }
    }
  }
  const float nw = static_cast<float>(workers_);
  for (float& g : m.grads) g /= nw;
  m.view_owned();
}

uint32_t SparseTable::create_row(ShardData& d, uint64_t key, uint64_t h) const {
  const uint32_t r = static_cast<uint32_t>(d.keys.size());
  d.keys.push_back(key);
  d.meta.emplace_back();
  d.data.resize(d.data.size() + stride_);
  float* row = &d.data[static_cast<size_t>(r) * stride_];
  init_.fill(key, row, dim_);
  rule_.init_row_state(row + dim_, dim_);
  d.index.insert(key, h, r);
  return r;
}

void SparseTable::remove_row(ShardData& d, size_t r) const {
  d.index.erase(d.keys[r], mix64(d.keys[r]));
  const size_t last = d.keys.size() - 1;
  if (r != last) {
    d.keys[r] = d.keys[last];
    d.meta[r] = d.meta[last];
    std::memcpy(&d.data[r * stride_], &d.data[last * stride_], stride_ * sizeof(float));
    *d.index.find_mut(d.keys[r], mix64(d.keys[r])) = static_cast<uint32_t>(r);
  }
  d.keys.pop_back();
  d.meta.pop_back();
  d.data.resize(last * stride_);
}

// A key without a row at a push: its row if admitted now, else kNone.
uint32_t SparseTable::admit(ShardData& d, uint64_t key, uint64_t h, uint32_t npush) const {
  if (!admitted_by_hash(desc_.seed, key, desc_.admit_probability)) return FlatMap::kNone;
  if (desc_.admit_count > 1) {
    uint32_t* c = d.pending.find_mut(key, h);
    const uint64_t count = (c ? *c : 0) + npush;
    if (count < desc_.admit_count) {
      if (c)
        *c = static_cast<uint32_t>(count);
      else
        d.pending.insert(key, h, static_cast<uint32_t>(count));
      return FlatMap::kNone;
    }
    if (c) d.pending.erase(key, h);
  }
  return create_row(d, key, h);
}

[[gnu::always_inline]] inline void SparseTable::apply_one(ShardData& d, uint32_t r, const Pushed& p, uint32_t i,
                                                          bool geo, Rule::AdamCache& adam) const {
  float* w = &d.data[static_cast<size_t>(r) * stride_];
  const float* g = p.g + i * dim_;
  RowMeta& m = d.meta[r];
  if (geo) {
    for (uint64_t c = 0; c < dim_; ++c) w[c] += g[c];
  } else {
    rule_.apply_row(w, w + dim_, m.t, g, dim_, adam);
  }
  m.show += p.show(i);
  m.click += p.click(i);
  m.unseen = 0;
  m.changed = kChanged;
}

// A push (its keys distinct) under every local shard's write lock, in the
// push's order, as the pull's three-stage pipeline: hash key i and prefetch
// its slot; find (or admit) key i - kAhead's row and prefetch it; apply the
// rule to key i - 2 kAhead's. No sort by shard, no scratch.
void SparseTable::apply_in_order(const Pushed& p) {
  std::unique_lock<std::shared_mutex> locks[kLockAllShards];
  for (uint32_t l = 0; l < nlocal_; ++l) locks[l] = std::unique_lock<std::shared_mutex>(shards_[l].mu);
  if (shard_mask_ && sh_.num_servers == 1)
    apply_rows<true>(p);
  else
    apply_rows<false>(p);
}

template <bool kMasked>
void SparseTable::apply_rows(const Pushed& p) {
  constexpr uint32_t kRing = 64;  // > 2 * kAhead, a power of two
  static_assert(kRing > 2 * kAhead && (kRing & (kRing - 1)) == 0);
  const uint64_t n = p.n, mask = shard_mask_;
  const bool geo = desc_.mode == DT_PS_MODE_GEO;
  Rule::AdamCache adam;
  uint32_t local[kRing], row[kRing];
  for (uint64_t i = 0; i < n + 2 * kAhead; ++i) {
    if (i < n) {
      const uint32_t l = kMasked ? static_cast<uint32_t>(p.h[i] & mask) : local_of_hash(p.h[i]);
      local[i % kRing] = l;
      __builtin_prefetch(shards_[l].d.index.probe_address(p.h[i]));
    }
    if (i >= kAhead && i - kAhead < n) {
      const uint64_t j = i - kAhead;
      ShardData& d = shards_[local[j % kRing]].d;
      uint32_t r = d.index.find(p.k[j], p.h[j]);
      if (r == FlatMap::kNone) r = admit(d, p.k[j], p.h[j], p.pushes(j));
      row[j % kRing] = r;
      if (r != FlatMap::kNone) {
        prefetch_row<1>(&d.data[static_cast<size_t>(r) * stride_], stride_);
        __builtin_prefetch(&d.meta[r], 1);
      }
      prefetch_row<0>(p.g + j * dim_, dim_);
    }
    if (i >= 2 * kAhead) {
      const uint64_t j = i - 2 * kAhead;
      const uint32_t r = row[j % kRing];
      if (r != FlatMap::kNone) apply_one(shards_[local[j % kRing]].d, r, p, static_cast<uint32_t>(j), geo, adam);
    }
  }
}

// Applies one push (async/GEO) or one merged sync step. A sync step runs
// under the step's own lock, so it takes the shards' locks one at a time
// (lock_all false): ThreadSanitizer's deadlock detector tracks at most 64
// locks held by one thread, the default shard count.
void SparseTable::apply(const Pushed& p, Scratch& s, bool lock_all) {
  if (lock_all && nlocal_ <= kLockAllShards) {
    apply_in_order(p);
    applied_.fetch_add(1);
    return;
  }
  const uint64_t n = p.n;
  bucket(p.h, n, s);
  s.rows.resize(n);
  const bool geo = desc_.mode == DT_PS_MODE_GEO;
  Rule::AdamCache adam;
  for (uint32_t l = 0; l < nlocal_; ++l) {
    const uint32_t b = s.start[l], e = s.start[l + 1];
    if (b == e) continue;
    std::unique_lock<std::shared_mutex> lk(shards_[l].mu);
    ShardData& d = shards_[l].d;
    // Pass 1: find or create (admission) the rows; kNone: nothing to apply.
    for (uint32_t k = b; k < e; ++k) {
      if (k + kAhead < e) __builtin_prefetch(d.index.probe_address(p.h[s.order[k + kAhead]]));
      const uint32_t i = s.order[k];
      const uint64_t key = p.k[i], h = p.h[i];
      uint32_t r = d.index.find(key, h);
      if (r == FlatMap::kNone) r = admit(d, key, h, p.pushes(i));
      s.rows[k] = r;
    }
    // Pass 2: the rule and the counters.
    for (uint32_t k = b; k < e; ++k) {
      if (k + kAhead < e) {
        const uint32_t ra = s.rows[k + kAhead];
        if (ra != FlatMap::kNone) {
          prefetch_row<1>(&d.data[static_cast<size_t>(ra) * stride_], stride_);
          __builtin_prefetch(&d.meta[ra], 1);
        }
        prefetch_row<0>(p.g + s.order[k + kAhead] * dim_, dim_);
      }
      const uint32_t i = s.order[k], r = s.rows[k];
      if (r != FlatMap::kNone) apply_one(d, r, p, i, geo, adam);
    }
  }
  applied_.fetch_add(1);
}

std::unique_ptr<Table> make_sparse_table(const sdk::TableDesc& desc, const Sharding& sharding, int server,
                                         int workers) {
  return std::make_unique<SparseTable>(desc, sharding, server, workers);
}

}  // namespace dtrain::ps_grpc
