#include "common/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/error.h"
#include "dtrain/fleet/sharding.h"

namespace fs = std::filesystem;

namespace dtrain::apps {

namespace {

void fsync_path(const std::string& path, bool dir) {
  int fd = ::open(path.c_str(), dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw IoError("cannot open '" + path + "' to sync it: " + std::strerror(errno));
  ::fsync(fd);
  ::close(fd);
}

// The run state and the CPU generator's state.
void write_run_state(torch::serialize::OutputArchive& ar, const RunState& st) {
  ar.write("epoch", torch::tensor(st.epoch, torch::kInt64));
  ar.write("batch_in_epoch", torch::tensor(st.batch_in_epoch, torch::kInt64));
  ar.write("global_step", torch::tensor(st.global_step, torch::kInt64));
  ar.write("epoch_offset", torch::tensor(st.epoch_offset, torch::kInt64));
  ar.write("base_world", torch::tensor(st.base_world, torch::kInt64));
  ar.write("run_world", torch::tensor(st.world, torch::kInt64));
  ar.write("run_batch", torch::tensor(st.batch, torch::kInt64));
  if (st.has_loss_scale)
    ar.write("loss_scale",
             torch::tensor({st.loss_scale.scale, double(st.loss_scale.good_steps), double(st.loss_scale.bad_steps)},
                           torch::kFloat64));
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lk(gen.mutex());
  ar.write("rng", gen.get_state());
}

// The run state and the CPU generator's state.
RunState read_run_state(torch::serialize::InputArchive& ar) {
  auto read_int = [&](const char* key) {
    torch::Tensor t;
    ar.read(key, t);
    return t.item<int64_t>();
  };
  RunState st;
  st.epoch = read_int("epoch");
  st.batch_in_epoch = read_int("batch_in_epoch");
  st.global_step = read_int("global_step");
  torch::Tensor t;
  if (ar.try_read("epoch_offset", t)) st.epoch_offset = t.item<int64_t>();
  if (ar.try_read("base_world", t)) st.base_world = t.item<int64_t>();
  if (ar.try_read("run_world", t)) st.world = t.item<int64_t>();
  if (ar.try_read("run_batch", t)) st.batch = t.item<int64_t>();
  torch::Tensor ls;
  if (ar.try_read("loss_scale", ls)) {
    st.has_loss_scale = true;
    st.loss_scale.scale = ls[0].item<double>();
    st.loss_scale.good_steps = static_cast<int64_t>(ls[1].item<double>());
    st.loss_scale.bad_steps = static_cast<int64_t>(ls[2].item<double>());
  }
  torch::Tensor rng;
  ar.read("rng", rng);
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lk(gen.mutex());
  gen.set_state(rng);
  return st;
}

}  // namespace

std::string run_state_bytes(const RunState& st) {
  torch::serialize::OutputArchive ar;
  write_run_state(ar, st);
  std::ostringstream out;
  ar.save_to(out);
  return out.str();
}

RunState run_state_from_bytes(const std::string& bytes) {
  torch::serialize::InputArchive ar;
  ar.load_from(bytes.data(), bytes.size(), torch::Device(torch::kCPU));
  return read_run_state(ar);
}

void save_checkpoint(const std::string& dir, torch::nn::Module& model, torch::optim::Optimizer& opt, const RunState& st,
                     int world) {
  fs::create_directories(dir);
  std::string final_path = (fs::path(dir) / "latest.pt").string();
  std::string tmp = final_path + ".tmp." + std::to_string(getpid());
  torch::serialize::OutputArchive ar, m, o;
  model.save(m);
  opt.save(o);
  ar.write("model", m);
  ar.write("optimizer", o);
  ar.write("world_size", torch::tensor(int64_t(world), torch::kInt64));
  write_run_state(ar, st);
  ar.save_to(tmp);
  fsync_path(tmp, false);
  fs::rename(tmp, final_path);
  fsync_path(dir, true);
}

RunState load_checkpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& opt) {
  torch::serialize::InputArchive ar, m, o;
  auto params = model.parameters();
  ar.load_from(path, params.empty() ? torch::Device(torch::kCPU) : params[0].device());  // onto the model's device
  ar.read("model", m);
  ar.read("optimizer", o);
  model.load(m);
  opt.load(o);
  return read_run_state(ar);
}

void load_model_weights(std::string path, const std::string& checkpoint_dir, torch::nn::Module& model) {
  if (path.empty()) path = (fs::path(checkpoint_dir) / "latest.pt").string();
  if (!fs::exists(path)) throw IoError("checkpoint '" + path + "' does not exist (train first, or --checkpoint)");
  torch::serialize::InputArchive ar, m;
  ar.load_from(path, torch::Device(torch::kCPU));
  ar.read("model", m);
  model.load(m);
}

void save_sharded_checkpoint(const std::string& dir, fleet::DataParallel& dp, torch::optim::Optimizer& opt,
                             const RunState& st, int rank, int world) {
  const std::string name = "sharded-" + std::to_string(st.global_step);
  const fs::path folder = fs::path(dir) / name;
  fs::create_directories(folder);
  torch::serialize::OutputArchive ar;
  fleet::save_shard(ar, *dp.sharding(), opt);
  for (auto& kv : dp.module()->named_buffers()) ar.write("buffers/" + kv.key(), kv.value().cpu(), true);
  write_run_state(ar, st);
  const std::string path = (folder / ("rank-" + std::to_string(rank) + ".pt")).string();
  ar.save_to(path + ".tmp");
  fsync_path(path + ".tmp", false);
  fs::rename(path + ".tmp", path);
  fsync_path(folder.string(), true);
  std::vector<double> done{1.0};
  dp.allreduce_sum(done);  // every rank's file is in place
  if (rank != 0) return;
  const std::string pointer = (fs::path(dir) / "latest-sharded").string();
  {
    std::ofstream out(pointer + ".tmp");
    out << name << "\n" << world << "\n";
    if (!out) throw IoError("cannot write '" + pointer + ".tmp'");
  }
  fsync_path(pointer + ".tmp", false);
  fs::rename(pointer + ".tmp", pointer);
  fsync_path(dir, true);
  for (auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("sharded-", 0) == 0 && n != name) fs::remove_all(e.path());
  }
}

std::string latest_sharded_checkpoint(const std::string& dir) {
  std::ifstream in((fs::path(dir) / "latest-sharded").string());
  std::string name;
  if (!(in >> name)) return "";
  return (fs::path(dir) / name).string();
}

std::vector<torch::serialize::InputArchive> read_shard_archives(const std::string& folder) {
  std::vector<torch::serialize::InputArchive> ars;
  for (int r = 0;; ++r) {
    const fs::path f = fs::path(folder) / ("rank-" + std::to_string(r) + ".pt");
    if (!fs::exists(f)) break;
    ars.emplace_back();
    ars.back().load_from(f.string(), torch::Device(torch::kCPU));
  }
  if (ars.empty()) throw IoError("sharded checkpoint '" + folder + "' holds no rank-0.pt");
  return ars;
}

namespace {

void load_buffers(torch::serialize::InputArchive& ar, torch::nn::Module& model) {
  torch::NoGradGuard ng;
  for (auto& kv : model.named_buffers()) {
    torch::Tensor t;
    ar.read("buffers/" + kv.key(), t, true);
    kv.value().copy_(t);
  }
}

}  // namespace

void load_shards_whole(std::vector<torch::serialize::InputArchive>& ars, torch::nn::Module& model,
                       torch::optim::Optimizer& opt) {
  fleet::load_shards_unsharded(ars, model, opt);
  load_buffers(ars.at(0), model);
}

RunState load_sharded_checkpoint(const std::string& folder, fleet::DataParallel& dp, torch::optim::Optimizer& opt) {
  auto ars = read_shard_archives(folder);
  if (dp.sharding()) {
    fleet::load_shards(ars, *dp.sharding(), opt);
    load_buffers(ars[0], *dp.module());
  } else {
    load_shards_whole(ars, *dp.module(), opt);
  }
  return read_run_state(ars[0]);
}

namespace {

// The tensors of a checkpoint's model by dotted name: latest.pt's nested
// module archive, or a sharded checkpoint put together whole.
std::map<std::string, torch::Tensor> checkpoint_tensors(const std::string& path, torch::nn::Module& like) {
  std::map<std::string, torch::Tensor> out;
  if (fs::is_directory(path)) {
    auto ars = read_shard_archives(path);
    std::map<std::string, torch::Tensor> params;
    for (auto& kv : like.named_parameters()) params[kv.key()] = kv.value();
    // Slices are saved flat: a tensor of the model's element count takes its shape.
    for (auto& [name, t] : fleet::whole_parameters(ars)) {
      auto p = params.find(name);
      out[name] = p != params.end() && p->second.numel() == t.numel() ? t.view(p->second.sizes()) : t;
    }
    for (auto& kv : like.named_buffers()) {
      torch::Tensor t;
      if (ars[0].try_read("buffers/" + kv.key(), t, true)) out[kv.key()] = t;
    }
    return out;
  }
  torch::serialize::InputArchive ar, m;
  ar.load_from(path, torch::Device(torch::kCPU));
  if (!ar.try_read("model", m)) throw IoError("'" + path + "' is not a dtrain checkpoint (no model in it)");
  std::function<void(torch::serialize::InputArchive&, const std::string&)> walk = [&](torch::serialize::InputArchive& a,
                                                                                      const std::string& prefix) {
    for (const auto& k : a.keys()) {
      torch::Tensor t;
      if (a.try_read(k, t) || a.try_read(k, t, true)) {
        out[prefix + k] = t;
        continue;
      }
      torch::serialize::InputArchive child;
      if (a.try_read(k, child)) walk(child, prefix + k + ".");
    }
  };
  walk(m, "");
  return out;
}

// "a.* (3), b.* (12)": names grouped by their first component, in order of first appearance.
std::string grouped(const std::vector<std::string>& names) {
  std::vector<std::pair<std::string, int>> groups;
  for (const auto& n : names) {
    std::string head = n.substr(0, n.find('.'));
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == head; });
    if (g == groups.end()) g = groups.emplace(groups.end(), head, 0);
    ++g->second;
  }
  std::vector<std::string> parts;
  for (const auto& [head, count] : groups) parts.push_back(fmt::format("{}.* ({})", head, count));
  return fmt::format("{}", fmt::join(parts, ", "));
}

// A convolution's weight [out, in, kh, kw] saved for 1 input channel and
// wanted for N, or the other way round.
bool adapts_input_channels(const torch::Tensor& from, const torch::Tensor& to) {
  if (from.dim() != 4 || to.dim() != 4 || from.size(1) == to.size(1) || (from.size(1) != 1 && to.size(1) != 1))
    return false;
  for (int d : {0, 2, 3})
    if (from.size(d) != to.size(d)) return false;
  return true;
}

}  // namespace

std::string load_pretrained(const std::string& path, torch::nn::Module& model) {
  auto saved = checkpoint_tensors(path, model);
  std::vector<std::string> mismatched, missing, adapted;
  int loaded = 0;
  torch::NoGradGuard ng;
  auto take = [&](const std::string& name, torch::Tensor& t) {
    auto it = saved.find(name);
    if (it == saved.end()) {
      missing.push_back(name);
      return;
    }
    const torch::Tensor& from = it->second;
    if (from.sizes() == t.sizes()) {
      t.copy_(from);
      ++loaded;
    } else if (adapts_input_channels(from, t)) {
      // timm's adapt_input_conv: a grey stem into a colour model (the weights spread over the channels) or back.
      t.copy_(from.size(1) == 1 ? from.repeat({1, t.size(1), 1, 1}) / double(t.size(1)) : from.sum(1, true));
      ++loaded;
      adapted.push_back(fmt::format("{} from {} to {} input channels", name, from.size(1), t.size(1)));
    } else {
      mismatched.push_back(
          fmt::format("{} [{}] (checkpoint [{}])", name, fmt::join(t.sizes(), ", "), fmt::join(from.sizes(), ", ")));
    }
    saved.erase(it);
  };
  for (auto& kv : model.named_parameters()) take(kv.key(), kv.value());
  for (auto& kv : model.named_buffers()) take(kv.key(), kv.value());
  if (loaded == 0)
    throw InvalidUsage("model.pretrained: not one tensor of '" + path +
                       "' matches this model by name and shape (is it another app's or model's checkpoint?)");
  std::vector<std::string> unused;
  for (const auto& kv : saved) unused.push_back(kv.first);
  std::string line = fmt::format("pretrained: {} tensors from {}", loaded, path);
  if (!adapted.empty()) line += fmt::format("; adapted {}", fmt::join(adapted, ", "));
  if (!mismatched.empty()) line += fmt::format("; skipped {}", fmt::join(mismatched, ", "));
  if (!missing.empty()) line += "; not in the checkpoint (initial values kept): " + grouped(missing);
  if (!unused.empty()) line += "; not in this model: " + grouped(unused);
  return line;
}

uint64_t dump_parameters(std::string path, int rank, torch::nn::Module& model) {
  for (size_t p; (p = path.find("{rank}")) != std::string::npos;) path.replace(p, 6, std::to_string(rank));
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  uint64_t h = 1469598103934665603ULL;
  for (auto& kv : model.named_parameters()) {
    auto t = kv.value().to(torch::kCPU).contiguous();
    const char* p = static_cast<const char*>(t.data_ptr());
    size_t n = static_cast<size_t>(t.numel()) * t.element_size();
    out.write(p, static_cast<std::streamsize>(n));
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint8_t>(p[i])) * 1099511628211ULL;
  }
  if (!out) throw IoError("cannot write '" + path + "'");
  return h;
}

}  // namespace dtrain::apps
