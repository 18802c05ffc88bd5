#pragma once
// Elastic training's in-memory commit, Horovod's `state.commit()` for a
// program started by `dtrain --nnodes MIN:MAX` (docs/elastic.md).
//
// When a machine is lost or one joins, dtrain ends the generation and starts
// the workers of the next one with the new world size. Their state comes back
// from the last commit, not from a checkpoint: after each complete optimizer
// step every worker calls commit(), which keeps the model, the optimizer and
// the caller's own state (its position in the data, its schedule) in this
// machine's commit folder (DTRAIN_ELASTIC_DIR, in /dev/shm, kept by dtrain
// across generations). At the start of a generation every worker calls
// restore(): the newest commit among the surviving machines is broadcast from
// the lowest rank that holds it, so a joining machine gets it too. An abort in
// the middle of a step (a lost peer during clipping, LAMB's norms, AMP's
// overflow check, a gradient-merge group) is never committed: at most the
// step in flight is redone.
//
//   fleet::ElasticState elastic;
//   int64_t step = 0;
//   if (auto r = elastic.restore(fleet::communicator().get(), *model, opt->inner())) step = r->step;
//   for (; step < steps; ++step) { ...; opt->step(); opt->zero_grad(); elastic.commit(*model, opt->inner(), step + 1,
//   ""); }
//
// Sharded state (strategy.sharding) is partitioned across the ranks, so a lost
// machine's part is gone: such a program goes on from its sharded checkpoint
// instead (commit() and restore() refuse it).
//
// Threads: the training thread. commit() is local (no communication);
// restore() is collective over the communicator it is given.

#include <cstdint>
#include <optional>
#include <string>

#include <torch/torch.h>

namespace dtrain {
class Communicator;
}

namespace dtrain::fleet {

class ElasticState {
 public:
  // Reads DTRAIN_ELASTIC_DIR, DTRAIN_RESTART_COUNT (the generation) and
  // DTRAIN_LOCAL_RANK; disabled outside an elastic job.
  ElasticState();
  bool enabled() const { return !dir_.empty(); }
  int generation() const { return generation_; }
  const std::string& dir() const { return dir_; }

  // After a complete optimizer step. Local rank 0 of each machine writes
  // model, optimizer, step and extra atomically (a temporary file, then
  // rename), then the step file "<generation> <step>" that dtrain reads for
  // its log. The other local ranks hold the same state and write nothing.
  // A no-op when disabled.
  void commit(torch::nn::Module& model, torch::optim::Optimizer& opt, int64_t step, const std::string& extra);
  // Only the step file (for dtrain's log), where the state is kept elsewhere
  // (a sharded run's checkpoints).
  void mark_step(int64_t step);

  struct Restored {
    int64_t step = 0;
    std::string extra;
    int from_rank = 0;  // the rank whose commit was broadcast
  };
  // Collective over comm (null: a single worker): two all-reduces and two
  // broadcasts, on the model's device (a GPU backend takes device buffers
  // only). The newest commit on any rank's machine, loaded into model and opt
  // on every rank; nullopt when no machine holds one (the first generation),
  // the model and optimizer then untouched. A commit this machine cannot read
  // is left out, with a warning. With strategy.sharding, commit() and
  // restore() throw NotSupported.
  std::optional<Restored> restore(Communicator* comm, torch::nn::Module& model, torch::optim::Optimizer& opt);

 private:
  std::string dir_;
  int generation_ = 0, local_rank_ = 0;
};

}  // namespace dtrain::fleet
