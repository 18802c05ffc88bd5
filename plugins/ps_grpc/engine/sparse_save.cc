// The sparse table's save and load (file layouts: files.cc).

#include <cstring>

#include "engine/files.h"
#include "engine/sparse_table.h"

namespace dtrain::ps_grpc {

// Rows read from the part files that belong to this server.
struct SparseTable::Staged {
  std::vector<uint64_t> keys;
  std::vector<RowMeta> meta;
  std::vector<float> vals;   // dim per row
  std::vector<float> state;  // state_ per row (FULL only)
};

namespace {

constexpr size_t kRecordHead = 28;  // key, show, click, unseen_days, flags, t

uint64_t text_state_columns(int optimizer, uint64_t dim) {
  return optimizer == DT_PS_OPT_ADAGRAD ? 1 : optimizer == DT_PS_OPT_ADAM ? 1 + 2 * dim : 0;
}

}  // namespace

std::vector<std::string> SparseTable::save(const std::string& dir, const std::string& generation, int mode,
                                           int format) {
  const std::string name = save_part_name(desc_.name, generation, server_, sh_.num_servers, mode, format);
  const bool full = mode == DT_PS_SAVE_FULL, delta = mode == DT_PS_SAVE_DELTA;
  const uint64_t st = full ? state_ : 0;
  try {
    AtomicWriter out(dir, name);
    PartHeader h = PartHeader::of(DT_PS_TABLE_SPARSE, desc_.optimizer, mode, server_, sh_.num_servers, st, dim_);
    char hb[PartHeader::kBytes];
    const bool binary = format == DT_PS_FORMAT_BINARY;
    if (binary) {
      h.encode(hb);
      out.write(hb, sizeof hb);
    }
    std::vector<char> rec(kRecordHead + 4 * (dim_ + st));
    std::string line;
    auto write_shard = [&](ShardData& d) {
      for (size_t r = 0; r < d.keys.size(); ++r) {
        RowMeta& m = d.meta[r];
        if (delta && m.changed == kClean) continue;
        const float* w = &d.data[r * stride_];
        const uint32_t changed = m.changed != kClean ? 1 : 0;
        if (binary) {
          char* p = rec.data();
          std::memcpy(p, &d.keys[r], 8);
          std::memcpy(p + 8, &m.show, 4);
          std::memcpy(p + 12, &m.click, 4);
          std::memcpy(p + 16, &m.unseen, 4);
          std::memcpy(p + 20, &changed, 4);
          const uint32_t t = full ? m.t : 0;
          std::memcpy(p + 24, &t, 4);
          std::memcpy(p + kRecordHead, w, 4 * (dim_ + st));
          out.write(rec.data(), rec.size());
        } else {
          line.clear();
          append_u64(line, d.keys[r]);
          for (uint64_t c = 0; c < dim_; ++c) {
            line += ' ';
            append_float(line, w[c]);
          }
          line += ' ';
          append_float(line, m.show);
          line += ' ';
          append_float(line, m.click);
          line += ' ';
          append_u64(line, m.unseen);
          line += changed ? " 1" : " 0";
          if (full && desc_.optimizer == DT_PS_OPT_ADAM) {
            line += ' ';
            append_u64(line, m.t);
          }
          for (uint64_t c = 0; c < st; ++c) {
            line += ' ';
            append_float(line, w[dim_ + c]);
          }
          line += '\n';
          out.write(line);
        }
        if (!full && m.changed != kClean) m.changed = kSaving;
        ++h.count;
      }
    };
    for (uint32_t l = 0; l < nlocal_; ++l) {
      if (full) {
        std::shared_lock<std::shared_mutex> lk(shards_[l].mu);
        write_shard(shards_[l].d);
      } else {
        std::unique_lock<std::shared_mutex> lk(shards_[l].mu);
        write_shard(shards_[l].d);
      }
    }
    if (binary) {
      h.encode(hb);
      out.overwrite(0, hb, sizeof hb);
      out.write(kPartEndMagic, 8);
    }
    out.commit();
  } catch (...) {
    if (!full) finish_marks(false);
    throw;
  }
  if (!full) finish_marks(true);
  return {name};
}

void SparseTable::finish_marks(bool saved) {
  for (uint32_t l = 0; l < nlocal_; ++l) {
    std::unique_lock<std::shared_mutex> lk(shards_[l].mu);
    for (RowMeta& m : shards_[l].d.meta)
      if (m.changed == kSaving) m.changed = saved ? kClean : kChanged;
  }
}

void SparseTable::read_part(const Manifest& m, const std::string& dir, const std::string& name, Staged& st) const {
  const std::string path = dir + "/" + name;
  const bool full = m.mode == DT_PS_SAVE_FULL;
  const uint64_t nstate = full ? state_ : 0;
  const uint32_t ns = static_cast<uint32_t>(sh_.num_servers), srv = static_cast<uint32_t>(server_);
  auto mine = [&](uint64_t key) { return shard_of_hash(mix64(key)) % ns == srv; };
  auto keep = [&](uint64_t key, const RowMeta& meta, const float* vals, const float* state) {
    st.keys.push_back(key);
    st.meta.push_back(meta);
    st.vals.insert(st.vals.end(), vals, vals + dim_);
    st.state.insert(st.state.end(), state, state + nstate);
  };
  FileReader r(path);
  if (m.format == DT_PS_FORMAT_BINARY) {
    const uint64_t rec = kRecordHead + 4 * (dim_ + nstate);
    const PartHeader h =
        read_part_header(r, m, static_cast<uint32_t>(nstate),
                         std::to_string(nstate) + " floats per row for a " + save_mode_name(m.mode) + " save of " +
                             optimizer_name(desc_.optimizer) + " rows of dim " + std::to_string(dim_),
                         rec, "rows of " + std::to_string(rec) + " bytes");
    constexpr uint64_t kChunk = 4096;
    std::vector<char> buf;
    std::vector<float> vals(dim_ + nstate);
    for (uint64_t done = 0; done < h.count;) {
      const uint64_t k = std::min(kChunk, h.count - done);
      buf.resize(k * rec);
      r.read(buf.data(), buf.size());
      for (uint64_t j = 0; j < k; ++j) {
        const char* p = buf.data() + j * rec;
        uint64_t key;
        std::memcpy(&key, p, 8);
        if (!mine(key)) continue;
        RowMeta meta;
        uint32_t flags;
        std::memcpy(&meta.show, p + 8, 4);
        std::memcpy(&meta.click, p + 12, 4);
        std::memcpy(&meta.unseen, p + 16, 4);
        std::memcpy(&flags, p + 20, 4);
        std::memcpy(&meta.t, p + 24, 4);
        meta.changed = (flags & 1) ? kChanged : kClean;
        std::memcpy(vals.data(), p + kRecordHead, 4 * (dim_ + nstate));
        keep(key, meta, vals.data(), vals.data() + dim_);
      }
      done += k;
    }
    char end[8];
    r.read(end, 8);
    if (std::memcmp(end, kPartEndMagic, 8) != 0) fail_file(path, "bad end marker (the file is damaged)");
    return;
  }
  const bool adam = full && desc_.optimizer == DT_PS_OPT_ADAM;
  const uint64_t cols = 1 + dim_ + 4 + (full ? text_state_columns(desc_.optimizer, dim_) : 0);
  std::vector<std::string_view> f;
  std::vector<float> vals(dim_ + nstate);
  std::string_view line;
  while (r.getline(line)) {
    split_fields(line, f);
    if (f.empty()) continue;
    auto bad = [&](const std::string& what) { fail_file(path + " line " + std::to_string(r.line()), what); };
    if (f.size() != cols)
      bad("expected " + std::to_string(cols) + " columns (key, " + std::to_string(dim_) +
          " values, show, click, unseen_days, changed" +
          (full && desc_.optimizer != DT_PS_OPT_SGD ? std::string(", ") + optimizer_name(desc_.optimizer) + " state"
                                                    : "") +
          "), found " + std::to_string(f.size()));
    uint64_t key = 0, unseen = 0, changed = 0, t = 0;
    if (!parse_u64(f[0], &key)) bad("key '" + std::string(f[0]) + "' is not a u64");
    auto flt = [&](size_t c, float* out) {
      if (!parse_float(f[c], out))
        bad("column " + std::to_string(c + 1) + " '" + std::string(f[c]) + "' is not a number");
    };
    for (uint64_t c = 0; c < dim_; ++c) flt(1 + c, &vals[c]);
    RowMeta meta;
    flt(1 + dim_, &meta.show);
    flt(2 + dim_, &meta.click);
    if (!parse_u64(f[3 + dim_], &unseen) || unseen > 0xffffffffu) bad("unseen_days '" + std::string(f[3 + dim_]) + "'");
    if (!parse_u64(f[4 + dim_], &changed) || changed > 1)
      bad("changed '" + std::string(f[4 + dim_]) + "' is not 0 or 1");
    size_t c = 5 + dim_;
    if (adam) {
      if (!parse_u64(f[c], &t) || t > 0xffffffffu) bad("adam t '" + std::string(f[c]) + "' is not a count");
      ++c;
    }
    for (uint64_t j = 0; j < nstate; ++j) flt(c + j, &vals[dim_ + j]);
    if (!mine(key)) continue;
    meta.unseen = static_cast<uint32_t>(unseen);
    meta.t = static_cast<uint32_t>(t);
    meta.changed = changed ? kChanged : kClean;
    keep(key, meta, vals.data(), vals.data() + dim_);
  }
}

void SparseTable::load(const std::string& dir) {
  const Manifest m = Manifest::read(dir);
  const std::string mpath = dir + "/MANIFEST", t = "table '" + desc_.name + "'";
  if (m.kind != DT_PS_TABLE_SPARSE)
    sdk::fail(DT_ERR_INVALID_USAGE, mpath + ": kind is " + kind_name(m.kind) + ", " + t + " is sparse");
  if (m.dim != dim_)
    sdk::fail(DT_ERR_INVALID_USAGE,
              mpath + ": dim is " + std::to_string(m.dim) + ", " + t + " has dim " + std::to_string(dim_));
  const bool full = m.mode == DT_PS_SAVE_FULL;
  if (full && m.optimizer != desc_.optimizer)
    sdk::fail(DT_ERR_INVALID_USAGE, mpath + ": optimizer is " + optimizer_name(m.optimizer) + ", " + t + " uses " +
                                        optimizer_name(desc_.optimizer) +
                                        " (a full save's optimizer state loads only onto the same rule)");
  Staged st;
  for (const auto& name : m.files) read_part(m, dir, name, st);

  const size_t n = st.keys.size();
  auto put = [&](ShardData& d, size_t j, uint64_t h, bool replace) {
    uint32_t r = d.index.find(st.keys[j], h);
    const bool fresh = r == FlatMap::kNone;
    if (fresh) {
      if (d.pending.size()) d.pending.erase(st.keys[j], h);
      r = static_cast<uint32_t>(d.keys.size());
      d.keys.push_back(st.keys[j]);
      d.meta.emplace_back();
      d.data.resize(d.data.size() + stride_);
      d.index.insert(st.keys[j], h, r);
    }
    float* w = &d.data[static_cast<size_t>(r) * stride_];
    std::memcpy(w, &st.vals[j * dim_], dim_ * sizeof(float));
    RowMeta& meta = d.meta[r];
    if (full) {
      if (state_) std::memcpy(w + dim_, &st.state[j * state_], state_ * sizeof(float));
      meta = st.meta[j];
      return;
    }
    if (fresh || replace) {
      rule_.init_row_state(w + dim_, dim_);
      meta.t = 0;
    }
    meta.show = st.meta[j].show;
    meta.click = st.meta[j].click;
    meta.unseen = st.meta[j].unseen;
    meta.changed = kClean;
  };

  if (m.mode == DT_PS_SAVE_DELTA) {
    std::vector<std::vector<uint32_t>> by_shard(nlocal_);
    for (size_t j = 0; j < n; ++j) by_shard[local_of_hash(mix64(st.keys[j]))].push_back(static_cast<uint32_t>(j));
    for (uint32_t l = 0; l < nlocal_; ++l) {
      if (by_shard[l].empty()) continue;
      std::unique_lock<std::shared_mutex> lk(shards_[l].mu);
      for (uint32_t j : by_shard[l]) put(shards_[l].d, j, mix64(st.keys[j]), false);
    }
    return;
  }
  std::vector<ShardData> fresh(nlocal_);
  for (size_t j = 0; j < n; ++j) {
    const uint64_t h = mix64(st.keys[j]);
    put(fresh[local_of_hash(h)], j, h, true);
  }
  for (uint32_t l = 0; l < nlocal_; ++l) {
    std::unique_lock<std::shared_mutex> lk(shards_[l].mu);
    std::swap(shards_[l].d, fresh[l]);
  }
}

}  // namespace dtrain::ps_grpc
