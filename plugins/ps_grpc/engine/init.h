#pragma once
// The deterministic initializer and the admission hash of the table engine.
// Counter-based (no generator state), so a sparse row's initial values depend
// only on (seed, key, index in row) and a dense value's only on (seed, global
// index): the same on any server count and in any creation order.
//
//   mix64(z)        the splitmix64 finalizer (dtrain/sdk/random.h):
//                   z = (z ^ z>>30) * 0xbf58476d1ce4e5b9; z = (z ^ z>>27) * 0x94d049bb133111eb; z ^ z>>31
//   G               0x9e3779b97f4a7c15 (splitmix64's increment, sdk::kSplitMix64Gamma)
//   stream(s, key)  mix64(key ^ mix64(s + G))
//   unit(st, j)     (mix64(st + (j + 1) * G) >> 11) * 2^-53, a double in [0, 1)
//
//   CONSTANT  value j = init_a
//   UNIFORM   value j = f32(init_a + (init_b - init_a) * unit(stream(seed, key), j)), in f64 then
//             rounded (a result that rounds up to init_b is stepped down one f32 ulp)
//   NORMAL    Box-Muller: u1 = unit(st, 2j), u2 = unit(st, 2j + 1),
//             value j = f32(init_a + init_b * sqrt(-2 ln(1 - u1)) * cos(2 pi u2)), in f64
//   dense     value at global index g = value 0 of the "row" key g
//
// Admission by probability: key is admitted iff unit(stream(seed ^ 0xad1155e0ad1155e0, key), 0) < admit_probability.

#include <cmath>
#include <cstdint>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/sdk/random.h"

namespace dtrain::ps_grpc {

using sdk::mix64;  // dtrain/sdk/random.h

inline uint64_t init_stream(uint64_t seed, uint64_t key) { return mix64(key ^ sdk::splitmix64(seed)); }
inline double init_unit(uint64_t stream, uint64_t j) {
  return static_cast<double>(mix64(stream + (j + 1) * sdk::kSplitMix64Gamma) >> 11) * 0x1.0p-53;
}

inline bool admitted_by_hash(uint64_t seed, uint64_t key, double probability) {
  if (probability >= 1.0) return true;
  return init_unit(init_stream(seed ^ 0xad1155e0ad1155e0ULL, key), 0) < probability;
}

class Initializer {
 public:
  Initializer(int kind, double a, double b, uint64_t seed) : kind_(kind), a_(a), b_(b), seed_(seed) {}

  // The initial row of key (dim values).
  void fill(uint64_t key, float* out, uint64_t dim) const {
    if (kind_ == DT_PS_INIT_CONSTANT) {
      const float v = static_cast<float>(a_);
      for (uint64_t j = 0; j < dim; ++j) out[j] = v;
      return;
    }
    const uint64_t st = init_stream(seed_, key);
    if (kind_ == DT_PS_INIT_UNIFORM) {
      const float hi = static_cast<float>(b_);
      for (uint64_t j = 0; j < dim; ++j) {
        float v = static_cast<float>(a_ + (b_ - a_) * init_unit(st, j));
        if (v >= hi && b_ > a_) v = std::nextafter(hi, -INFINITY);
        out[j] = v;
      }
      return;
    }
    constexpr double two_pi = 6.283185307179586476925286766559;
    for (uint64_t j = 0; j < dim; ++j) {
      const double u1 = init_unit(st, 2 * j), u2 = init_unit(st, 2 * j + 1);
      out[j] = static_cast<float>(a_ + b_ * std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(two_pi * u2));
    }
  }
  float dense_value(uint64_t index) const {
    float v;
    fill(index, &v, 1);
    return v;
  }

 private:
  int kind_;
  double a_, b_;
  uint64_t seed_;
};

}  // namespace dtrain::ps_grpc
