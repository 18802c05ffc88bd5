#include "dtrain/strategy.h"

#include <algorithm>
#include <cmath>
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
    t.add_read("strategy.a_sync_configs.send_queue_size", ConfigType::Int, "1",
               "async: pushes of a table in flight while training goes on (0: wait for each; the next batch's rows "
               "are then not pulled ahead either)",
               [](const Config& c, S& o) {
                 o.ps_mode.send_queue_size = static_cast<int>(c.get_int("strategy.a_sync_configs.send_queue_size"));
               });
    t.in_range(0, 1024);
    t.add("strategy.sharding", &S::sharding,
          "ZeRO: split optimizer state (stage 1), gradients (2) and parameters (3) over the workers");
    t.add("strategy.sharding_configs.stage", &S::sharding_stage, "1, 2 or 3").in_range(1, 3);
    t.add("strategy.amp", &S::amp, "automatic mixed precision: autocast, and loss scaling with float16");
    t.add("strategy.amp_configs.init_loss_scaling", &S::amp_init_loss_scaling, "the first loss scale").at_least(1);
    t.add("strategy.amp_configs.incr_every_n_steps", &S::amp_incr_every_n_steps,
          "grow the scale after this many finite steps in a row")
        .at_least(1);
    t.add("strategy.amp_configs.decr_every_n_nan_or_inf", &S::amp_decr_every_n_nan_or_inf,
          "shrink the scale after this many steps with inf/NaN gradients")
        .at_least(1);
    t.add("strategy.amp_configs.incr_ratio", &S::amp_incr_ratio, "growth factor").at_least(1);
    t.add("strategy.amp_configs.decr_ratio", &S::amp_decr_ratio, "shrink factor").in_range(0, 1);
    t.add("strategy.amp_configs.use_dynamic_loss_scaling", &S::amp_use_dynamic_loss_scaling,
          "false: keep init_loss_scaling");
    t.add_read("strategy.amp_configs.dtype", ConfigType::String, "\"float16\"", "\"float16\" or \"bfloat16\"",
               [](const Config& c, S& o) {
                 const std::string d = c.get_string("strategy.amp_configs.dtype");
                 if (d == "float16" || d == "fp16" || d == "f16")
                   o.amp_dtype = DType::F16;
                 else if (d == "bfloat16" || d == "bf16")
                   o.amp_dtype = DType::BF16;
                 else
                   bad_value(c, "strategy.amp_configs.dtype", "must be \"float16\" or \"bfloat16\", got \"" + d + "\"");
               });
    t.add("strategy.recompute", &S::recompute, "activation checkpointing: blocks keep no activations in forward");
    t.add("strategy.recompute_configs.checkpoints", &S::recompute_checkpoints,
          "names of the modules to recompute (empty: every block the model declares)");
    t.add("strategy.lamb", &S::lamb, "the Adam optimizer becomes LAMB (layer-wise trust ratio)");
    t.add("strategy.lamb_configs.lamb_weight_decay", &S::lamb_weight_decay, "LAMB's decoupled weight decay")
        .at_least(0);
    t.add("strategy.lamb_configs.exclude_from_weight_decay", &S::lamb_exclude_from_weight_decay,
          "parameters whose name contains one of these get no weight decay");
    t.add("strategy.lars", &S::lars, "the Momentum optimizer becomes LARS (layer-wise trust ratio)");
    t.add("strategy.lars_configs.lars_coeff", &S::lars_coeff, "trust coefficient").at_least(0);
    t.add("strategy.lars_configs.lars_weight_decay", &S::lars_weight_decay, "LARS weight decay").at_least(0);
    t.add("strategy.lars_configs.epsilon", &S::lars_epsilon, "added to the trust ratio's denominator").at_least(0);
    t.add("strategy.lars_configs.exclude_from_weight_decay", &S::lars_exclude_from_weight_decay,
          "parameters whose name contains one of these get no weight decay");
    t.add("strategy.sync_batch_norm", &S::sync_batch_norm, "BatchNorm statistics over every worker's batch");
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

ps::ModeOptions StrategyOptions::resolved_ps_mode() const {
  const int k = ps_mode.geo_k_steps, q = ps_mode.send_queue_size;
  if (k < 0) throw InvalidUsage("strategy.a_sync_configs.k_steps = " + std::to_string(k) + " must be at least 0");
  if (k > 0 && !a_sync)
    throw InvalidUsage("strategy.a_sync_configs.k_steps = " + std::to_string(k) +
                       " selects GEO mode, which needs a_sync = true (a_sync = false is sync)");
  if (q < 0 || q > 1024)
    throw InvalidUsage("strategy.a_sync_configs.send_queue_size = " + std::to_string(q) + " must be in [0, 1024]");
  ps::ModeOptions m = ps_mode;
  m.mode = !a_sync ? ps::Mode::Sync : (k > 0 ? ps::Mode::Geo : ps::Mode::Async);
  return m;
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
  o.ps_mode = o.resolved_ps_mode();
  if (o.a_sync && o.gradient_merge_k_steps > 1)
    bad_value(
        c, "strategy.gradient_merge.k_steps",
        "gradient_merge is collective training; it cannot be combined with a_sync = true (parameter-server mode)");
  if (o.a_sync && o.localsgd())
    bad_value(c, "strategy.localsgd.k_steps",
              "local SGD is collective training; it cannot be combined with a_sync = true (parameter-server mode)");
  if (o.sharding) {
    if (o.a_sync)
      bad_value(c, "strategy.sharding",
                "sharding splits the model over the workers of a collective job; it cannot be combined with "
                "a_sync = true (parameter-server mode keeps the model on the servers)");
    if (o.localsgd())
      bad_value(c, "strategy.localsgd.k_steps",
                "local SGD keeps a whole model on every worker; it cannot be combined with sharding");
    if (o.sharding_stage > 1 && o.gradient_merge_k_steps > 1)
      bad_value(c, "strategy.gradient_merge.k_steps",
                "gradient_merge keeps whole gradients between steps; it works with sharding stage 1 only (stage " +
                    std::to_string(o.sharding_stage) + " keeps 1/N of them)");
    if (o.fp16_allreduce)
      bad_value(c, "strategy.fp16_allreduce",
                "fp16_allreduce compresses the gradient all-reduce; sharding reduce-scatters f32 gradients "
                "(use amp for 16-bit compute)");
  }
  if (o.lamb && o.lars) bad_value(c, "strategy.lars", "lamb and lars each replace the optimizer; choose one");
  return o;
}

std::string StrategyOptions::describe() const {
  std::ostringstream os;
  os << "fuse_all_reduce_ops=" << (fuse_all_reduce_ops ? "true" : "false")
     << " fuse_grad_size_in_MB=" << fuse_grad_size_in_MB
     << " fp16_allreduce=" << (fp16_allreduce ? dtype_name(wire_dtype) : "false")
     << " gradient_merge.k_steps=" << gradient_merge_k_steps << " localsgd.k_steps=" << localsgd_k_steps;
  if (sharding) os << " sharding=stage" << sharding_stage;
  if (amp) os << " amp=" << (amp_dtype == DType::BF16 ? "bfloat16" : "float16");
  if (recompute)
    os << " recompute="
       << (recompute_checkpoints.empty() ? std::string("all blocks")
                                         : std::to_string(recompute_checkpoints.size()) + " modules");
  if (lamb) os << " lamb";
  if (lars) os << " lars";
  if (sync_batch_norm) os << " sync_batch_norm";
  if (a_sync) {
    os << " a_sync=true (ps " << ps::to_string(ps_mode.mode);
    if (ps_mode.mode == ps::Mode::Geo) os << ", k_steps=" << ps_mode.geo_k_steps;
    if (ps_mode.mode == ps::Mode::Async) os << ", send_queue_size=" << ps_mode.send_queue_size;
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

LossScaler::LossScaler(const StrategyOptions& o)
    : enabled_(o.loss_scaling()),
      dynamic_(o.amp_use_dynamic_loss_scaling),
      incr_ratio_(o.amp_incr_ratio),
      decr_ratio_(o.amp_decr_ratio),
      incr_every_(o.amp_incr_every_n_steps),
      decr_every_(o.amp_decr_every_n_nan_or_inf) {
  state_.scale = enabled_ ? o.amp_init_loss_scaling : 1.0;
}

bool LossScaler::update(bool found_inf) {
  if (!enabled_ || !dynamic_) return found_inf;
  if (found_inf) {
    state_.good_steps = 0;
    if (++state_.bad_steps >= decr_every_) {
      state_.scale = std::max(1.0, state_.scale * decr_ratio_);
      state_.bad_steps = 0;
    }
    return true;
  }
  state_.bad_steps = 0;
  if (++state_.good_steps >= incr_every_) {
    const double grown = state_.scale * incr_ratio_;
    if (std::isfinite(grown) && grown <= 3.0e38) state_.scale = grown;
    state_.good_steps = 0;
  }
  return false;
}

}  // namespace dtrain
