// ZeRO's optimizer state and sharded checkpoints: each rank saves the state of
// its own slices; load() consolidates the slices of any world size.
#include "dtrain/fleet/sharding.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/fleet/optimizers.h"
#include "tensor_buffer.h"

namespace dtrain::fleet {

namespace {

using detail::clipped;

std::string state_kind(const ::torch::optim::OptimizerParamState& s) {
  if (dynamic_cast<const ::torch::optim::SGDParamState*>(&s)) return "sgd";
  if (dynamic_cast<const ::torch::optim::AdamParamState*>(&s)) return "adam";
  if (dynamic_cast<const ::torch::optim::AdamWParamState*>(&s)) return "adamw";
  if (dynamic_cast<const ::torch::optim::AdagradParamState*>(&s)) return "adagrad";
  if (dynamic_cast<const ::torch::optim::RMSpropParamState*>(&s)) return "rmsprop";
  if (dynamic_cast<const LambParamState*>(&s)) return "lamb";
  if (dynamic_cast<const LarsParamState*>(&s)) return "lars";
  throw NotSupported(
      "sharded checkpoints know the state of SGD, Adam, AdamW, Adagrad, RMSprop, LAMB and LARS; this optimizer's "
      "state is another kind");
}

std::unique_ptr<::torch::optim::OptimizerParamState> make_state(const std::string& kind) {
  if (kind == "sgd") return std::make_unique<::torch::optim::SGDParamState>();
  if (kind == "adam") return std::make_unique<::torch::optim::AdamParamState>();
  if (kind == "adamw") return std::make_unique<::torch::optim::AdamWParamState>();
  if (kind == "adagrad") return std::make_unique<::torch::optim::AdagradParamState>();
  if (kind == "rmsprop") return std::make_unique<::torch::optim::RMSpropParamState>();
  if (kind == "lamb") return std::make_unique<LambParamState>();
  if (kind == "lars") return std::make_unique<LarsParamState>();
  throw InvalidUsage("sharded checkpoint: unknown optimizer state kind '" + kind + "'");
}

// An optimizer state's entries by name, through its own serialize().
std::vector<std::pair<std::string, c10::IValue>> state_entries(const ::torch::optim::OptimizerParamState& s) {
  ::torch::serialize::OutputArchive out;
  s.serialize(out);
  std::ostringstream os;
  out.save_to(os);
  std::istringstream is(os.str());
  ::torch::serialize::InputArchive in;
  in.load_from(is);
  std::vector<std::pair<std::string, c10::IValue>> entries;
  for (const auto& k : in.keys()) {
    ::torch::Tensor t;
    if (in.try_read(k, t, /*is_buffer=*/true) || in.try_read(k, t)) {
      entries.emplace_back(k, t);
      continue;
    }
    c10::IValue v;
    if (in.try_read(k, v)) entries.emplace_back(k, v);
  }
  return entries;
}

void set_state(::torch::optim::Optimizer& opt, const ::torch::Tensor& param, const std::string& kind,
               const std::vector<std::pair<std::string, c10::IValue>>& entries) {
  ::torch::serialize::OutputArchive out;
  for (const auto& [k, v] : entries) {
    if (v.isTensor())
      out.write(k, v.toTensor(), /*is_buffer=*/true);
    else
      out.write(k, v);
  }
  std::ostringstream os;
  out.save_to(os);
  std::istringstream is(os.str());
  ::torch::serialize::InputArchive in;
  in.load_from(is);
  auto st = make_state(kind);
  st->serialize(in);
  opt.state()[optimizer_state_key(param)] = std::move(st);
}

int64_t read_int(::torch::serialize::InputArchive& ar, const std::string& key) {
  c10::IValue v;
  if (!ar.try_read(key, v)) throw InvalidUsage("sharded checkpoint: entry '" + key + "' is missing");
  return v.toInt();
}

std::string read_string(::torch::serialize::InputArchive& ar, const std::string& key) {
  c10::IValue v;
  if (!ar.try_read(key, v)) return "";
  return v.toStringRef();
}

std::string key_of(size_t i, const char* what) { return "shard/" + std::to_string(i) + "/" + what; }

// One parameter's whole value and optimizer state, put together from the slices of N archives.
struct Whole {
  ::torch::Tensor value;
  std::string kind;  // "" without optimizer state
  std::vector<std::pair<std::string, c10::IValue>> state;
};

Whole consolidate(std::vector<::torch::serialize::InputArchive>& ars, size_t i, int64_t numel) {
  Whole w;
  std::vector<::torch::Tensor> slices;
  std::vector<std::vector<std::pair<std::string, c10::IValue>>> states;
  for (auto& ar : ars) {
    ::torch::Tensor s;
    ar.read(key_of(i, "value"), s);
    slices.push_back(s);
    std::string kind = read_string(ar, key_of(i, "kind"));
    if (!kind.empty()) {
      w.kind = kind;
      ::torch::serialize::InputArchive st;
      ar.read(key_of(i, "state"), st);
      std::vector<std::pair<std::string, c10::IValue>> e;
      for (const auto& k : st.keys()) {
        ::torch::Tensor t;
        if (st.try_read(k, t, true) || st.try_read(k, t)) {
          e.emplace_back(k, t);
          continue;
        }
        c10::IValue v;
        if (st.try_read(k, v)) e.emplace_back(k, v);
      }
      states.push_back(std::move(e));
    }
  }
  w.value = ::torch::cat(slices).narrow(0, 0, numel);
  if (!w.kind.empty()) {
    if (states.size() != ars.size())
      throw InvalidUsage("sharded checkpoint: parameter " + std::to_string(i) +
                         " has optimizer state in some ranks' files only");
    for (size_t e = 0; e < states[0].size(); ++e) {
      const auto& [k, v] = states[0][e];
      // Rank 0's slice is the longest: ranks after it may hold fewer elements (stages 1-2) or padding (stage 3).
      if (v.isTensor() && v.toTensor().dim() == 1 && v.toTensor().numel() == slices[0].numel()) {
        std::vector<::torch::Tensor> parts;
        for (auto& s : states) parts.push_back(s[e].second.toTensor());
        w.state.emplace_back(k, ::torch::cat(parts).narrow(0, 0, numel));
      } else {
        w.state.emplace_back(k, v);  // a step count or a scalar: the same on every rank
      }
    }
  }
  return w;
}

// Checks the archives are the ranks 0..N-1 of one save and describe `count` parameters.
int64_t check_archives(std::vector<::torch::serialize::InputArchive>& ars, size_t count) {
  if (ars.empty()) throw InvalidUsage("sharded checkpoint: no files");
  const int64_t n = read_int(ars[0], "shard/world");
  if (static_cast<int64_t>(ars.size()) != n)
    throw InvalidUsage("sharded checkpoint: saved by " + std::to_string(n) + " ranks, but " +
                       std::to_string(ars.size()) + " files were given");
  for (size_t r = 0; r < ars.size(); ++r) {
    if (read_int(ars[r], "shard/rank") != static_cast<int64_t>(r) || read_int(ars[r], "shard/world") != n)
      throw InvalidUsage("sharded checkpoint: file " + std::to_string(r) + " is not rank " + std::to_string(r) +
                         " of " + std::to_string(n));
    if (read_int(ars[r], "shard/count") != static_cast<int64_t>(count))
      throw InvalidUsage("sharded checkpoint: it holds " + std::to_string(read_int(ars[r], "shard/count")) +
                         " parameters, this model has " + std::to_string(count));
  }
  return n;
}

void check_param(std::vector<::torch::serialize::InputArchive>& ars, size_t i, const std::string& name, int64_t numel) {
  const std::string saved = read_string(ars[0], key_of(i, "name"));
  const int64_t saved_numel = read_int(ars[0], key_of(i, "numel"));
  if (saved != name || saved_numel != numel)
    throw InvalidUsage("sharded checkpoint: parameter " + std::to_string(i) + " is '" + saved + "' (" +
                       std::to_string(saved_numel) + " elements) in the checkpoint, '" + name + "' (" +
                       std::to_string(numel) + ") in this model");
}

}  // namespace

void save_shard(::torch::serialize::OutputArchive& ar, const ShardedParameters& sp, ::torch::optim::Optimizer& opt) {
  ar.write("shard/world", c10::IValue(static_cast<int64_t>(sp.world())));
  ar.write("shard/rank", c10::IValue(static_cast<int64_t>(sp.rank())));
  ar.write("shard/count", c10::IValue(static_cast<int64_t>(sp.size())));
  for (size_t i = 0; i < sp.size(); ++i) {
    ar.write(key_of(i, "name"), c10::IValue(sp.name(i)));
    ar.write(key_of(i, "numel"), c10::IValue(sp.numel(i)));
    ar.write(key_of(i, "shape"), c10::IValue(sp.parameter(i).sizes().vec()));
    ar.write(key_of(i, "value"), sp.shard(i).detach().cpu(), /*is_buffer=*/true);
    auto it = opt.state().find(optimizer_state_key(sp.shard(i)));
    if (it == opt.state().end()) continue;
    ar.write(key_of(i, "kind"), c10::IValue(state_kind(*it->second)));
    ::torch::serialize::OutputArchive st;
    it->second->serialize(st);
    ar.write(key_of(i, "state"), st);
  }
}

void load_shards(std::vector<::torch::serialize::InputArchive>& ars, ShardedParameters& sp,
                 ::torch::optim::Optimizer& opt) {
  check_archives(ars, sp.size());
  ::torch::NoGradGuard ng;
  for (size_t i = 0; i < sp.size(); ++i) {
    check_param(ars, i, sp.name(i), sp.numel(i));
    Whole w = consolidate(ars, i, sp.numel(i));
    auto shard = sp.shard(i);
    const int64_t per = sp.slice_numel(i), from = sp.rank() * per;
    const int64_t len = std::min(clipped(sp.numel(i), from, per), shard.numel());
    auto slice = [&](const ::torch::Tensor& whole) {
      auto s = ::torch::zeros({shard.numel()}, whole.options());
      if (len > 0) s.narrow(0, 0, len).copy_(whole.narrow(0, from, len));
      return s;
    };
    shard.copy_(slice(w.value).to(shard.device()));
    if (w.kind.empty()) {
      opt.state().erase(optimizer_state_key(shard));
      continue;
    }
    for (auto& [k, v] : w.state)
      if (v.isTensor() && v.toTensor().dim() == 1 && v.toTensor().numel() == sp.numel(i))
        v = slice(v.toTensor()).to(shard.device());
    set_state(opt, shard, w.kind, w.state);
  }
  sp.after_step();
}

void load_shards_unsharded(std::vector<::torch::serialize::InputArchive>& ars, ::torch::nn::Module& model,
                           ::torch::optim::Optimizer& opt) {
  std::vector<std::pair<std::string, ::torch::Tensor>> params;
  for (auto& kv : model.named_parameters())
    if (kv.value().requires_grad()) params.emplace_back(kv.key(), kv.value());
  check_archives(ars, params.size());
  ::torch::NoGradGuard ng;
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i].second;
    check_param(ars, i, params[i].first, p.numel());
    Whole w = consolidate(ars, i, p.numel());
    p.copy_(w.value.view(p.sizes()));
    if (w.kind.empty()) {
      opt.state().erase(optimizer_state_key(p));
      continue;
    }
    for (auto& [k, v] : w.state)
      if (v.isTensor() && v.toTensor().dim() == 1 && v.toTensor().numel() == p.numel())
        v = v.toTensor().view(p.sizes()).to(p.device());
    set_state(opt, p, w.kind, w.state);
  }
}

std::vector<std::pair<std::string, ::torch::Tensor>> whole_parameters(
    std::vector<::torch::serialize::InputArchive>& ars) {
  if (ars.empty()) throw InvalidUsage("sharded checkpoint: no files");
  const int64_t count = read_int(ars[0], "shard/count");
  check_archives(ars, static_cast<size_t>(count));
  std::vector<std::pair<std::string, ::torch::Tensor>> out;
  for (size_t i = 0; i < static_cast<size_t>(count); ++i) {
    auto value = consolidate(ars, i, read_int(ars[0], key_of(i, "numel"))).value;
    c10::IValue shape;
    if (ars[0].try_read(key_of(i, "shape"), shape)) value = value.view(shape.toIntVector());
    out.emplace_back(read_string(ars[0], key_of(i, "name")), value);
  }
  return out;
}

int64_t optimizer_state_bytes(::torch::optim::Optimizer& opt) {
  int64_t bytes = 0;
  for (auto& g : opt.param_groups())
    for (auto& p : g.params()) {
      auto it = opt.state().find(optimizer_state_key(p));
      if (it == opt.state().end()) continue;
      for (auto& [k, v] : state_entries(*it->second))
        if (v.isTensor()) bytes += v.toTensor().numel() * static_cast<int64_t>(v.toTensor().element_size());
    }
  return bytes;
}

}  // namespace dtrain::fleet
