// DataParallel's host path: the core's GradientBuckets, with each gradient a
// view of its slot (c10d's gradient_as_bucket_view): backward accumulates
// into the bucket and the all-reduce averages it in place, with no copy in or
// out. zero_grad() zeroes in place and keeps the view; a gradient replaced by
// another tensor is copied into the view once and given it back.
#include "dtrain/communicator.h"
#include "gradient_sync.h"
#include "tensor_buffer.h"

namespace dtrain::fleet {

namespace {

using detail::f32_view;

// Parameter p's gradient as a view of its slot, with p's strides (a
// channels-last weight gets a channels-last gradient in place).
::torch::Tensor slot_view(float* slot, const ::torch::Tensor& p) {
  return ::torch::from_blob(slot, p.sizes(), p.strides(), p.options().requires_grad(false));
}

std::vector<size_t> counts_of(const std::vector<::torch::Tensor>& params) {
  std::vector<size_t> counts;
  for (auto& p : params) counts.push_back(static_cast<size_t>(p.numel()));
  return counts;
}

class HostBuckets : public GradientSync {
 public:
  HostBuckets(const std::vector<::torch::Tensor>& params, std::shared_ptr<Communicator> comm,
              const StrategyOptions& options)
      : params_(params), buckets_(std::move(comm), counts_of(params), options) {
    ::torch::NoGradGuard ng;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      auto view = slot_view(buckets_.slot(i), p);
      if (p.grad().defined())
        view.copy_(p.grad());
      else
        view.zero_();
      p.mutable_grad() = view;
    }
  }
  // The bucket memory goes with this object: gradients still in it get their own.
  ~HostBuckets() override {
    ::torch::NoGradGuard ng;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      if (p.grad().defined() && p.grad().data_ptr() == buckets_.slot(i)) p.mutable_grad() = p.grad().clone();
    }
  }
  void begin() override { buckets_.begin(); }
  void ready(size_t i) override {
    auto& p = params_[i];
    auto& g = p.mutable_grad();
    if (!g.defined()) return;
    if (g.data_ptr() != buckets_.slot(i)) {
      ::torch::NoGradGuard ng;
      auto view = slot_view(buckets_.slot(i), p);
      view.copy_(g);
      g = view;
    }
    buckets_.mark_ready(i, f32_view(g));
  }
  void finish() override {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].grad().defined()) params_[i].mutable_grad() = ::torch::zeros_like(params_[i]);
      ready(i);
    }
    buckets_.finish();
  }
  SyncStats stats() const override { return buckets_.stats(); }
  void reset_stats() override { buckets_.reset_stats(); }

 private:
  std::vector<::torch::Tensor> params_;
  GradientBuckets buckets_;
};

}  // namespace

std::unique_ptr<GradientSync> host_buckets(const std::vector<::torch::Tensor>& params,
                                           std::shared_ptr<Communicator> comm, const StrategyOptions& options) {
  return std::make_unique<HostBuckets>(params, std::move(comm), options);
}

}  // namespace dtrain::fleet
