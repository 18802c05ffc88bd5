// dtrain._C: the c10d backend "dtrain" and the C++ that dtrain.fleet shares
// with the C++ Fleet API (the role maker, the [strategy] table, the loss scaler).
#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <mutex>

#include "dtrain/config.h"
#include "dtrain/error.h"
#include "dtrain/job.h"
#include "dtrain/log.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/role_maker.h"
#include "dtrain/store.h"
#include "dtrain/strategy.h"
#include "process_group.h"

namespace py = pybind11;
using namespace dtrain;

namespace dtrain::python {
void bind_ps(py::module& m);  // ps.cc
}
using dtrain::python::GroupOptions;
using dtrain::python::ProcessGroupDtrain;

namespace {

// torch's c10d store (torchrun's, env://'s) as the core's Store.
class C10dStore : public Store {
 public:
  using Store::set;
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> s) : s_(std::move(s)) {}
  void set(const std::string& key, const Bytes& value) override { s_->set(key, value); }
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    return s_->get(key);
  }
  std::optional<Bytes> try_get(const std::string& key) override {
    if (!s_->check({key})) return std::nullopt;
    return s_->get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override { return s_->add(key, delta); }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return s_->compareSet(key, expected, desired);
  }
  bool check(const std::vector<std::string>& keys) override { return s_->check(keys); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    try {
      s_->wait(keys, timeout);
    } catch (const std::exception& e) {
      throw TimeoutError("waiting " + std::to_string(timeout.count()) + " ms for store keys (" +
                         (keys.empty() ? std::string() : keys.front()) + (keys.size() > 1 ? ", ..." : "") +
                         "): " + e.what());
    }
  }
  bool remove(const std::string& key) override { return s_->deleteKey(key); }

 private:
  c10::intrusive_ptr<c10d::Store> s_;
};

bool under_launcher() {
  const char* s = std::getenv("DTRAIN_STORE");
  return s && *s;
}

// The launcher's store, one connection per process.
std::shared_ptr<Store> job_store(const RoleInfo& role, std::chrono::milliseconds timeout) {
  static std::mutex mu;
  static std::shared_ptr<Store> store;
  std::lock_guard<std::mutex> g(mu);
  if (!store) store = connect_store(role, timeout);
  if (!store)
    throw InvalidUsage("this process's role (" + role.source +
                       ") names no job store: start it with dtrain, or set Paddle's PS variables");
  return store;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// Called by torch.distributed for init_process_group / new_group with
// backend "dtrain". Under `dtrain` the group's communicators meet in the
// job's authenticated store (the group's rank 0 draws the group a number
// there and hands it to the others through torch's store); otherwise in the
// store torch gives (torchrun's, env://'s), already scoped to the group.
c10::intrusive_ptr<ProcessGroupDtrain> create_group(const c10::intrusive_ptr<c10d::Store>& c10d_store, int rank,
                                                    int size, std::chrono::milliseconds timeout,
                                                    const std::string& backend, const std::string& config_toml,
                                                    const std::vector<std::string>& plugin_dirs) {
  GroupOptions o;
  o.backend = backend;
  o.config_toml = config_toml;
  o.plugin_dirs = plugin_dirs;
  o.timeout = timeout;
  std::shared_ptr<Store> store;
  std::string name, job_id;
  int local_rank = 0, local_size = 1;
  if (under_launcher()) {
    RoleInfo role = resolve_role();
    auto js = job_store(role, timeout);
    std::string gid;
    if (rank == 0) {
      gid = std::to_string(js->add("py/groups", 1));
      c10d_store->set("dtrain/group", std::vector<uint8_t>(gid.begin(), gid.end()));
    } else {
      C10dStore cs(c10d_store);
      Bytes b = cs.get("dtrain/group", timeout);
      gid.assign(b.begin(), b.end());
    }
    store = std::make_shared<PrefixStore>("py/g" + gid + "/", js);
    name = "torch";
    job_id = role.job_id;
    if (size == role.world_size) {
      local_rank = role.local_rank;
      local_size = role.local_world_size;
    }
  } else {
    store = std::make_shared<C10dStore>(c10d_store);
    name = "dtrain";
    if (size == env_int("WORLD_SIZE", -1)) {
      local_rank = env_int("LOCAL_RANK", 0);
      local_size = env_int("LOCAL_WORLD_SIZE", 1);
    }
  }
  return c10::make_intrusive<ProcessGroupDtrain>(store, rank, size, name, o, local_rank, local_size, job_id);
}

py::dict role_dict(const RoleInfo& r) {
  py::dict d;
  d["rank"] = r.rank;
  d["world_size"] = r.world_size;
  d["local_rank"] = r.local_rank;
  d["local_world_size"] = r.local_world_size;
  d["node_rank"] = r.node_rank;
  d["nnodes"] = r.nnodes;
  d["role"] = r.role == Role::Server ? "server" : "worker";
  d["server_index"] = r.server_index;
  d["num_servers"] = r.num_servers;
  d["worker_endpoints"] = r.worker_endpoints;
  d["server_endpoints"] = r.server_endpoints;
  d["current_endpoint"] = r.current_endpoint;
  d["store_endpoint"] = r.store_endpoint;
  d["job_id"] = r.job_id;
  d["restart_count"] = r.restart_count;
  d["source"] = r.source;
  return d;
}

// The [strategy] table as the C++ Fleet API reads it (same schema, bounds and
// cross-checks), for dtrain.fleet.DistributedStrategy.
py::dict strategy_dict(const std::string& toml_text) {
  ConfigSchema schema;
  add_strategy_keys(schema);
  Config c = Config::from_string(toml_text, "DistributedStrategy");
  c.validate(schema);
  StrategyOptions o = StrategyOptions::from_config(c);
  py::dict d;
  d["fuse_all_reduce_ops"] = o.fuse_all_reduce_ops;
  d["fuse_grad_size_in_MB"] = o.fuse_grad_size_in_MB;
  d["bucket_bytes"] = o.bucket_bytes();
  d["fp16_allreduce"] = o.fp16_allreduce;
  d["fp16_allreduce_dtype"] = dtype_name(o.wire_dtype);
  d["gradient_merge_k_steps"] = o.gradient_merge_k_steps;
  d["gradient_merge_avg"] = o.gradient_merge_avg;
  d["localsgd_k_steps"] = o.localsgd_k_steps;
  d["a_sync"] = o.a_sync;
  d["ps_mode"] = ps::to_string(o.ps_mode.mode);
  d["sharding"] = o.sharding;
  d["sharding_stage"] = o.sharding_stage;
  d["amp"] = o.amp;
  d["amp_dtype"] = o.amp_dtype == DType::BF16 ? "bfloat16" : "float16";
  d["loss_scaling"] = o.loss_scaling();
  d["recompute"] = o.recompute;
  d["recompute_checkpoints"] = o.recompute_checkpoints;
  d["lamb"] = o.lamb;
  d["lars"] = o.lars;
  d["sync_batch_norm"] = o.sync_batch_norm;
  d["describe"] = o.describe();
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "dtrain's C++ half: the c10d backend over the core and the Fleet API's shared logic";
  py::module::import("torch.distributed");
  py::register_exception<ConfigError>(m, "ConfigError", PyExc_ValueError);

  py::class_<ProcessGroupDtrain, c10::intrusive_ptr<ProcessGroupDtrain>, dtrain::python::C10dBase>(
      m, "ProcessGroupDtrain", "torch.distributed's process group over a dtrain plugin")
      .def_property_readonly(
          "plugin", [](const ProcessGroupDtrain& pg) { return pg.plugin_for(false); },
          "the plugin carrying CPU tensors")
      .def("plugin_for", &ProcessGroupDtrain::plugin_for, py::arg("cuda"));

  m.def("create_group", &create_group, py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
        py::arg("backend") = "", py::arg("config_toml") = "", py::arg("plugin_dirs") = std::vector<std::string>{},
        py::call_guard<py::gil_scoped_release>());
  m.def(
      "plugins",
      [] {
        std::vector<std::string> errors;
        std::vector<py::dict> out;
        for (const auto& p : PluginRegistry().list(&errors)) {
          py::dict d;
          d["name"] = p.name;
          d["version"] = p.version;
          d["abi"] = std::to_string(p.abi_major) + "." + std::to_string(p.abi_minor);
          d["caps"] = p.caps_string();
          out.push_back(d);
        }
        return out;
      },
      "the installed backend plugins");
  m.def("drain", &ProcessGroupDtrain::drain_all, py::call_guard<py::gil_scoped_release>(),
        "waits for every in-flight op of every dtrain group (registered with atexit)");
  m.def(
      "role", [] { return role_dict(resolve_role()); }, "this process's role, as the C++ fleet::init finds it");
  m.def("strategy", &strategy_dict, py::arg("toml_text"));

  py::class_<LossScaler>(m, "LossScaler", "dynamic loss scaling, the C++ Fleet API's")
      .def(py::init([](const std::string& toml_text) {
             ConfigSchema schema;
             add_strategy_keys(schema);
             Config c = Config::from_string(toml_text, "DistributedStrategy");
             c.validate(schema);
             return LossScaler(StrategyOptions::from_config(c));
           }),
           py::arg("toml_text"))
      .def_property_readonly("enabled", &LossScaler::enabled)
      .def_property_readonly("scale", &LossScaler::scale)
      .def("update", &LossScaler::update, py::arg("found_inf"), "returns whether the step must be skipped");

  dtrain::python::bind_ps(m);

  m.attr("core_version") = core_version();
  m.attr("built_torch_version") = dtrain::python::built_torch_version();
  m.attr("built_cxx11_abi") = static_cast<bool>(_GLIBCXX_USE_CXX11_ABI);
}
