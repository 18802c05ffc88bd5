// Misuse of the C++ Fleet API must give a clear error, not a hang.
//   dtrain-fleet-misuse before_init   distributed_model / distributed_optimizer / worker_index before init()
//   dtrain-fleet-misuse mismatch      (2 workers) rank 1 builds a different model
//   dtrain-fleet-misuse ps            parameter-server calls in a collective job
//   dtrain-fleet-misuse backward_twice (2 workers) two backwards before one optimizer step
// Prints "error: <message>" for each expected error and exits 0 only if every
// call that must fail did.
#include <cstdio>
#include <functional>
#include <string>

#include <dtrain/fleet/fleet.h>
#include <dtrain/fleet/ps.h>
#include <torch/torch.h>

namespace fleet = dtrain::fleet;

namespace {

bool expect_error(const char* what, const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    std::printf("%s: error: %s\n", what, e.what());
    return true;
  }
  std::printf("%s: no error\n", what);
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  torch::set_num_threads(1);
  bool ok = true;
  if (mode == "before_init") {
    auto model = std::make_shared<torch::nn::LinearImpl>(4, 2);
    ok &= expect_error("distributed_model", [&] { fleet::distributed_model(model); });
    ok &= expect_error("distributed_optimizer", [&] {
      fleet::distributed_optimizer(
          std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1)));
    });
    ok &= expect_error("worker_index", [] { fleet::worker_index(); });
    ok &= expect_error("metrics::sum", [] { fleet::metrics::sum(1.0); });
  } else if (mode == "mismatch") {
    fleet::init();
    int hidden = fleet::worker_index() == 1 ? 9 : 8;
    torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, hidden),
                                torch::nn::Linear(hidden, 2));
    ok &= expect_error("distributed_model", [&] { fleet::distributed_model(model); });
  } else if (mode == "ps") {
    fleet::init();
    ok &= expect_error("ps_worker", [] { fleet::ps_worker(); });
    ok &= expect_error("run_server", [] { fleet::run_server(); });
    ok &= expect_error("SparseEmbedding", [] { fleet::SparseEmbedding emb(dtrain::ps::TableConfig{}); });
  } else if (mode == "backward_twice") {
    fleet::init();
    torch::manual_seed(0);
    torch::nn::Linear lin(4, 2);
    fleet::distributed_model(lin);
    auto opt = fleet::distributed_optimizer(
        std::make_shared<torch::optim::SGD>(lin->parameters(), torch::optim::SGDOptions(0.1)));
    auto x = torch::randn({8, 4});
    lin->forward(x).sum().backward();
    ok &= expect_error("second backward", [&] { lin->forward(x).sum().backward(); });
  } else {
    std::fprintf(stderr, "usage: dtrain-fleet-misuse before_init|mismatch|ps|backward_twice\n");
    return 2;
  }
  return ok ? 0 : 1;
}
