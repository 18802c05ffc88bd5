// The sparse table's pull, push and shrink paths (layout: sparse_table.h).

#include "sparse_table.h"

#include <cstring>

namespace dtrain::ps_grpc {
namespace {
thread_local Scratch tls;
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
}

void SparseTable::pull_sparse(int worker, const uint64_t* keys, uint64_t n, float* out,
                              Clock::time_point deadline) {
  check_worker(desc_.name, worker, workers_);
  Scratch& s = tls;
  hash_and_check(keys, n, s);
  if (desc_.mode == DT_PS_MODE_SYNC) sync_.wait(worker, deadline, desc_.name);
  bucket(s.hash.data(), n, s);
  for (uint32_t l = 0; l < nlocal_; ++l) {
    const uint32_t b = s.start[l], e = s.start[l + 1];
    if (b == e) continue;
    const Shard& sh = shards_[l];
    std::shared_lock<std::shared_mutex> lk(sh.mu);
    const ShardData& d = sh.d;
    for (uint32_t k = b; k < e; ++k) {
      if (k + 8 < e) __builtin_prefetch(d.index.probe_address(s.hash[s.order[k + 8]]));
      const uint32_t i = s.order[k];
      float* dst = out + i * dim_;
      const uint32_t r = d.index.find(keys[i], s.hash[i]);
      if (r != FlatMap::kNone) std::memcpy(dst, &d.data[r * stride_], dim_ * sizeof(float));
      else init_.fill(keys[i], dst, dim_);
    }
  }
}

void SparseTable::push_sparse(int worker, const uint64_t* keys, uint64_t n, const float* grads,
                              const float* show_click) {
  check_worker(desc_.name, worker, workers_);
  Scratch& s = tls;
  hash_and_check(keys, n, s);
  if (desc_.mode != DT_PS_MODE_SYNC) {
    dedupe(keys, n, grads, show_click, s, s.pushed);
    apply(s.pushed, s);
    return;
  }
  Pushed step;
  dedupe(keys, n, grads, show_click, s, step);
  sync_.push(worker, std::move(step), [&](const std::vector<const Pushed*>& by_worker) {
    merge(by_worker, s);
    apply(s.merged, s);
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
    const uint32_t shard = shard_of_hash(h);
    if (shard % ns != srv)
      sdk::fail(DT_ERR_INVALID_USAGE, "table '" + desc_.name + "': key " + std::to_string(keys[i]) + " (shard " +
                                          std::to_string(shard) + " of " + std::to_string(sh_.num_shards) +
                                          ") belongs to server " + std::to_string(shard % ns) + ", not to server " +
                                          std::to_string(server_));
  }
}

// Counting sort of n hashed keys by local shard: s.order[s.start[l] .. s.start[l+1]).
void SparseTable::bucket(const uint64_t* hashes, uint64_t n, Scratch& s) const {
  s.local.resize(n);
  s.start.assign(nlocal_ + 1, 0);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t l = local_of_hash(hashes[i]);
    s.local[i] = l;
    ++s.start[l + 1];
  }
  for (uint32_t l = 0; l < nlocal_; ++l) s.start[l + 1] += s.start[l];
  s.order.resize(n);
  // Fill using start[l] as a cursor, then shift back.
  for (uint64_t i = 0; i < n; ++i) s.order[s.start[s.local[i]]++] = static_cast<uint32_t>(i);
  for (uint32_t l = nlocal_; l > 0; --l) s.start[l] = s.start[l - 1];
  s.start[0] = 0;
}

// Repeated keys summed, in order of appearance (s.hash holds the hashes).
void SparseTable::dedupe(const uint64_t* keys, uint64_t n, const float* grads, const float* show_click,
                         Scratch& s, Pushed& p) const {
  p.keys.clear();
  p.hashes.clear();
  p.grads.clear();
  p.show_click.clear();
  p.npush.clear();
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  s.slots.assign(cap, 0);
  const size_t mask = cap - 1;
  p.grads.reserve(n * dim_);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t h = s.hash[i];
    size_t j = static_cast<size_t>((h >> 32) | (h << 32)) & mask;
    const float sh = show_click ? show_click[2 * i] : 1.0f, cl = show_click ? show_click[2 * i + 1] : 0.0f;
    const float* g = grads + i * dim_;
    for (;; j = (j + 1) & mask) {
      const uint32_t pos = s.slots[j];
      if (pos == 0) {
        s.slots[j] = static_cast<uint32_t>(p.keys.size() + 1);
        p.keys.push_back(keys[i]);
        p.hashes.push_back(h);
        p.grads.insert(p.grads.end(), g, g + dim_);
        p.show_click.push_back(sh);
        p.show_click.push_back(cl);
        p.npush.push_back(1);
        break;
      }
      if (p.keys[pos - 1] == keys[i]) {
        float* acc = &p.grads[(pos - 1) * dim_];
        for (uint64_t c = 0; c < dim_; ++c) acc[c] += g[c];
        p.show_click[2 * (pos - 1)] += sh;
        p.show_click[2 * (pos - 1) + 1] += cl;
        break;
      }
    }
  }
}

// A sync step: the workers' pushes summed per key in worker order, / num_workers.
void SparseTable::merge(const std::vector<const Pushed*>& by_worker, Scratch& s) const {
  Pushed& m = s.merged;
  m.keys.clear();
  m.hashes.clear();
  m.grads.clear();
  m.show_click.clear();
  m.npush.clear();
  size_t total = 0;
  for (const Pushed* p : by_worker) total += p->keys.size();
  size_t cap = 16;
  while (cap < 2 * total) cap *= 2;
  s.slots.assign(cap, 0);
  const size_t mask = cap - 1;
  for (const Pushed* p : by_worker) {
    for (size_t i = 0; i < p->keys.size(); ++i) {
      const uint64_t h = p->hashes[i], key = p->keys[i];
      const float* g = &p->grads[i * dim_];
      for (size_t j = static_cast<size_t>((h >> 32) | (h << 32)) & mask;; j = (j + 1) & mask) {
        const uint32_t pos = s.slots[j];
        if (pos == 0) {
          s.slots[j] = static_cast<uint32_t>(m.keys.size() + 1);
          m.keys.push_back(key);
          m.hashes.push_back(h);
          m.grads.insert(m.grads.end(), g, g + dim_);
          m.show_click.push_back(p->show_click[2 * i]);
          m.show_click.push_back(p->show_click[2 * i + 1]);
          m.npush.push_back(1);
          break;
        }
        if (m.keys[pos - 1] == key) {
          float* acc = &m.grads[(pos - 1) * dim_];
          for (uint64_t c = 0; c < dim_; ++c) acc[c] += g[c];
          m.show_click[2 * (pos - 1)] += p->show_click[2 * i];
          m.show_click[2 * (pos - 1) + 1] += p->show_click[2 * i + 1];
          ++m.npush[pos - 1];
          break;
        }
      }
    }
  }
  const float nw = static_cast<float>(workers_);
  for (float& g : m.grads) g /= nw;
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

// Applies one push (async/GEO) or one merged sync step.
void SparseTable::apply(const Pushed& p, Scratch& s) {
  const uint64_t n = p.keys.size();
  bucket(p.hashes.data(), n, s);
  const uint32_t admit_count = desc_.admit_count;
  const bool geo = desc_.mode == DT_PS_MODE_GEO;
  for (uint32_t l = 0; l < nlocal_; ++l) {
    const uint32_t b = s.start[l], e = s.start[l + 1];
    if (b == e) continue;
    std::unique_lock<std::shared_mutex> lk(shards_[l].mu);
    ShardData& d = shards_[l].d;
    for (uint32_t k = b; k < e; ++k) {
      if (k + 8 < e) __builtin_prefetch(d.index.probe_address(p.hashes[s.order[k + 8]]));
      const uint32_t i = s.order[k];
      const uint64_t key = p.keys[i], h = p.hashes[i];
      uint32_t r = d.index.find(key, h);
      if (r == FlatMap::kNone) {
        if (!admitted_by_hash(desc_.seed, key, desc_.admit_probability)) continue;
        if (admit_count > 1) {
          uint32_t* c = d.pending.find_mut(key, h);
          const uint64_t count = (c ? *c : 0) + p.npush[i];
          if (count < admit_count) {
            if (c) *c = static_cast<uint32_t>(count);
            else d.pending.insert(key, h, static_cast<uint32_t>(count));
            continue;
          }
          if (c) d.pending.erase(key, h);
        }
        r = create_row(d, key, h);
      }
      float* w = &d.data[static_cast<size_t>(r) * stride_];
      const float* g = &p.grads[i * dim_];
      RowMeta& m = d.meta[r];
      if (geo) {
        for (uint64_t c = 0; c < dim_; ++c) w[c] += g[c];
      } else {
        rule_.apply_row(w, w + dim_, m.t, g, dim_);
      }
      m.show += p.show_click[2 * i];
      m.click += p.show_click[2 * i + 1];
      m.unseen = 0;
      m.changed = kChanged;
    }
  }
  applied_.fetch_add(1);
}

std::unique_ptr<Table> make_sparse_table(const sdk::TableDesc& desc, const Sharding& sharding, int server,
                                         int workers) {
  return std::make_unique<SparseTable>(desc, sharding, server, workers);
}

}  // namespace dtrain::ps_grpc
