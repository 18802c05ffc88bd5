#pragma once
// Timing and statistics shared by the benchmarks (the one copy of each): the
// clock and seconds since a time point, the median, a mean with the
// half-width of its 95% confidence interval (Student's t, for the handful of
// trials or rows a benchmark has), and paired ratios pooled as a geometric
// mean with their interval. Header-only, no dependencies.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
// Clock's time in nanoseconds: CLOCK_MONOTONIC, the same in every process of the machine.
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// The two-sided 97.5% quantile of Student's t with `df` degrees of freedom
// (0 for df == 0: one sample has no spread; 1.96 above 30).
inline double t975(size_t df) {
  static const double t[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                             2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                             2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (df == 0) return 0;
  return df <= 30 ? t[df - 1] : 1.96;
}

struct MeanCi {
  double mean = 0;
  double half = 0;  // the 95% interval is mean - half .. mean + half
  size_t n = 0;
};

// Mean of `v` and the half-width of its 95% interval. Throws on an empty `v`.
inline MeanCi mean_ci(const std::vector<double>& v) {
  if (v.empty()) throw std::invalid_argument("mean_ci of no values");
  double m = 0, ss = 0;
  for (double x : v) m += x;
  m /= double(v.size());
  for (double x : v) ss += (x - m) * (x - m);
  size_t df = v.size() - 1;
  double half = df ? t975(df) * std::sqrt(ss / double(df) / double(v.size())) : 0;
  return {m, half, v.size()};
}

struct RatioCi {
  double ratio = 0;         // geometric mean of the paired ratios
  double lo = 0, hi = 0;    // its 95% interval
  double min = 0, max = 0;  // the single pairs
  size_t n = 0;
};

// Pairs a[i] / b[i] (trial i of both, measured back to back) pooled as the
// geometric mean, with the 95% interval from the spread of the log ratios.
// Throws when the sizes differ, are 0, or a value is not positive.
inline RatioCi pooled_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.empty()) throw std::invalid_argument("pooled_ratio needs equally many pairs, > 0");
  std::vector<double> logs;
  RatioCi r;
  r.min = 1e300, r.max = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(a[i] > 0) || !(b[i] > 0)) throw std::invalid_argument("pooled_ratio of a non-positive value");
    double q = a[i] / b[i];
    r.min = std::min(r.min, q), r.max = std::max(r.max, q);
    logs.push_back(std::log(q));
  }
  MeanCi m = mean_ci(logs);
  r.ratio = std::exp(m.mean);
  r.lo = std::exp(m.mean - m.half);
  r.hi = std::exp(m.mean + m.half);
  r.n = a.size();
  return r;
}

// The middle value (the mean of the two middle ones for an even count). Throws on an empty `v`.
inline double median(std::vector<double> v) {
  if (v.empty()) throw std::invalid_argument("median of no values");
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "median (min-max)" of v with `decimals` digits (just the value for one; "not run" for none).
inline std::string median_range(std::vector<double> v, int decimals) {
  if (v.empty()) return "not run";
  std::sort(v.begin(), v.end());
  char buf[96];
  if (v.size() == 1)
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v[0]);
  else
    std::snprintf(buf, sizeof buf, "%.*f (%.*f-%.*f)", decimals, median(v), decimals, v.front(), decimals, v.back());
  return buf;
}

}  // namespace dtrain::bench
