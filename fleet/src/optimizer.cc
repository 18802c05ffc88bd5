#include "dtrain/fleet/optimizer.h"

#include <string>
#include <unordered_map>

#include "dtrain/error.h"
#include "dtrain/fleet/data_parallel.h"
#include "dtrain/fleet/optimizers.h"
#include "dtrain/fleet/sharding.h"

namespace dtrain::fleet {

void ModelSet::add(std::shared_ptr<DataParallel> model) {
  model->begin_step(next_step);
  for (auto& kv : model->module()->named_parameters()) names_[kv.value().unsafeGetTensorImpl()] = kv.key();
  if (ShardedParameters* sp = model->sharding()) {
    if (!sharding_) sharding_ = sp;
    for (auto& p : model->module()->parameters()) {
      const int64_t i = sp->index_of(p);
      if (i >= 0) shards_[p.unsafeGetTensorImpl()] = sp->shard(static_cast<size_t>(i));
    }
  }
  models_.push_back(std::move(model));
}

::torch::Tensor ModelSet::shard_of(const ::torch::Tensor& p) const {
  auto it = shards_.find(p.unsafeGetTensorImpl());
  return it == shards_.end() ? ::torch::Tensor() : it->second;
}

std::string ModelSet::name_of(const ::torch::Tensor& p) const {
  auto it = names_.find(p.unsafeGetTensorImpl());
  return it == names_.end() ? std::string() : it->second;
}

void ModelSet::sum_over_ranks(std::vector<double>& values) const {
  if (sharding_) return sharding_->allreduce_sum(values);
  if (!models_.empty()) models_[0]->allreduce_sum(values);
}

DistributedOptimizer::DistributedOptimizer(std::shared_ptr<::torch::optim::Optimizer> inner, StrategyOptions strategy,
                                           std::shared_ptr<ModelSet> models)
    : inner_(std::move(inner)), strategy_(strategy), models_(std::move(models)), scaler_(strategy) {
  if (!inner_) throw InvalidUsage("distributed_optimizer: the optimizer is null");
  if (!models_) models_ = std::make_shared<ModelSet>();
  inner_ = apply_optimizer_strategy(inner_, strategy, [this](const ::torch::Tensor& t) { return models_->name_of(t); });
  use_shards();
}

// The optimizer steps the shards of sharded models in place of their
// parameters (idempotent: a model made distributed later is picked up at the
// next step).
void DistributedOptimizer::use_shards() {
  if (!models_->sharded()) return;
  for (auto& g : inner_->param_groups())
    for (auto& p : g.params())
      if (::torch::Tensor s = models_->shard_of(p); s.defined()) p = s;
  NormReducer reduce = [models = models_](std::vector<double>& v) { models->sum_over_ranks(v); };
  if (auto* lamb = dynamic_cast<Lamb*>(inner_.get())) lamb->set_norm_reducer(reduce);
  if (auto* lars = dynamic_cast<Lars*>(inner_.get())) lars->set_norm_reducer(reduce);
}

bool DistributedOptimizer::found_inf_anywhere(const std::vector<::torch::Tensor>& params) {
  bool local = false;
  for (auto& p : params)
    if (p.grad().defined() && !p.grad().isfinite().all().item<bool>()) {
      local = true;
      break;
    }
  std::vector<double> flag{local ? 1.0 : 0.0};
  models_->sum_over_ranks(flag);
  return flag[0] > 0;
}

::torch::Tensor DistributedOptimizer::scale(const ::torch::Tensor& loss) const {
  return scaler_.enabled() ? loss * scaler_.scale() : loss;
}

bool DistributedOptimizer::step() {
  const int64_t s = models_->next_step;
  for (auto& m : models_->models()) m->end_backward(s);
  stepped_ = strategy_.optimizer_step_at(s);
  skipped_ = false;
  if (stepped_) {
    use_shards();
    std::vector<::torch::Tensor> params;
    for (auto& g : inner_->param_groups())
      for (auto& p : g.params()) params.push_back(p);
    if (scaler_.enabled()) {
      {
        ::torch::NoGradGuard ng;
        const double inv = 1.0 / scaler_.scale();
        for (auto& p : params)
          if (p.grad().defined()) p.mutable_grad().mul_(inv);
      }
      if (scaler_.update(found_inf_anywhere(params))) {
        inner_->zero_grad();
        skipped_ = true;
        stepped_ = false;
      }
    }
    if (!skipped_) {
      if (clip_ > 0) {
        NormReducer reduce;
        if (models_->sharded()) reduce = [models = models_](std::vector<double>& v) { models->sum_over_ranks(v); };
        last_norm_ = clip_grad_global_norm(params, clip_, reduce);
      }
      inner_->step();
      for (auto& m : models_->models()) m->after_optimizer_step(s);
    }
  }
  set_next_step(s + 1);
  return stepped_;
}

void DistributedOptimizer::zero_grad() {
  if (stepped_) inner_->zero_grad();
}

void DistributedOptimizer::set_next_step(int64_t step) {
  models_->next_step = step;
  for (auto& m : models_->models()) m->begin_step(step);
}

SyncStats DistributedOptimizer::stats() const {
  SyncStats s;
  for (auto& m : models_->models()) {
    SyncStats one = m->stats();
    s.wait_seconds += one.wait_seconds;
    s.allreduces += one.allreduces;
    s.bytes_on_wire += one.bytes_on_wire;
  }
  return s;
}

void DistributedOptimizer::reset_stats() {
  for (auto& m : models_->models()) m->reset_stats();
}

}  // namespace dtrain::fleet
