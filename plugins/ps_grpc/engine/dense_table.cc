// A dense table's part on one server: values [begin, end) of the flat
// vector, their optimizer state, the table's Adam step count. A
// reader-writer lock for the table (whole pushes, loads: exclusive) and one
// per stripe of 65,536 values: the ranges of a push (ASYNC, GEO) are applied
// under the table's lock shared and their stripes' exclusive, so a push's
// parts (calls running side by side) apply at once, not one block at a time.
// A dense table has no per-row changed marks: BASE and DELTA saves write
// every value (without state). Loading FULL restores the state and t; BASE
// resets them to a fresh table's; DELTA keeps them. File layouts: files.cc.

#include <algorithm>
#include <memory>
#include <shared_mutex>
#include <thread>

#include "engine/factories.h"
#include "engine/files.h"
#include "engine/init.h"
#include "engine/rules.h"
#include "engine/sync_steps.h"

namespace dtrain::ps_grpc {
namespace {

class DenseTable final : public Table {
 public:
  DenseTable(const sdk::TableDesc& desc, const Sharding& sh, int server, int workers)
      : Table(desc),
        sh_(sh),
        server_(server),
        workers_(workers),
        begin_(sh.dense_begin(desc.dim, server)),
        n_(sh.dense_end(desc.dim, server) - begin_),
        rule_(desc),
        sync_(workers),
        num_stripes_((n_ + kStripe - 1) / kStripe),
        stripes_(new std::shared_mutex[num_stripes_]) {
    w_.resize(n_);
    const Initializer init(desc.initializer, desc.init_a, desc.init_b, desc.seed);
    for (uint64_t i = 0; i < n_; ++i) w_[i] = init.dense_value(begin_ + i);
    reset_state();
  }

  void pull_dense(int worker, float* out, uint64_t count, Clock::time_point deadline) override {
    check_worker(desc_.name, worker, workers_);
    check_count("pull", count);
    if (desc_.mode == DT_PS_MODE_SYNC) sync_.wait(worker, deadline, desc_.name);
    std::shared_lock<std::shared_mutex> lk(mu_);
    for (uint64_t s = 0; s < num_stripes_; ++s) {
      std::shared_lock<std::shared_mutex> stripe(stripes_[s]);
      const uint64_t b = s * kStripe, e = std::min(n_, b + kStripe);
      std::copy(w_.begin() + static_cast<ptrdiff_t>(b), w_.begin() + static_cast<ptrdiff_t>(e), out + b);
    }
  }

  void push_dense(int worker, const float* g, uint64_t count) override {
    check_worker(desc_.name, worker, workers_);
    check_count("push", count);
    if (desc_.mode == DT_PS_MODE_SYNC) {
      sync_.push(worker, std::vector<float>(g, g + count),
                 [&](const std::vector<const std::vector<float>*>& by_worker) {
                   std::vector<float> sum(*by_worker[0]);
                   for (size_t w = 1; w < by_worker.size(); ++w) {
                     const float* x = by_worker[w]->data();
                     for (uint64_t i = 0; i < n_; ++i) sum[i] += x[i];
                   }
                   const float nw = static_cast<float>(workers_);
                   for (uint64_t i = 0; i < n_; ++i) sum[i] /= nw;
                   apply(sum.data());
                 });
      return;
    }
    apply(g);
  }

  uint64_t begin_dense_push(int worker) override {
    check_worker(desc_.name, worker, workers_);
    if (desc_.mode == DT_PS_MODE_SYNC) return Table::begin_dense_push(worker);
    std::unique_lock<std::shared_mutex> lk(mu_);
    const uint64_t step = t_;
    if (desc_.mode != DT_PS_MODE_GEO && rule_.kind() == DT_PS_OPT_ADAM) ++t_;  // as apply_dense counts it
    return step;
  }

  void push_dense_range(uint64_t step, uint64_t offset, const float* g, uint64_t len) override {
    if (desc_.mode == DT_PS_MODE_SYNC) Table::begin_dense_push(0);
    if (offset > n_ || len > n_ - offset)
      sdk::fail(DT_ERR_INVALID_USAGE, "table '" + desc_.name + "': a dense push range [" + std::to_string(offset) +
                                          ", +" + std::to_string(len) + ") is outside server " +
                                          std::to_string(server_) + "'s " + std::to_string(n_) + " values");
    if (len == 0) return;
    std::shared_lock<std::shared_mutex> lk(mu_);
    const uint64_t first = offset / kStripe, last = (offset + len - 1) / kStripe;
    for (uint64_t s = first; s <= last; ++s) stripes_[s].lock();
    uint64_t t = step;
    apply_range(offset, offset + len, g, t);
    for (uint64_t s = first; s <= last; ++s) stripes_[s].unlock();
  }

  void end_dense_push() override { applied_.fetch_add(1); }

  void pull_sparse(int, const uint64_t*, uint64_t, float*, Clock::time_point) override { sparse_op("pull"); }
  void push_sparse(int, const uint64_t*, uint64_t, const float*, const float*) override { sparse_op("push"); }
  uint64_t shrink(uint32_t) override {
    sdk::fail(DT_ERR_INVALID_USAGE, "table '" + desc_.name + "' is dense; shrink applies to sparse tables");
  }

  std::vector<std::string> save(const std::string& dir, const std::string& generation, int mode, int format) override;
  void load(const std::string& dir) override;

  TableStats stats() const override {
    TableStats s;
    s.rows = n_;
    s.applied_steps = applied_.load();
    return s;
  }

 private:
  void check_count(const char* op, uint64_t count) const {
    if (count != n_)
      sdk::fail(DT_ERR_INVALID_USAGE, "table '" + desc_.name + "': dense " + op + " of " + std::to_string(count) +
                                          " values, but server " + std::to_string(server_) + " holds " +
                                          std::to_string(n_) + " (values [" + std::to_string(begin_) + ", " +
                                          std::to_string(begin_ + n_) + ") of dim " + std::to_string(desc_.dim) + ")");
  }
  [[noreturn]] void sparse_op(const char* op) const {
    sdk::fail(DT_ERR_INVALID_USAGE, "table '" + desc_.name + "' is dense; sparse " + op + " refused");
  }
  void apply(const float* g) {
    std::unique_lock<std::shared_mutex> lk(mu_);
    // The rules are element-wise: a large range is applied in two halves on
    // two threads (the same values as one pass; the step counter once).
    const uint64_t half = n_ >= kSplitApply ? n_ / 2 : n_;
    uint64_t t_second = t_;
    std::thread second;
    if (half < n_) second = std::thread([&] { apply_range(half, n_, g + half, t_second); });
    apply_range(0, half, g, t_);
    if (second.joinable()) second.join();
    applied_.fetch_add(1);
  }
  // Values [b, e) with gradients g[0, e - b).
  void apply_range(uint64_t b, uint64_t e, const float* g, uint64_t& t) {
    if (desc_.mode == DT_PS_MODE_GEO) {
      for (uint64_t i = b; i < e; ++i) w_[i] += g[i - b];
      return;
    }
    float* s0 = s0_.empty() ? nullptr : s0_.data() + b;
    float* s1 = s1_.empty() ? nullptr : s1_.data() + b;
    rule_.apply_dense(w_.data() + b, s0, s1, t, g, e - b);
  }
  static constexpr uint64_t kSplitApply = uint64_t{1} << 20;  // values (4 MiB)
  static constexpr uint64_t kStripe = uint64_t{1} << 16;      // values
  // Readers that need every value consistent (save) hold all stripes shared.
  struct AllStripes {
    explicit AllStripes(const DenseTable& t) : t_(t) {
      for (uint64_t s = 0; s < t_.num_stripes_; ++s) t_.stripes_[s].lock_shared();
    }
    ~AllStripes() {
      for (uint64_t s = 0; s < t_.num_stripes_; ++s) t_.stripes_[s].unlock_shared();
    }
    const DenseTable& t_;
  };
  void reset_state() {
    const int arrays = rule_.dense_state_arrays();
    s0_.assign(arrays >= 1 ? n_ : 0, rule_.kind() == DT_PS_OPT_ADAGRAD ? rule_.g2_init() : 0.0f);
    s1_.assign(arrays >= 2 ? n_ : 0, 0.0f);
    t_ = 0;
  }

  Sharding sh_;
  int server_, workers_;
  uint64_t begin_, n_;
  Rule rule_;
  mutable std::shared_mutex mu_;  // lock order: mu_, then stripes in increasing order
  std::vector<float> w_, s0_, s1_;
  uint64_t t_ = 0;
  std::atomic<uint64_t> applied_{0};
  SyncSteps<std::vector<float>> sync_;
  const uint64_t num_stripes_;
  const std::unique_ptr<std::shared_mutex[]> stripes_;
};

std::vector<std::string> DenseTable::save(const std::string& dir, const std::string& generation, int mode, int format) {
  const std::string name = save_part_name(desc_.name, generation, server_, sh_.num_servers, mode, format);
  AtomicWriter out(dir, name);
  const bool full = mode == DT_PS_SAVE_FULL;
  const int arrays = full ? rule_.dense_state_arrays() : 0;
  std::shared_lock<std::shared_mutex> lk(mu_);
  AllStripes stripes(*this);
  if (format == DT_PS_FORMAT_BINARY) {
    PartHeader h = PartHeader::of(DT_PS_TABLE_DENSE, desc_.optimizer, mode, server_, sh_.num_servers,
                                  static_cast<uint64_t>(arrays), desc_.dim);
    h.count = n_;
    h.dense_begin = begin_;
    h.table_t = full ? t_ : 0;
    char hb[PartHeader::kBytes];
    h.encode(hb);
    out.write(hb, sizeof hb);
    out.write(w_.data(), n_ * 4);
    if (arrays >= 1) out.write(s0_.data(), n_ * 4);
    if (arrays >= 2) out.write(s1_.data(), n_ * 4);
    out.write(kPartEndMagic, 8);
  } else {
    std::string line;
    for (uint64_t i = 0; i < n_; ++i) {
      line.clear();
      append_float(line, w_[i]);
      if (arrays >= 1) {
        line += ' ';
        append_float(line, s0_[i]);
      }
      if (arrays >= 2) {
        line += ' ';
        append_float(line, s1_[i]);
        line += ' ';
        append_u64(line, t_);
      }
      line += '\n';
      out.write(line);
    }
  }
  lk.unlock();
  out.commit();
  return {name};
}

void DenseTable::load(const std::string& dir) {
  const Manifest m = Manifest::read(dir);
  const std::string mpath = dir + "/MANIFEST";
  const std::string t = "table '" + desc_.name + "'";
  if (m.kind != DT_PS_TABLE_DENSE)
    sdk::fail(DT_ERR_INVALID_USAGE, mpath + ": kind is " + kind_name(m.kind) + ", " + t + " is dense");
  if (m.dim != desc_.dim)
    sdk::fail(DT_ERR_INVALID_USAGE,
              mpath + ": dim is " + std::to_string(m.dim) + ", " + t + " has dim " + std::to_string(desc_.dim));
  const bool full = m.mode == DT_PS_SAVE_FULL;
  if (full && m.optimizer != desc_.optimizer)
    sdk::fail(DT_ERR_INVALID_USAGE, mpath + ": optimizer is " + optimizer_name(m.optimizer) + ", " + t + " uses " +
                                        optimizer_name(desc_.optimizer) +
                                        " (a full save's optimizer state loads only onto the same rule)");
  const int arrays = full ? rule_.dense_state_arrays() : 0;
  std::vector<float> w(n_), s0(arrays >= 1 ? n_ : 0), s1(arrays >= 2 ? n_ : 0);
  uint64_t covered = 0, table_t = 0;
  std::vector<float> buf;
  std::vector<std::string_view> f;
  for (const auto& name : m.files) {
    const std::string path = dir + "/" + name;
    FileReader r(path);
    uint64_t pbegin = 0, pcount = 0;
    // The part's values in buf: pcount values, then arrays * pcount state.
    if (m.format == DT_PS_FORMAT_BINARY) {
      const PartHeader h = read_part_header(r, m, static_cast<uint32_t>(arrays),
                                            std::to_string(arrays) + " state arrays for a " + save_mode_name(m.mode) +
                                                " save of " + optimizer_name(m.optimizer),
                                            4 * (1 + uint64_t(arrays)), "values");
      if (h.dense_begin + h.count > m.dim)
        fail_file(path, "values [" + std::to_string(h.dense_begin) + ", " + std::to_string(h.dense_begin + h.count) +
                            ") lie outside dim " + std::to_string(m.dim));
      pbegin = h.dense_begin;
      pcount = h.count;
      buf.resize(pcount * (1 + h.state));
      r.read(buf.data(), buf.size() * 4);
      char end[8];
      r.read(end, 8);
      if (std::memcmp(end, kPartEndMagic, 8) != 0) fail_file(path, "bad end marker");
      table_t = std::max(table_t, h.table_t);
    } else {
      int server = 0, servers = 0;
      if (!parse_part_file_name(name, &server, &servers))
        fail_file(path, "the name does not say which part it is (part-<generation>-<server>-of-<S>.txt)");
      const Sharding sh{servers, 1};
      pbegin = sh.dense_begin(m.dim, server);
      pcount = sh.dense_end(m.dim, server) - pbegin;
      buf.assign(pcount * (1 + arrays), 0.0f);
      const size_t cols = 1 + (arrays == 2 ? 3 : arrays);
      std::string_view line;
      uint64_t i = 0;
      while (r.getline(line)) {
        split_fields(line, f);
        if (f.empty()) continue;
        const std::string where = path + " line " + std::to_string(r.line());
        if (i == pcount) fail_file(where, "more than the " + std::to_string(pcount) + " values of this part");
        if (f.size() != cols)
          fail_file(where, "expected " + std::to_string(cols) + " columns, found " + std::to_string(f.size()));
        for (size_t c = 0; c < 1 + static_cast<size_t>(arrays); ++c)
          if (!parse_float(f[c], &buf[c * pcount + i]))
            fail_file(where, "column " + std::to_string(c + 1) + " '" + std::string(f[c]) + "' is not a number");
        if (arrays == 2) {
          uint64_t tt = 0;
          if (!parse_u64(f[3], &tt)) fail_file(where, "column 4 (adam t) '" + std::string(f[3]) + "' is not a count");
          table_t = std::max(table_t, tt);
        }
        ++i;
      }
      if (i != pcount)
        fail_file(path, "truncated: " + std::to_string(i) + " values, this part holds " + std::to_string(pcount));
    }
    // The overlap of [pbegin, pbegin + pcount) with this server's range.
    const uint64_t lo = std::max(pbegin, begin_), hi = std::min(pbegin + pcount, begin_ + n_);
    if (lo >= hi) continue;
    const uint64_t k = hi - lo, src = lo - pbegin, dst = lo - begin_;
    std::copy_n(buf.begin() + static_cast<ptrdiff_t>(src), k, w.begin() + static_cast<ptrdiff_t>(dst));
    if (arrays >= 1)
      std::copy_n(buf.begin() + static_cast<ptrdiff_t>(pcount + src), k, s0.begin() + static_cast<ptrdiff_t>(dst));
    if (arrays >= 2)
      std::copy_n(buf.begin() + static_cast<ptrdiff_t>(2 * pcount + src), k, s1.begin() + static_cast<ptrdiff_t>(dst));
    covered += k;
  }
  if (covered != n_)
    sdk::fail(DT_ERR_SYSTEM, mpath + ": the parts it lists cover " + std::to_string(covered) + " of the " +
                                 std::to_string(n_) + " values server " + std::to_string(server_) + " holds of " + t);
  std::unique_lock<std::shared_mutex> lk(mu_);
  w_.swap(w);
  if (full) {
    s0_.swap(s0);
    s1_.swap(s1);
    t_ = table_t;
  } else if (m.mode == DT_PS_SAVE_BASE) {
    reset_state();
  }
}

}  // namespace

std::unique_ptr<Table> make_dense_table(const sdk::TableDesc& desc, const Sharding& sharding, int server, int workers) {
  return std::make_unique<DenseTable>(desc, sharding, server, workers);
}

}  // namespace dtrain::ps_grpc
