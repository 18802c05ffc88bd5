// dtrain._C's parameter-server half: the C++ Fleet API's PS functions
// (dtrain/fleet/ps.h) for dtrain.fleet and dtrain.nn.SparseEmbedding. The
// tables, the client, the in-flight queues and GEO are the C++ ones; this
// file only converts. Every call that may wait on the network releases the GIL.
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include "dtrain/config.h"
#include "dtrain/error.h"
#include "dtrain/job.h"
#include "dtrain/strategy.h"
#include "dtrain/fleet/fleet.h"
#include "dtrain/fleet/metrics.h"
#include "dtrain/fleet/ps.h"

namespace py = pybind11;
namespace fleet = dtrain::fleet;

// No `using namespace dtrain` here: this file comes first in the extension's
// unity build, and dtrain::DeviceType would clash with c10's in torch's headers.
namespace dtrain::python {

namespace {

using NoGil = py::call_guard<py::gil_scoped_release>;

std::shared_ptr<Config> job_config(const std::string& toml_text) {
  auto c = std::make_shared<Config>(Config::from_string(toml_text, "dtrain.fleet"));
  ConfigSchema schema;
  add_job_keys(schema);
  add_strategy_keys(schema);
  ps::add_ps_keys(schema);
  c->validate(schema);
  return c;
}

// One [ps.tables.<name>] declaration, as a job file would give it.
ps::TableConfig table_config(const std::string& name, const std::string& toml_text) {
  return ps::TableConfig::from_config(Config::from_string(toml_text, "table '" + name + "'"), name);
}

// A Python module's parameters as a C++ module with the same names ("mlp.0.weight"
// is parameter "weight" of submodule "0" of submodule "mlp"), sharing the tensors,
// so DenseParameters names its tables as it does for the same C++ model.
std::shared_ptr<::torch::nn::Module> mirror(const std::vector<std::string>& names,
                                            const std::vector<::torch::Tensor>& tensors) {
  auto root = std::make_shared<::torch::nn::Module>();
  for (size_t i = 0; i < names.size(); ++i) {
    std::shared_ptr<::torch::nn::Module> m = root;
    std::string rest = names[i];
    for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
      const std::string part = rest.substr(0, dot);
      auto children = m->named_children();
      auto* child = children.find(part);
      m = child ? *child : m->register_module(part, std::make_shared<::torch::nn::Module>());
    }
    m->register_parameter(rest, tensors[i], tensors[i].requires_grad());
  }
  return root;
}

// Deletes with the GIL released: a table's destructor waits for its ops in flight.
template <typename T>
struct DeleteWithoutGil {
  void operator()(T* p) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      delete p;
    } else {
      delete p;
    }
  }
};

}  // namespace

void bind_ps(py::module& m) {
  auto ps = m.def_submodule("ps", "the C++ Fleet API's parameter-server half (dtrain/fleet/ps.h)");
  ps.def(
      "init",
      [](const std::string& toml_text) {
        fleet::InitOptions o;
        o.is_collective = false;
        o.config = job_config(toml_text);
        fleet::init(o);
      },
      py::arg("toml_text"), NoGil(), "fleet::init(false) on a job file's text ([strategy], [ps])");
  ps.def("shutdown", &fleet::shutdown, NoGil());
  ps.def("mode", [] { return ps::to_string(fleet::ps_mode().mode); });
  ps.def("init_server", &fleet::init_server);
  ps.def("run_server", &fleet::run_server, NoGil());
  ps.def("init_worker", &fleet::init_worker);
  ps.def("stop_worker", &fleet::stop_worker, NoGil());
  ps.def("barrier_worker", &fleet::barrier_worker, NoGil());
  ps.def(
      "store_set",
      [](const std::string& key, const std::string& value) {
        fleet::ps_store()->set(key, Bytes(value.begin(), value.end()));
      },
      py::arg("key"), py::arg("value"), NoGil(), "sets a key in the job's store");
  ps.def(
      "store_get",
      [](const std::string& key, double timeout_s) {
        Bytes b = fleet::ps_store()->get(key, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
        return std::string(b.begin(), b.end());
      },
      py::arg("key"), py::arg("timeout_s"), NoGil(), "waits for a key of the job's store");
  ps.def(
      "save_persistables",
      [](const std::string& dir, int mode, bool text) {
        fleet::save_persistables(dir, static_cast<ps::SaveMode>(mode),
                                 text ? ps::SaveFormat::Text : ps::SaveFormat::Binary);
      },
      py::arg("dirname"), py::arg("mode") = 0, py::arg("text") = false, NoGil());
  ps.def("load_persistables", &fleet::load_persistables, py::arg("dirname"), NoGil());

  // The constructors release the GIL inside: pybind11 registers the instance after they return.
  using SparseHolder = std::unique_ptr<fleet::SparseEmbedding, DeleteWithoutGil<fleet::SparseEmbedding>>;
  py::class_<fleet::SparseEmbedding, SparseHolder>(ps, "SparseTable", "a SparseEmbedding of the C++ Fleet API")
      .def(py::init([](const std::string& name, const std::string& toml_text) {
             ps::TableConfig c = table_config(name, toml_text);
             py::gil_scoped_release no_gil;
             return SparseHolder(new fleet::SparseEmbedding(c));
           }),
           py::arg("name"), py::arg("toml_text"))
      .def(
          "forward", [](fleet::SparseEmbedding& e, const ::torch::Tensor& ids) { return e->forward(ids); },
          py::arg("ids"), NoGil())
      .def(
          "forward_show_click",
          [](fleet::SparseEmbedding& e, const ::torch::Tensor& ids, const ::torch::Tensor& show_click) {
            return e->forward(ids, show_click);
          },
          py::arg("ids"), py::arg("show_click"), NoGil())
      .def(
          "prefetch", [](fleet::SparseEmbedding& e, const ::torch::Tensor& ids) { e->prefetch(ids); }, py::arg("ids"),
          NoGil())
      .def(
          "push_gradients", [](fleet::SparseEmbedding& e) { e->push_gradients(); }, NoGil())
      .def(
          "flush", [](fleet::SparseEmbedding& e) { e->flush(); }, NoGil())
      .def("clear", [](fleet::SparseEmbedding& e) { e->clear(); })
      .def(
          "shrink", [](fleet::SparseEmbedding& e, bool new_day) { e->table().shrink(new_day)->wait(); },
          py::arg("new_day") = false, NoGil());

  py::class_<fleet::DenseParameters, std::shared_ptr<fleet::DenseParameters>>(
      ps, "DenseParameters", "a model's dense parameters on the servers, one table each")
      .def(py::init([](const std::vector<std::string>& names, const std::vector<::torch::Tensor>& tensors,
                       const std::string& toml_text) {
             ps::TableConfig c = table_config("dense", toml_text);
             c.kind = ps::TableKind::Dense;
             py::gil_scoped_release no_gil;
             return std::shared_ptr<fleet::DenseParameters>(
                 new fleet::DenseParameters(mirror(names, tensors), c, "dense"),
                 DeleteWithoutGil<fleet::DenseParameters>());
           }),
           py::arg("names"), py::arg("tensors"), py::arg("toml_text"))
      .def("step", &fleet::DenseParameters::step, NoGil())
      .def("pull", &fleet::DenseParameters::pull, NoGil())
      .def("flush", &fleet::DenseParameters::flush, NoGil());

  auto metrics =
      ps.def_submodule("metrics", "fleet::metrics over the workers' side communicator; the AUC of summed buckets");
  metrics.def(
      "all_reduce",
      [](::torch::Tensor t, const std::string& op) {
        fleet::metrics::all_reduce(t, op == "max" ? ReduceOp::Max : op == "min" ? ReduceOp::Min : ReduceOp::Sum);
      },
      py::arg("tensor"), py::arg("op"), NoGil(), "reduces a CPU tensor over the workers in place: sum, max or min");
  metrics.def("auc_of_buckets", &fleet::metrics::auc_of_buckets);
}

}  // namespace dtrain::python
