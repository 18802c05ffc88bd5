#pragma once
// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", 2014; the constants of Vigna's splitmix64.c): counter-based
// hashing for data generators, initializers, keys and test values, where a
// value must be a pure function of (seed, index) on any rank and in any order.
// Header-only, standard C++17, no dependencies; the one copy, shared by the
// plugins, the conformance suite, the apps, the benchmarks, the examples and
// the tests.

#include <cstdint>

namespace dtrain::sdk {

// splitmix64's increment: 2^64 / the golden ratio, odd.
inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ULL;

// splitmix64's output function (the finalizer, Stafford's variant 13): a
// bijection of 64-bit values in which every input bit affects every output bit.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The value splitmix64 draws from state x (it then steps to x + gamma):
// mix64(x + kSplitMix64Gamma).
constexpr uint64_t splitmix64(uint64_t x) { return mix64(x + kSplitMix64Gamma); }

}  // namespace dtrain::sdk
