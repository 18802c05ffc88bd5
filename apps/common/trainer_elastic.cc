// The trainer in an elastic job (`dtrain --nnodes MIN:MAX`): its state kept
// after each optimizer step (fleet::ElasticState) and taken back, at the new
// world size, when a generation starts.

#include <fmt/format.h>

#include "common/trainer.h"
#include "dtrain/communicator.h"
#include "dtrain/error.h"

namespace dtrain::apps {

void Trainer::commit_elastic() {
  if (!elastic_.enabled()) return;
  if (dp_->sharding()) {  // the sharded checkpoints keep the state
    elastic_.mark_step(state_.global_step);
    return;
  }
  stamp_state();
  elastic_.commit(*model_, opt_->inner(), state_.global_step, run_state_bytes(state_));
}

bool Trainer::restore_elastic() {
  if (!elastic_.enabled()) return false;
  if (dp_->sharding()) {
    if (elastic_.generation() > 0) {
      log_line(fmt::format(
          "elastic: generation {}: sharding partitions the state over the ranks, so a lost machine's part is gone; "
          "going on from the latest sharded checkpoint (checkpoint.resume = true)",
          elastic_.generation()));
      opts_.resume = "true";
    }
    return false;
  }
  auto comm = fleet::communicator();
  auto r = elastic_.restore(comm.get(), *model_, opt_->inner());
  if (!r) return false;
  RunState& st = state_;
  st = run_state_from_bytes(r->extra);
  if (st.has_loss_scale) opt_->loss_scaler().set_state(st.loss_scale);
  opt_->set_next_step(st.global_step);
  log_line(
      fmt::format("elastic: generation {}: the state of rank {}'s commit at global step {}: epoch {}, {} samples "
                  "of it done",
                  elastic_.generation(), r->from_rank, st.global_step, st.epoch + 1,
                  st.epoch_offset + st.batch_in_epoch * st.batch * st.world));
  return true;
}

void Trainer::apply_elastic_scale() {
  RunState& st = state_;
  if (!elastic_.enabled() || elastic_.generation() == 0 || st.base_world <= 0) return;
  if (opts_.elastic_scale == "batch") {
    batch_ = std::max<int64_t>(1, opts_.batch_size * st.base_world / world_);
    lr_scale_ = 1;
  } else {
    lr_scale_ = double(world_) / double(st.base_world);
  }
  plan_epochs();
  log_line(
      fmt::format("elastic: generation {}: world {} (was {}), batch {} per worker ({} global), lr x{:.3f} "
                  "(elastic.scale = \"{}\", the first generation's world {})",
                  elastic_.generation(), world_, st.world > 0 ? st.world : world_, batch_, batch_ * world_, lr_scale_,
                  opts_.elastic_scale, st.base_world));
}

}  // namespace dtrain::apps
