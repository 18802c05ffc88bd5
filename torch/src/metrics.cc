#include "dtrain/torch/metrics.h"

#include "dtrain/error.h"
#include "fleet_state.h"

namespace dtrain::torch::metrics {

namespace {

Communicator* comm_for(const char* what) {
  auto& s = detail::state(what);
  return s.job.comm && s.job.comm->size() > 1 ? s.job.comm.get() : nullptr;
}

double reduce_one(const char* what, double v, ReduceOp op) {
  if (Communicator* c = comm_for(what)) c->allreduce(Buffer::of(&v, 1), op)->wait();
  return v;
}

}  // namespace

double sum(double local) { return reduce_one("metrics::sum", local, ReduceOp::Sum); }
double max(double local) { return reduce_one("metrics::max", local, ReduceOp::Max); }
double min(double local) { return reduce_one("metrics::min", local, ReduceOp::Min); }

void sum(std::vector<double>& values) {
  Communicator* c = comm_for("metrics::sum");
  if (c && !values.empty()) c->allreduce(Buffer::of(values.data(), values.size()), ReduceOp::Sum)->wait();
}

double acc(double correct, double total) {
  std::vector<double> v{correct, total};
  sum(v);
  return v[1] > 0 ? v[0] / v[1] : 0.0;
}

void all_reduce(::torch::Tensor& tensor, ReduceOp op) {
  Communicator* c = comm_for("metrics::all_reduce");
  if (!tensor.device().is_cpu() || !tensor.is_contiguous())
    throw NotSupported("dtrain::torch::metrics::all_reduce needs a contiguous CPU tensor");
  if (!c) return;
  size_t n = static_cast<size_t>(tensor.numel());
  Buffer b;
  switch (tensor.scalar_type()) {
    case ::torch::kFloat32: b = Buffer::of(tensor.data_ptr<float>(), n); break;
    case ::torch::kFloat64: b = Buffer::of(tensor.data_ptr<double>(), n); break;
    case ::torch::kInt32: b = Buffer::of(tensor.data_ptr<int32_t>(), n); break;
    case ::torch::kInt64: b = Buffer::of(tensor.data_ptr<int64_t>(), n); break;
    default:
      throw NotSupported(std::string("dtrain::torch::metrics::all_reduce: dtype ") +
                         c10::toString(tensor.scalar_type()) + " is not supported (float32/64, int32/64)");
  }
  c->allreduce(b, op)->wait();
}

}  // namespace dtrain::torch::metrics
