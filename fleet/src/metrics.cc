#include "dtrain/fleet/metrics.h"

#include "dtrain/error.h"
#include "fleet_state.h"

namespace dtrain::fleet::metrics {

namespace {

Communicator* comm_for(const char* what) {
  auto& s = detail::state(what);
  return s.job.comm && s.job.comm->size() > 1 ? s.job.comm.get() : nullptr;
}

double reduce_one(const char* what, double v, ReduceOp op) {
  if (Communicator* c = comm_for(what)) c->allreduce(Buffer::of(&v, 1), op, CallOptions::wait_now());
  return v;
}

}  // namespace

double sum(double local) { return reduce_one("metrics::sum", local, ReduceOp::Sum); }
double max(double local) { return reduce_one("metrics::max", local, ReduceOp::Max); }
double min(double local) { return reduce_one("metrics::min", local, ReduceOp::Min); }

void sum(std::vector<double>& values) {
  Communicator* c = comm_for("metrics::sum");
  if (c && !values.empty())
    c->allreduce(Buffer::of(values.data(), values.size()), ReduceOp::Sum, CallOptions::wait_now());
}

double acc(double correct, double total) {
  std::vector<double> v{correct, total};
  sum(v);
  return v[1] > 0 ? v[0] / v[1] : 0.0;
}

double auc_of_buckets(const std::vector<double>& pos, const std::vector<double>& neg) {
  if (pos.size() != neg.size())
    throw InvalidUsage("dtrain::fleet::metrics::auc: " + std::to_string(pos.size()) + " positive buckets but " +
                       std::to_string(neg.size()) + " negative ones");
  double tp = 0, fp = 0, area = 0;
  for (size_t i = pos.size(); i-- > 0;) {
    area += neg[i] * (tp + pos[i] / 2.0);
    tp += pos[i];
    fp += neg[i];
  }
  return tp > 0 && fp > 0 ? area / (tp * fp) : 0.5;
}

double auc(std::vector<double>& pos, std::vector<double>& neg) {
  if (pos.size() != neg.size()) return auc_of_buckets(pos, neg);
  std::vector<double> both(pos);
  both.insert(both.end(), neg.begin(), neg.end());
  sum(both);
  std::copy(both.begin(), both.begin() + static_cast<std::ptrdiff_t>(pos.size()), pos.begin());
  std::copy(both.begin() + static_cast<std::ptrdiff_t>(pos.size()), both.end(), neg.begin());
  return auc_of_buckets(pos, neg);
}

SegmentationScores segmentation_scores(const std::vector<double>& m, int n) {
  if (n < 1 || m.size() != size_t(n) * size_t(n))
    throw InvalidUsage("dtrain::fleet::metrics::segmentation_scores: " + std::to_string(m.size()) +
                       " entries is not a " + std::to_string(n) + " x " + std::to_string(n) + " confusion matrix");
  SegmentationScores r;
  std::vector<double> label_area(size_t(n), 0.0), pred_area(size_t(n), 0.0);
  double total = 0, trace = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double v = m[size_t(i) * n + j];
      label_area[size_t(i)] += v;
      pred_area[size_t(j)] += v;
      total += v;
      if (i == j) trace += v;
    }
  double expected = 0;
  for (int i = 0; i < n; ++i) {
    double tp = m[size_t(i) * n + i], la = label_area[size_t(i)], pa = pred_area[size_t(i)];
    double uni = la + pa - tp;
    r.class_iou.push_back(uni > 0 ? tp / uni : 0.0);
    r.class_precision.push_back(pa > 0 ? tp / pa : 0.0);
    r.class_recall.push_back(la > 0 ? tp / la : 0.0);
    r.class_dice.push_back(la + pa > 0 ? 2 * tp / (la + pa) : 0.0);
    r.miou += r.class_iou.back() / n;
    r.mdice += r.class_dice.back() / n;
    expected += la * pa;
  }
  r.pixels = total;
  r.accuracy = total > 0 ? trace / total : 0.0;
  double pe = total > 0 ? expected / (total * total) : 0.0;
  r.kappa = pe < 1 ? (r.accuracy - pe) / (1 - pe) : 0.0;
  return r;
}

SegmentationScores confusion(std::vector<double>& m, int n) {
  if (n >= 1 && m.size() == size_t(n) * size_t(n)) sum(m);
  return segmentation_scores(m, n);
}

void all_reduce(::torch::Tensor& tensor, ReduceOp op) {
  Communicator* c = comm_for("metrics::all_reduce");
  if (!tensor.device().is_cpu() || !tensor.is_contiguous())
    throw NotSupported("dtrain::fleet::metrics::all_reduce needs a contiguous CPU tensor");
  if (!c) return;
  size_t n = static_cast<size_t>(tensor.numel());
  Buffer b;
  switch (tensor.scalar_type()) {
    case ::torch::kFloat32: b = Buffer::of(tensor.data_ptr<float>(), n); break;
    case ::torch::kFloat64: b = Buffer::of(tensor.data_ptr<double>(), n); break;
    case ::torch::kInt32: b = Buffer::of(tensor.data_ptr<int32_t>(), n); break;
    case ::torch::kInt64: b = Buffer::of(tensor.data_ptr<int64_t>(), n); break;
    default:
      throw NotSupported(std::string("dtrain::fleet::metrics::all_reduce: dtype ") +
                         c10::toString(tensor.scalar_type()) + " is not supported (float32/64, int32/64)");
  }
  c->allreduce(b, op, CallOptions::wait_now());
}

}  // namespace dtrain::fleet::metrics
