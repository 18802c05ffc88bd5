#include "dtrain/fleet/elastic.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/fleet/fleet.h"
#include "dtrain/log.h"
#include "tensor_buffer.h"

namespace dtrain::fleet {

namespace {

namespace fs = std::filesystem;

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : 0;
}

// Sharded state is partitioned over the ranks: one rank's commit is not the model.
void refuse_sharding(const char* what) {
  if (is_initialized() && strategy().sharding)
    throw NotSupported(std::string("dtrain::fleet::ElasticState::") + what +
                       ": strategy.sharding partitions the state over the ranks, so one rank's commit is not the "
                       "model; an elastic sharded run goes on from its sharded checkpoint (docs/elastic.md)");
}

void write_atomically(const fs::path& path, const std::string& bytes) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) throw IoError("cannot write the elastic commit " + tmp.string());
  }
  fs::rename(tmp, path);
}

}  // namespace

ElasticState::ElasticState() {
  if (const char* d = std::getenv("DTRAIN_ELASTIC_DIR"); d && *d) dir_ = d;
  generation_ = env_int("DTRAIN_RESTART_COUNT");
  local_rank_ = env_int("DTRAIN_LOCAL_RANK");
}

void ElasticState::commit(torch::nn::Module& model, torch::optim::Optimizer& opt, int64_t step,
                          const std::string& extra) {
  if (!enabled()) return;
  refuse_sharding("commit");
  if (local_rank_ != 0) return;
  torch::serialize::OutputArchive ar, m, o;
  model.save(m);
  opt.save(o);
  ar.write("model", m);
  ar.write("optimizer", o);
  ar.write("step", torch::tensor(step, torch::kInt64));
  ar.write(
      "extra",
      torch::from_blob(const_cast<char*>(extra.data()), {static_cast<int64_t>(extra.size())}, torch::kUInt8).clone());
  std::ostringstream out;
  ar.save_to(out);
  write_atomically(fs::path(dir_) / "commit.pt", out.str());
  mark_step(step);
}

void ElasticState::mark_step(int64_t step) {
  if (!enabled() || local_rank_ != 0) return;
  write_atomically(fs::path(dir_) / "step", std::to_string(generation_) + " " + std::to_string(step) + "\n");
}

std::optional<ElasticState::Restored> ElasticState::restore(Communicator* comm, torch::nn::Module& model,
                                                            torch::optim::Optimizer& opt) {
  refuse_sharding("restore");
  int64_t mine = -1;
  std::string bytes;
  const fs::path file = fs::path(dir_) / "commit.pt";
  if (enabled() && fs::exists(file)) {
    try {
      std::ifstream f(file, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(f), {});
      torch::serialize::InputArchive ar;
      ar.load_from(bytes.data(), bytes.size(), torch::kCPU);
      torch::Tensor s;
      ar.read("step", s);
      mine = s.item<int64_t>();
    } catch (const std::exception& e) {  // the other machines' commits still count: stay in the collectives
      log_warn(std::string("elastic: this machine's commit cannot be read, so it is left out: ") + e.what());
      bytes.clear();
    }
  }
  auto params = model.parameters();
  const torch::Device device = params.empty() ? torch::Device(torch::kCPU) : params[0].device();
  int64_t newest = mine, root = 0;
  if (comm && comm->size() > 1) {
    // On the model's device: a GPU backend (nccl) takes device buffers only.
    const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(device);
    auto reduce = [&](int64_t v, ReduceOp op) {
      auto t = torch::full({1}, v, i64);
      comm->allreduce(device_view(t), op)->wait();
      return t.item<int64_t>();
    };
    newest = reduce(mine, ReduceOp::Max);
    if (newest < 0) return std::nullopt;
    root = reduce(mine == newest ? comm->rank() : std::numeric_limits<int64_t>::max(), ReduceOp::Min);
    auto size = torch::full({1}, static_cast<int64_t>(bytes.size()), i64);
    comm->broadcast(device_view(size), static_cast<int>(root))->wait();
    auto data = torch::empty({size.item<int64_t>()}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
    if (comm->rank() == root) data.copy_(torch::from_blob(bytes.data(), {data.numel()}, torch::kUInt8));
    comm->broadcast(device_view(data), static_cast<int>(root))->wait();
    data = data.to(torch::kCPU).contiguous();
    bytes.assign(reinterpret_cast<const char*>(data.data_ptr<uint8_t>()), static_cast<size_t>(data.numel()));
  } else if (newest < 0) {
    return std::nullopt;
  }

  torch::serialize::InputArchive ar, m, o;
  ar.load_from(bytes.data(), bytes.size(), device);
  ar.read("model", m);
  ar.read("optimizer", o);
  model.load(m);
  opt.load(o);
  Restored r;
  torch::Tensor s, e;
  ar.read("step", s);
  ar.read("extra", e);
  r.step = s.item<int64_t>();
  e = e.to(torch::kCPU).contiguous();
  r.extra.assign(reinterpret_cast<const char*>(e.data_ptr<uint8_t>()), static_cast<size_t>(e.numel()));
  r.from_rank = static_cast<int>(root);
  return r;
}

}  // namespace dtrain::fleet
