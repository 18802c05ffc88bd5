#include "dtrain/strategy.h"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "dtrain/config_table.h"
#include "dtrain/error.h"

namespace dtrain {

namespace {

[[noreturn]] void bad_value(const Config& config, const std::string& key, const std::string& message) {
  ConfigLocation loc = config.location_of(key);
  throw ConfigError(loc.file, loc.line, loc.column, key, message);
}

}  // namespace

namespace {

// The [strategy] keys, bound to StrategyOptions: the defaults are its initializers.
const ConfigTable<StrategyOptions>& strategy_table() {
  static const ConfigTable<StrategyOptions> table = [] {
    using S = StrategyOptions;
    ConfigTable<S> t;
    t.add("strategy.fuse_all_reduce_ops", &S::fuse_all_reduce_ops,
          "group gradients into buckets that are all-reduced as soon as they are ready");
    t.add("strategy.fuse_grad_size_in_MB", &S::fuse_grad_size_in_MB, "bucket capacity in MiB");
    t.add("strategy.fp16_allreduce", &S::fp16_allreduce, "send gradients as 16-bit floats");
    t.add_read("strategy.fp16_allreduce_dtype", ConfigType::String, "\"f16\"", "\"f16\" or \"bf16\"",
               [](const Config& c, S& o) {
                 const std::string wd = c.get_string("strategy.fp16_allreduce_dtype");
                 if (wd == "f16" || wd == "fp16" || wd == "float16")
                   o.wire_dtype = DType::F16;
                 else if (wd == "bf16" || wd == "bfloat16")
                   o.wire_dtype = DType::BF16;
                 else
                   bad_value(c, "strategy.fp16_allreduce_dtype", "must be \"f16\" or \"bf16\", got \"" + wd + "\"");
               });
    t.add("strategy.gradient_merge.k_steps", &S::gradient_merge_k_steps, "accumulate k micro-steps, then sync")
        .at_least(1);
    t.add("strategy.gradient_merge.avg", &S::gradient_merge_avg, "average (not sum) the merged gradients");
    t.add("strategy.localsgd.k_steps", &S::localsgd_k_steps, "average parameters every k steps (> 1 enables)")
        .at_least(1);
    t.add("strategy.localsgd.begin_step", &S::localsgd_begin_step, "steps of plain synchronous SGD first").at_least(0);
    t.add("strategy.a_sync", &S::a_sync,
          "parameter-server mode: false = sync, true = async (or GEO with a_sync_configs.k_steps > 0)");
    t.add_read("strategy.a_sync_configs.k_steps", ConfigType::Int, "0",
               "parameter-server GEO mode: push deltas and pull every k steps (needs a_sync = true)",
               [](const Config& c, S& o) {
                 const int64_t k = c.get_int("strategy.a_sync_configs.k_steps");
                 if (k > INT32_MAX) bad_value(c, "strategy.a_sync_configs.k_steps", "is too large");
                 o.ps_mode.geo_k_steps = static_cast<int>(k);
               });
    t.at_least(0);
    return t;
  }();
  return table;
}

}  // namespace

void add_strategy_keys(ConfigSchema& s) { strategy_table().declare(s); }

size_t StrategyOptions::bucket_bytes() const {
  double b = fuse_grad_size_in_MB * 1024.0 * 1024.0;
  return b < 1 ? 1 : static_cast<size_t>(b);
}

StrategyOptions StrategyOptions::from_config(const Config& c) {
  StrategyOptions o = strategy_table().read(c);
  if (!(o.fuse_grad_size_in_MB > 0)) bad_value(c, "strategy.fuse_grad_size_in_MB", "must be > 0");
  if (o.localsgd() && o.gradient_merge_k_steps > 1)
    bad_value(c, "strategy.localsgd.k_steps", "local SGD and gradient_merge cannot be combined; set one of them to 1");
  const int k = o.ps_mode.geo_k_steps;
  if (k > 0 && !o.a_sync)
    bad_value(
        c, "strategy.a_sync_configs.k_steps",
        "k_steps = " + std::to_string(k) + " selects GEO mode, which needs a_sync = true (a_sync = false is sync)");
  o.ps_mode.mode = !o.a_sync ? ps::Mode::Sync : (k > 0 ? ps::Mode::Geo : ps::Mode::Async);
  if (o.a_sync && o.gradient_merge_k_steps > 1)
    bad_value(
        c, "strategy.gradient_merge.k_steps",
        "gradient_merge is collective training; it cannot be combined with a_sync = true (parameter-server mode)");
  if (o.a_sync && o.localsgd())
    bad_value(c, "strategy.localsgd.k_steps",
              "local SGD is collective training; it cannot be combined with a_sync = true (parameter-server mode)");
  return o;
}

std::string StrategyOptions::describe() const {
  std::ostringstream os;
  os << "fuse_all_reduce_ops=" << (fuse_all_reduce_ops ? "true" : "false")
     << " fuse_grad_size_in_MB=" << fuse_grad_size_in_MB
     << " fp16_allreduce=" << (fp16_allreduce ? dtype_name(wire_dtype) : "false")
     << " gradient_merge.k_steps=" << gradient_merge_k_steps << " localsgd.k_steps=" << localsgd_k_steps;
  if (a_sync) {
    os << " a_sync=true (ps " << ps::to_string(ps_mode.mode);
    if (ps_mode.mode == ps::Mode::Geo) os << ", k_steps=" << ps_mode.geo_k_steps;
    os << ")";
  }
  return os.str();
}

bool Strategy::sync_gradients_at(int64_t step) const {
  if (options_.localsgd() && step >= options_.localsgd_begin_step) return false;
  return optimizer_step_at(step);
}

bool Strategy::optimizer_step_at(int64_t step) const { return (step + 1) % options_.gradient_merge_k_steps == 0; }

double Strategy::gradient_scale() const {
  return options_.gradient_merge_avg ? 1.0 / options_.gradient_merge_k_steps : 1.0;
}

bool Strategy::average_parameters_at(int64_t step) const {
  if (!options_.localsgd() || step < options_.localsgd_begin_step) return false;
  return (step + 1) % options_.localsgd_k_steps == 0;
}

}  // namespace dtrain
