#pragma once
// What the table engine's tests (ps_table_*_test.cc) share: references of
// the initializers and rules written from backend_v1.h's formulas, a tiny
// in-process cluster of servers, descriptors, save dumps and error checks.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "dtrain/sdk/error.h"
#include "dtrain/sdk/random.h"
#include "engine/files.h"
#include "engine/table.h"

namespace dtrain::ps_grpc::table_test {

using sdk::TableDesc;

// ---- references, written from the ABI's comments and init.h's formulas ----

inline uint64_t ref_mix(uint64_t z) { return sdk::mix64(z); }
inline double ref_unit(uint64_t seed, uint64_t key, uint64_t j) {
  const uint64_t g = sdk::kSplitMix64Gamma;
  const uint64_t st = ref_mix(key ^ ref_mix(seed + g));
  return static_cast<double>(ref_mix(st + (j + 1) * g) >> 11) / 9007199254740992.0;
}
inline float ref_init(const TableDesc& d, uint64_t key, uint64_t j) {
  if (d.initializer == DT_PS_INIT_CONSTANT) return static_cast<float>(d.init_a);
  if (d.initializer == DT_PS_INIT_UNIFORM)
    return static_cast<float>(d.init_a + (d.init_b - d.init_a) * ref_unit(d.seed, key, j));
  const double u1 = ref_unit(d.seed, key, 2 * j), u2 = ref_unit(d.seed, key, 2 * j + 1);
  return static_cast<float>(d.init_a + d.init_b * std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2 * M_PI * u2));
}

// One row (or a dense vector with per-value "rows" of 1) under a rule.
struct RefRow {
  std::vector<float> w, m, v;
  float g2 = 0;
  std::vector<float> g2v;  // dense adagrad
  uint64_t t = 0;
};
inline void ref_step(const TableDesc& d, RefRow& r, const std::vector<float>& g, bool dense) {
  const float lr = static_cast<float>(d.learning_rate), eps = static_cast<float>(d.epsilon);
  const size_t n = r.w.size();
  if (d.optimizer == DT_PS_OPT_SGD) {
    for (size_t i = 0; i < n; ++i) r.w[i] = r.w[i] - lr * g[i];
  } else if (d.optimizer == DT_PS_OPT_ADAGRAD) {
    if (dense) {
      for (size_t i = 0; i < n; ++i) {
        r.g2v[i] = r.g2v[i] + g[i] * g[i];
        r.w[i] = r.w[i] - lr * g[i] / (std::sqrt(r.g2v[i]) + eps);
      }
    } else {
      float sum = 0;
      for (size_t i = 0; i < n; ++i) sum = sum + g[i] * g[i];
      r.g2 = r.g2 + sum / static_cast<float>(n);
      for (size_t i = 0; i < n; ++i) r.w[i] = r.w[i] - lr * g[i] / (std::sqrt(r.g2) + eps);
    }
  } else {
    const float b1 = static_cast<float>(d.beta1), b2 = static_cast<float>(d.beta2);
    r.t += 1;
    const float c1 = static_cast<float>(1.0 - std::pow(d.beta1, static_cast<double>(r.t)));
    const float c2 = static_cast<float>(1.0 - std::pow(d.beta2, static_cast<double>(r.t)));
    for (size_t i = 0; i < n; ++i) {
      r.m[i] = b1 * r.m[i] + (1.0f - b1) * g[i];
      r.v[i] = b2 * r.v[i] + (1.0f - b2) * g[i] * g[i];
      r.w[i] = r.w[i] - lr * (r.m[i] / c1) / (std::sqrt(r.v[i] / c2) + eps);
    }
  }
}
inline RefRow ref_new_row(const TableDesc& d, uint64_t key, size_t n, bool dense) {
  RefRow r;
  r.w.resize(n);
  for (size_t i = 0; i < n; ++i) r.w[i] = dense ? ref_init(d, i, 0) : ref_init(d, key, i);
  r.m.assign(n, 0);
  r.v.assign(n, 0);
  r.g2 = static_cast<float>(d.initial_g2sum);
  r.g2v.assign(n, static_cast<float>(d.initial_g2sum));
  return r;
}

// ---- a tiny in-process "client": routes keys and dense ranges over servers ----

struct Cluster {
  TableDesc desc;
  Sharding sh;
  std::vector<std::unique_ptr<Table>> servers;
  Cluster(const TableDesc& d, int num_servers, int workers, uint32_t shards = 16) : desc(d) {
    sh.num_servers = num_servers;
    sh.num_shards = shards;
    for (int s = 0; s < num_servers; ++s) servers.push_back(Table::create(d, sh, s, workers));
  }
  static Clock::time_point soon(int ms = 5000) { return Clock::now() + std::chrono::milliseconds(ms); }
  std::vector<float> pull(int worker, const std::vector<uint64_t>& keys, int ms = 5000) {
    const uint64_t dim = desc.dim;
    std::vector<float> out(keys.size() * dim);
    for (int s = 0; s < sh.num_servers; ++s) {
      std::vector<uint64_t> k;
      std::vector<size_t> at;
      for (size_t i = 0; i < keys.size(); ++i)
        if (sh.server_of(keys[i]) == s) k.push_back(keys[i]), at.push_back(i);
      std::vector<float> o(k.size() * dim);
      servers[s]->pull_sparse(worker, k.data(), k.size(), o.data(), soon(ms));
      for (size_t j = 0; j < at.size(); ++j) std::copy_n(&o[j * dim], dim, &out[at[j] * dim]);
    }
    return out;
  }
  // Every server gets a push (empty ones too), so sync steps line up.
  void push(int worker, const std::vector<uint64_t>& keys, const std::vector<float>& g,
            const std::vector<float>* show_click = nullptr) {
    const uint64_t dim = desc.dim;
    for (int s = 0; s < sh.num_servers; ++s) {
      std::vector<uint64_t> k;
      std::vector<float> gg, sc;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (sh.server_of(keys[i]) != s) continue;
        k.push_back(keys[i]);
        gg.insert(gg.end(), &g[i * dim], &g[i * dim] + dim);
        if (show_click) sc.insert(sc.end(), &(*show_click)[2 * i], &(*show_click)[2 * i] + 2);
      }
      servers[s]->push_sparse(worker, k.data(), k.size(), gg.data(), show_click ? sc.data() : nullptr);
    }
  }
  std::vector<float> pull_dense(int worker, int ms = 5000) {
    std::vector<float> out(desc.dim);
    for (int s = 0; s < sh.num_servers; ++s) {
      const uint64_t b = sh.dense_begin(desc.dim, s), e = sh.dense_end(desc.dim, s);
      servers[s]->pull_dense(worker, out.data() + b, e - b, soon(ms));
    }
    return out;
  }
  void push_dense(int worker, const std::vector<float>& g) {
    for (int s = 0; s < sh.num_servers; ++s) {
      const uint64_t b = sh.dense_begin(desc.dim, s), e = sh.dense_end(desc.dim, s);
      servers[s]->push_dense(worker, g.data() + b, e - b);
    }
  }
  uint64_t shrink(uint32_t flags) {
    uint64_t n = 0;
    for (auto& t : servers) n += t->shrink(flags);
    return n;
  }
  uint64_t rows() const {
    uint64_t n = 0;
    for (auto& t : servers) n += t->stats().rows;
    return n;
  }
  void save(const std::string& dir, const std::string& gen, int mode, int format, bool manifest = true) {
    const std::string td = dir + "/" + desc.name;
    ::mkdir(dir.c_str(), 0755);
    ::mkdir(td.c_str(), 0755);
    Manifest m;
    m.table = desc.name;
    m.kind = desc.kind;
    m.dim = desc.dim;
    m.optimizer = desc.optimizer;
    m.mode = mode;
    m.format = format;
    m.num_servers = sh.num_servers;
    m.generation = gen;
    for (auto& t : servers)
      for (auto& f : t->save(td, gen, mode, format)) m.files.push_back(f);
    if (manifest) m.write(td);
  }
  void load(const std::string& dir) {
    for (auto& t : servers) t->load(dir + "/" + desc.name);
  }
};

// A new folder, removed with everything in it when the test program exits.
inline std::string temp_dir() {
  struct Made {
    std::vector<std::string> dirs;
    ~Made() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static Made made;
  std::string t = testing::TempDir() + "ps_table_XXXXXX";
  if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
  made.dirs.push_back(t);
  return t;
}

// Every line of a FULL text save of c, sorted: every row/value with its counters and state.
inline std::vector<std::string> dump(Cluster& c) {
  const std::string dir = temp_dir();
  c.save(dir, "dump", DT_PS_SAVE_FULL, DT_PS_FORMAT_TEXT);
  const Manifest m = Manifest::read(dir + "/" + c.desc.name);
  std::vector<std::string> lines;
  for (const auto& f : m.files) {
    std::ifstream in(dir + "/" + c.desc.name + "/" + f);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  if (c.desc.kind == DT_PS_TABLE_SPARSE) std::sort(lines.begin(), lines.end());
  return lines;
}

template <class F>
std::string expect_error(F&& f, dt_status_t status) {
  try {
    f();
  } catch (const sdk::Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

inline TableDesc sparse_desc(int optimizer, int mode = DT_PS_MODE_ASYNC, uint64_t dim = 4) {
  TableDesc d;
  d.kind = DT_PS_TABLE_SPARSE;
  d.name = "emb";
  d.dim = dim;
  d.mode = mode;
  d.optimizer = optimizer;
  d.initializer = DT_PS_INIT_UNIFORM;
  d.init_a = -0.1;
  d.init_b = 0.1;
  d.seed = 7;
  d.learning_rate = 0.05;
  d.initial_g2sum = 0.1;
  return d;
}
inline TableDesc dense_desc(int optimizer, int mode = DT_PS_MODE_ASYNC, uint64_t dim = 10) {
  TableDesc d = sparse_desc(optimizer, mode, dim);
  d.kind = DT_PS_TABLE_DENSE;
  d.name = "fc";
  return d;
}

inline std::vector<float> random_grads(std::mt19937_64& rng, size_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> g(n);
  for (auto& x : g) x = u(rng);
  return g;
}

// ---- sharding and initializers ----

}  // namespace dtrain::ps_grpc::table_test
