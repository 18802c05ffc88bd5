// GEO mode on the worker (Paddle's GeoCommunicator): a local copy trained
// with plain SGD; every k steps the deltas (latest - old) / num_workers go to
// the servers, which add them, and the rows come back merged.
#include <unordered_map>
#include <unordered_set>

#include "dtrain/error.h"
#include "ps/ps_internal.h"

namespace dtrain::ps {

namespace {

void check_geo(Mode mode, const std::string& table, int num_workers, int k_steps, const char* cls) {
  if (mode != Mode::Geo)
    throw InvalidUsage(std::string(cls) + ": table '" + table + "' belongs to a job in " + to_string(mode) +
                       " mode; GEO needs [strategy] a_sync = true and a_sync_configs.k_steps > 0");
  if (num_workers < 1) throw InvalidUsage(std::string(cls) + ": num_workers must be >= 1");
  if (k_steps < 1) throw InvalidUsage(std::string(cls) + ": k_steps must be >= 1, got " + std::to_string(k_steps));
}

}  // namespace

struct GeoSparseTable::Impl {
  SparseTable table;
  int num_workers;
  int k_steps;
  uint64_t dim;
  float lr;
  int64_t steps = 0;
  struct Row {
    std::vector<float> latest, old;
  };
  std::unordered_map<uint64_t, Row> rows;
  std::vector<uint64_t> touched;  // in first-touch order
  std::unordered_set<uint64_t> touched_set;

  Impl(SparseTable t, int w, int k) : table(std::move(t)), num_workers(w), k_steps(k) {
    dim = table.dim();
    lr = static_cast<float>(table.config().learning_rate);
  }

  // Pulls the keys that are not local yet.
  void fetch(const uint64_t* keys, size_t n) {
    std::vector<uint64_t> missing;
    std::unordered_set<uint64_t> seen;
    for (size_t i = 0; i < n; ++i)
      if (!rows.count(keys[i]) && seen.insert(keys[i]).second) missing.push_back(keys[i]);
    if (missing.empty()) return;
    std::vector<float> values(missing.size() * dim);
    table.pull(missing.data(), missing.size(), Buffer(values.data(), values.size(), DType::F32))->wait();
    for (size_t i = 0; i < missing.size(); ++i) {
      Row& r = rows[missing[i]];
      r.latest.assign(values.begin() + i * dim, values.begin() + (i + 1) * dim);
      r.old = r.latest;
    }
  }

  void sync() {
    if (touched.empty()) return;
    size_t n = touched.size();
    std::vector<float> deltas(n * dim);
    const float workers = static_cast<float>(num_workers);
    for (size_t i = 0; i < n; ++i) {
      Row& r = rows[touched[i]];
      for (uint64_t j = 0; j < dim; ++j) {
        float d = (r.latest[j] - r.old[j]) / workers;
        deltas[i * dim + j] = d;
        r.old[j] += d;
      }
    }
    table.push(touched.data(), n, Buffer(deltas.data(), deltas.size(), DType::F32))->wait();
    std::vector<float> server(n * dim);
    table.pull(touched.data(), n, Buffer(server.data(), server.size(), DType::F32))->wait();
    for (size_t i = 0; i < n; ++i) {
      Row& r = rows[touched[i]];
      for (uint64_t j = 0; j < dim; ++j) {
        float sv = server[i * dim + j];
        r.latest[j] += sv - r.old[j];
        r.old[j] = sv;
      }
    }
    touched.clear();
    touched_set.clear();
  }
};

GeoSparseTable::GeoSparseTable(SparseTable table, int num_workers, int k_steps) {
  check_geo(table.mode(), table.name(), num_workers, k_steps, "GeoSparseTable");
  impl_ = std::make_shared<Impl>(std::move(table), num_workers, k_steps);
}

void GeoSparseTable::lookup(const uint64_t* keys, size_t n, float* out) {
  auto& im = *impl_;
  if (n > 0 && (!keys || !out)) throw InvalidUsage("GeoSparseTable::lookup: null keys or output");
  im.fetch(keys, n);
  for (size_t i = 0; i < n; ++i) {
    const auto& r = im.rows[keys[i]];
    std::copy(r.latest.begin(), r.latest.end(), out + i * im.dim);
  }
}

void GeoSparseTable::apply(const uint64_t* keys, size_t n, const float* grads) {
  auto& im = *impl_;
  if (n > 0 && (!keys || !grads)) throw InvalidUsage("GeoSparseTable::apply: null keys or gradients");
  im.fetch(keys, n);
  for (size_t i = 0; i < n; ++i) {
    auto& r = im.rows[keys[i]];
    for (uint64_t j = 0; j < im.dim; ++j) r.latest[j] -= im.lr * grads[i * im.dim + j];
    if (im.touched_set.insert(keys[i]).second) im.touched.push_back(keys[i]);
  }
}

void GeoSparseTable::step() {
  auto& im = *impl_;
  if (++im.steps % im.k_steps == 0) im.sync();
}

struct GeoDenseTable::Impl {
  DenseTable table;
  int num_workers;
  int k_steps;
  int64_t steps = 0;
  std::vector<float> latest, old;

  Impl(DenseTable t, int w, int k) : table(std::move(t)), num_workers(w), k_steps(k) {
    latest.resize(table.dim());
    table.pull(Buffer(latest.data(), latest.size(), DType::F32))->wait();
    old = latest;
  }

  void sync() {
    std::vector<float> delta(latest.size());
    const float workers = static_cast<float>(num_workers);
    for (size_t j = 0; j < latest.size(); ++j) {
      delta[j] = (latest[j] - old[j]) / workers;
      old[j] += delta[j];
    }
    table.push(Buffer(delta.data(), delta.size(), DType::F32))->wait();
    std::vector<float> server(latest.size());
    table.pull(Buffer(server.data(), server.size(), DType::F32))->wait();
    for (size_t j = 0; j < latest.size(); ++j) {
      latest[j] += server[j] - old[j];
      old[j] = server[j];
    }
  }
};

GeoDenseTable::GeoDenseTable(DenseTable table, int num_workers, int k_steps) {
  check_geo(table.mode(), table.name(), num_workers, k_steps, "GeoDenseTable");
  impl_ = std::make_shared<Impl>(std::move(table), num_workers, k_steps);
}

float* GeoDenseTable::values() { return impl_->latest.data(); }

void GeoDenseTable::step() {
  auto& im = *impl_;
  if (++im.steps % im.k_steps == 0) im.sync();
}

}  // namespace dtrain::ps
