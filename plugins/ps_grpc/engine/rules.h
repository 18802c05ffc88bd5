#pragma once
// The optimizer rules of the table engine, exactly as backend_v1.h states
// them (DT_PS_OPT_*). Hyper-parameters are rounded to f32 once; every step is
// f32 arithmetic in the order written (the engine is built with
// -ffp-contract=off, so no fused multiply-add changes a result), except the
// Adam bias corrections 1 - beta^t, computed in f64 and rounded to f32.
//
//   SGD      w -= lr * g
//   ADAGRAD  g2 += mean(g*g)   (sparse: the sum over the row in index order, / f32(dim);
//                               dense: g*g per value)
//            w -= lr * g / (sqrt(g2) + eps)       with g2 starting at initial_g2sum
//   ADAM     m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;  t += 1   (1-b1, 1-b2: f32 1.0f - b)
//            w -= lr * (m / bc1) / (sqrt(v / bc2) + eps), bc = f32(1 - beta^t in f64)
//            (sparse: m and v per value, t per row; dense: t per table)
//
// State layout of a sparse row (after its dim values): SGD none; ADAGRAD
// [g2]; ADAM [m0..m(dim-1), v0..v(dim-1)] (t lives in the row's counters).

#include <cmath>
#include <cstdint>

#include "dtrain/sdk/backend.h"

namespace dtrain::ps_grpc {

class Rule {
 public:
  explicit Rule(const sdk::TableDesc& d)
      : kind_(d.optimizer),
        lr_(static_cast<float>(d.learning_rate)),
        b1_(static_cast<float>(d.beta1)),
        b2_(static_cast<float>(d.beta2)),
        eps_(static_cast<float>(d.epsilon)),
        g2_init_(static_cast<float>(d.initial_g2sum)),
        beta1_(d.beta1),
        beta2_(d.beta2) {}

  int kind() const { return kind_; }

  // The last bias corrections, so rows at the same t share one pow().
  struct AdamCache {
    uint64_t t = 0;
    float bc1 = 0, bc2 = 0;
  };

  // Floats of state a sparse row of dim values keeps after its values.
  uint64_t row_state(uint64_t dim) const {
    return kind_ == DT_PS_OPT_ADAGRAD ? 1 : kind_ == DT_PS_OPT_ADAM ? 2 * dim : 0;
  }
  // Arrays of per-value state a dense table keeps (adagrad: g2; adam: m, v).
  int dense_state_arrays() const { return kind_ == DT_PS_OPT_ADAGRAD ? 1 : kind_ == DT_PS_OPT_ADAM ? 2 : 0; }
  float g2_init() const { return g2_init_; }

  void init_row_state(float* st, uint64_t dim) const {
    const uint64_t n = row_state(dim);
    for (uint64_t i = 0; i < n; ++i) st[i] = 0.0f;
    if (kind_ == DT_PS_OPT_ADAGRAD) st[0] = g2_init_;
  }

  // One step on a sparse row: w[dim], its state (row_state floats), its t.
  void apply_row(float* w, float* st, uint32_t& t, const float* g, uint64_t dim, AdamCache& cache) const {
    if (kind_ == DT_PS_OPT_SGD) {
      const float lr = lr_;
      for (uint64_t i = 0; i < dim; ++i) w[i] -= lr * g[i];
      return;
    }
    apply_row_stateful(w, st, t, g, dim, cache);
  }

  // One step on a dense range: w[n], state arrays s0/s1 (see dense_state_arrays), table t.
  void apply_dense(float* w, float* s0, float* s1, uint64_t& t, const float* g, uint64_t n) const {
    switch (kind_) {
      case DT_PS_OPT_SGD:
        for (uint64_t i = 0; i < n; ++i) w[i] -= lr_ * g[i];
        break;
      case DT_PS_OPT_ADAGRAD:
        for (uint64_t i = 0; i < n; ++i) {
          s0[i] += g[i] * g[i];
          w[i] -= lr_ * g[i] / (std::sqrt(s0[i]) + eps_);
        }
        break;
      case DT_PS_OPT_ADAM: {
        ++t;
        AdamCache cache;
        adam(w, s0, s1, g, n, t, cache);
        break;
      }
    }
  }

 private:
  // Out of line, so a push's per-key loop stays small.
  [[gnu::noinline]] void apply_row_stateful(float* w, float* st, uint32_t& t, const float* g, uint64_t dim,
                                            AdamCache& cache) const {
    switch (kind_) {
      case DT_PS_OPT_ADAGRAD: {
        float s = 0.0f;
        for (uint64_t i = 0; i < dim; ++i) s += g[i] * g[i];
        st[0] += s / static_cast<float>(dim);
        const float d = std::sqrt(st[0]) + eps_;
        for (uint64_t i = 0; i < dim; ++i) w[i] -= lr_ * g[i] / d;
        break;
      }
      case DT_PS_OPT_ADAM: {
        ++t;
        adam(w, st, st + dim, g, dim, t, cache);
        break;
      }
    }
  }

  void adam(float* w, float* m, float* v, const float* g, uint64_t n, uint64_t t, AdamCache& c) const {
    if (c.t != t) {
      c.t = t;
      c.bc1 = static_cast<float>(1.0 - std::pow(beta1_, static_cast<double>(t)));
      c.bc2 = static_cast<float>(1.0 - std::pow(beta2_, static_cast<double>(t)));
    }
    const float bc1 = c.bc1, bc2 = c.bc2;
    const float c1 = 1.0f - b1_, c2 = 1.0f - b2_;
    for (uint64_t i = 0; i < n; ++i) {
      m[i] = b1_ * m[i] + c1 * g[i];
      v[i] = b2_ * v[i] + c2 * g[i] * g[i];
      w[i] -= lr_ * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps_);
    }
  }

  int kind_;
  float lr_, b1_, b2_, eps_, g2_init_;
  double beta1_, beta2_;
};

}  // namespace dtrain::ps_grpc
