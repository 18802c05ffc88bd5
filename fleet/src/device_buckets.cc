// DataParallel's CUDA path: gradient buckets in the parameters' CUDA memory
// (the host path's are the core's GradientBuckets), bucketed and launched by
// the core's Bucketer, the gradients views of their buckets, each bucket
// all-reduced (average) as a CUDA buffer on the current stream as soon as its
// last gradient is in, in bucket order on every rank. With fp16_allreduce a
// bucket travels as f16 or bf16, as c10d's fp16 compression hook and the host
// path do: divided by the world size, cast (a kernel on the current stream,
// which the all-reduce follows), summed, and widened back in finish().
#include <mutex>

#include "dtrain/communicator.h"
#include "gradient_sync.h"
#include "tensor_buffer.h"

namespace dtrain::fleet {

namespace {

using detail::device_view;

std::vector<size_t> bytes_of(const std::vector<::torch::Tensor>& params) {
  std::vector<size_t> bytes;
  for (auto& p : params) bytes.push_back(static_cast<size_t>(p.numel()) * sizeof(float));
  return bytes;
}

class DeviceBuckets : public GradientSync, private BucketReduction {
 public:
  DeviceBuckets(const std::vector<::torch::Tensor>& params, std::shared_ptr<Communicator> comm,
                const StrategyOptions& options)
      : params_(params), comm_(std::move(comm)), bucketer_(bytes_of(params), options.gradient_bucket_bytes()) {
    if (options.fp16_allreduce) wire_ = options.wire_dtype == DType::BF16 ? ::torch::kBFloat16 : ::torch::kHalf;
    slots_.resize(params_.size());
    buckets_.resize(bucketer_.num_buckets());
    ::torch::NoGradGuard ng;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const auto& members = bucketer_.members(b);
      int64_t count = 0;
      for (size_t i : members) count += params_[i].numel();
      buckets_[b].flat = ::torch::zeros({count}, params_[members[0]].options().requires_grad(false));
      int64_t off = 0;
      for (size_t i : members) {
        slots_[i] = buckets_[b].flat.narrow(0, off, params_[i].numel()).view(params_[i].sizes());
        off += params_[i].numel();
      }
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      if (p.grad().defined()) slots_[i].copy_(p.grad());
      p.mutable_grad() = slots_[i];
    }
  }
  ~DeviceBuckets() override {
    ::torch::NoGradGuard ng;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      if (p.grad().defined() && p.grad().data_ptr() == slots_[i].data_ptr()) p.mutable_grad() = p.grad().clone();
    }
  }
  void begin() override {
    std::lock_guard<std::mutex> lk(mu_);
    bucketer_.begin();
  }
  // A gradient that replaced its bucket view (libtorch 2.x's zero_grad() sets
  // them to none) is copied in and gets the view, which will hold the average, back.
  void ready(size_t i) override {
    auto& g = params_[i].mutable_grad();
    if (!g.defined()) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!bucketer_.ready(i)) {
        if (g.data_ptr() != slots_[i].data_ptr()) {
          ::torch::NoGradGuard ng;
          slots_[i].copy_(g);
        }
        bucketer_.mark(i, *this);
      }
    }
    g = slots_[i];
  }
  void finish() override {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].grad().defined()) params_[i].mutable_grad() = ::torch::zeros_like(params_[i]);
      ready(i);
    }
    wait_buckets(buckets_, stats_);
    ::torch::NoGradGuard ng;
    for (auto& b : buckets_)
      if (b.wire.defined()) {
        b.flat.copy_(b.wire);
        b.wire = ::torch::Tensor();
      }
  }
  SyncStats stats() const override { return stats_; }
  void reset_stats() override { stats_ = {}; }

 private:
  struct Bucket {
    ::torch::Tensor flat;
    ::torch::Tensor wire;  // the 16-bit copy in flight (fp16_allreduce)
    std::shared_ptr<Work> work;
  };
  void launch(size_t bucket) override {
    auto& b = buckets_[bucket];
    stats_.allreduces++;
    if (wire_ == ::torch::kFloat32) {
      b.work = comm_->allreduce(device_view(b.flat), ReduceOp::Avg);
      stats_.bytes_on_wire += static_cast<int64_t>(b.flat.numel() * sizeof(float));
      return;
    }
    ::torch::NoGradGuard ng;
    b.wire = b.flat.mul(1.0 / static_cast<double>(comm_->size())).to(wire_);
    b.work = comm_->allreduce(device_view(b.wire), ReduceOp::Sum);
    stats_.bytes_on_wire += static_cast<int64_t>(b.flat.numel() * sizeof(uint16_t));
  }

  std::vector<::torch::Tensor> params_;
  std::shared_ptr<Communicator> comm_;
  Bucketer bucketer_;
  std::vector<Bucket> buckets_;
  std::vector<::torch::Tensor> slots_;  // parameter i's gradient in its bucket
  ::torch::ScalarType wire_ = ::torch::kFloat32;
  std::mutex mu_;
  SyncStats stats_;
};

}  // namespace

std::unique_ptr<GradientSync> device_buckets(const std::vector<::torch::Tensor>& params,
                                             std::shared_ptr<Communicator> comm, const StrategyOptions& options) {
  return std::make_unique<DeviceBuckets>(params, std::move(comm), options);
}

}  // namespace dtrain::fleet
