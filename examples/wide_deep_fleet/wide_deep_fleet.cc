// The parameter-server quick start of Paddle's Fleet, in C++ on dtrain::fleet:
// click prediction from 8 categorical slots (a sparse embedding on the
// servers) and an MLP (its weights on the servers too), asynchronous by
// default. Synthetic clicks from a fixed rule, so the loss must fall.
//
//   dtrain --server_num 1 --worker_num 2 -- ./ctr_fleet [--steps 200] [--sync]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <dtrain/fleet/fleet.h>
#include <dtrain/fleet/metrics.h>
#include <dtrain/fleet/ps.h>
#include <torch/torch.h>

namespace fleet = dtrain::fleet;

constexpr int kSlots = 8;
constexpr int64_t kVocab = 1000;

int main(int argc, char** argv) {
  int64_t steps = 200, batch = 256;
  bool sync = false;
  std::string save_dir = "model";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--save_dir") && i + 1 < argc)
      save_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--sync"))
      sync = true;
  }
  torch::set_num_threads(1);
  fleet::InitOptions init;
  init.is_collective = false;  // fleet.init(is_collective=False)
  fleet::DistributedStrategy strategy;
  strategy.a_sync = !sync;  // strategy.a_sync
  init.strategy = strategy;
  fleet::init(init);
  if (fleet::is_server()) {  // fleet.init_server(); fleet.run_server()
    fleet::init_server();
    fleet::run_server();
    return 0;
  }
  fleet::init_worker();
  dtrain::ps::TableConfig emb_cfg;
  emb_cfg.name = "embedding";
  emb_cfg.kind = dtrain::ps::TableKind::Sparse;
  emb_cfg.dim = 8;
  emb_cfg.optimizer = dtrain::ps::Optimizer::Adagrad;
  emb_cfg.learning_rate = 0.1;
  emb_cfg.initializer = dtrain::ps::Initializer::Uniform;
  emb_cfg.init_a = -0.05;
  emb_cfg.init_b = 0.05;
  fleet::SparseEmbedding emb(emb_cfg);
  dtrain::ps::TableConfig wide_cfg = emb_cfg;
  wide_cfg.name = "wide";
  wide_cfg.dim = 1;
  wide_cfg.initializer = dtrain::ps::Initializer::Constant;
  wide_cfg.init_a = 0.0;
  fleet::SparseEmbedding wide(wide_cfg);
  auto mlp = torch::nn::Sequential(torch::nn::Linear(kSlots * 8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 1));
  auto opt = fleet::ps_optimizer({emb, wide}, mlp.ptr());  // fleet.distributed_optimizer in PS mode

  // The rule behind the clicks: a fixed weight per (slot, value).
  auto gen = torch::Generator(at::detail::createCPUGenerator(1234));
  auto truth = torch::randn({kSlots, kVocab}, gen) * 1.5;
  auto data_gen = torch::Generator(at::detail::createCPUGenerator(99 + fleet::worker_index()));
  double first = 0, last = 0;
  for (int64_t step = 0; step < steps; ++step) {
    auto ids = torch::randint(kVocab, {batch, kSlots}, data_gen, torch::kLong);
    auto logit_true = truth.gather(1, ids.t()).sum(0);
    auto labels = (torch::rand({batch}, data_gen) < torch::sigmoid(logit_true)).to(torch::kFloat);
    auto keys = ids + torch::arange(kSlots).unsqueeze(0) * kVocab;  // one key space per slot
    auto deep = mlp->forward(emb(keys).reshape({batch, kSlots * 8})).squeeze(1);
    auto logit = deep + wide(keys).reshape({batch, kSlots}).sum(1);
    auto loss = torch::binary_cross_entropy_with_logits(logit, labels);
    loss.backward();
    opt->step();
    opt->zero_grad();
    double l = loss.item<double>();
    if (step < 10) first += l / 10;
    if (step >= steps - 10) last += l / 10;
    if (step % 20 == 0) std::printf("[step %lld] loss %.4f\n", static_cast<long long>(step), l);
  }
  double global_last = fleet::metrics::sum(last) / fleet::worker_num();
  std::printf("worker %d/%d done: loss %.4f -> %.4f (all workers %.4f)\n", fleet::worker_index(), fleet::worker_num(),
              first, last, global_last);
  fleet::barrier_worker();
  if (fleet::is_first_worker()) {
    fleet::save_persistables(save_dir);  // fleet.save_persistables(exe, dirname)
    std::printf("saved every table into %s\n", save_dir.c_str());
  }
  std::fflush(stdout);
  fleet::stop_worker();  // fleet.stop_worker()
  return 0;
}
