#include "dtrain/torch/optimizer.h"

#include "dtrain/error.h"
#include "dtrain/torch/data_parallel.h"

namespace dtrain::torch {

void ModelSet::add(std::shared_ptr<DataParallel> model) {
  model->begin_step(next_step);
  models.push_back(std::move(model));
}

DistributedOptimizer::DistributedOptimizer(std::shared_ptr<::torch::optim::Optimizer> inner, StrategyOptions strategy,
                                           std::shared_ptr<ModelSet> models)
    : inner_(std::move(inner)), strategy_(strategy), models_(std::move(models)) {
  if (!inner_) throw InvalidUsage("distributed_optimizer: the optimizer is null");
  if (!models_) models_ = std::make_shared<ModelSet>();
}

bool DistributedOptimizer::step() {
  const int64_t s = models_->next_step;
  for (auto& m : models_->models) m->end_backward(s);
  stepped_ = strategy_.optimizer_step_at(s);
  if (stepped_) {
    inner_->step();
    for (auto& m : models_->models) m->after_optimizer_step(s);
  }
  set_next_step(s + 1);
  return stepped_;
}

void DistributedOptimizer::zero_grad() {
  if (stepped_) inner_->zero_grad();
}

void DistributedOptimizer::set_next_step(int64_t step) {
  models_->next_step = step;
  for (auto& m : models_->models) m->begin_step(step);
}

SyncStats DistributedOptimizer::stats() const {
  SyncStats s;
  for (auto& m : models_->models) {
    SyncStats one = m->stats();
    s.wait_seconds += one.wait_seconds;
    s.allreduces += one.allreduces;
    s.bytes_on_wire += one.bytes_on_wire;
  }
  return s;
}

void DistributedOptimizer::reset_stats() {
  for (auto& m : models_->models) m->reset_stats();
}

}  // namespace dtrain::torch
