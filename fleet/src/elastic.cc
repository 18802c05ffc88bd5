#include "dtrain/fleet/elastic.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "dtrain/communicator.h"
#include "dtrain/error.h"

namespace dtrain::fleet {

namespace {

namespace fs = std::filesystem;

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : 0;
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
  if (!enabled() || local_rank_ != 0) return;
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
  write_atomically(fs::path(dir_) / "step", std::to_string(generation_) + " " + std::to_string(step) + "\n");
}

std::optional<ElasticState::Restored> ElasticState::restore(Communicator* comm, torch::nn::Module& model,
                                                            torch::optim::Optimizer& opt) {
  int64_t mine = -1;
  std::string bytes;
  const fs::path file = fs::path(dir_) / "commit.pt";
  if (enabled() && fs::exists(file)) {
    std::ifstream f(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
    torch::serialize::InputArchive ar;
    ar.load_from(bytes.data(), bytes.size(), torch::kCPU);
    torch::Tensor s;
    ar.read("step", s);
    mine = s.item<int64_t>();
  }
  int64_t newest = mine, root = 0;
  if (comm && comm->size() > 1) {
    comm->allreduce(Buffer::of(&newest, 1), ReduceOp::Max)->wait();
    if (newest < 0) return std::nullopt;
    root = mine == newest ? comm->rank() : std::numeric_limits<int64_t>::max();
    comm->allreduce(Buffer::of(&root, 1), ReduceOp::Min)->wait();
    int64_t size = static_cast<int64_t>(bytes.size());
    comm->broadcast(Buffer::of(&size, 1), static_cast<int>(root))->wait();
    bytes.resize(static_cast<size_t>(size));
    comm->broadcast(Buffer::of(reinterpret_cast<uint8_t*>(bytes.data()), bytes.size()), static_cast<int>(root))->wait();
  } else if (newest < 0) {
    return std::nullopt;
  }

  auto params = model.parameters();
  torch::serialize::InputArchive ar, m, o;
  ar.load_from(bytes.data(), bytes.size(), params.empty() ? torch::Device(torch::kCPU) : params[0].device());
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
