// dtrain._ctr: the CTR app's C++ for Python programs (examples/python/wide_and_deep.py):
// the Criteo / slot reader with its background parsing thread, the click-log
// generator, the pair-dot interaction op of WideDeep and the evaluation counters. The reader's waits
// release the GIL, so parsing runs beside the training thread.
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include <cstring>

#include "ctr/criteo.h"
#include "ctr/gen.h"
#include "ctr/model.h"

namespace py = pybind11;
using namespace dtrain::apps::ctr;

namespace {

// A batch as tensors: labels [n], dense [n, 13] float32, keys [n, 26] int64 (the feature signs' bits).
py::tuple to_tensors(const Batch& b) {
  const auto n = static_cast<int64_t>(b.size());
  auto labels = torch::empty({n}, torch::kFloat);
  auto dense = torch::empty({n, kDense}, torch::kFloat);
  auto keys = torch::empty({n, kSparse}, torch::kLong);
  std::memcpy(labels.data_ptr<float>(), b.labels.data(), b.labels.size() * sizeof(float));
  std::memcpy(dense.data_ptr<float>(), b.dense.data(), b.dense.size() * sizeof(float));
  std::memcpy(keys.data_ptr<int64_t>(), b.keys.data(), b.keys.size() * sizeof(uint64_t));
  return py::make_tuple(labels, dense, keys);
}

}  // namespace

PYBIND11_MODULE(_ctr, m) {
  m.doc() = "the CTR app's reader, generator and interaction op (apps/ctr)";
  m.attr("DENSE") = kDense;
  m.attr("SPARSE") = kSparse;

  py::class_<Reader>(m, "Reader", "apps/ctr's reader: this worker's share of the lines, parsed ahead")
      .def(py::init([](std::vector<std::string> files, const std::string& format, const std::string& on_error, int rank,
                       int world, int64_t batch_size, int64_t limit, int64_t per_worker, int prefetch) {
             if (on_error != "skip" && on_error != "fail")
               throw std::invalid_argument("on_error must be \"skip\" or \"fail\", not '" + on_error + "'");
             ReaderOptions o;
             o.format = parse_format(format);
             o.on_error = on_error == "skip" ? OnError::Skip : OnError::Fail;
             o.rank = rank;
             o.world = world;
             o.batch_size = batch_size;
             o.limit = limit;
             o.per_worker = per_worker;
             o.prefetch = prefetch;
             return std::make_unique<Reader>(std::move(files), o);
           }),
           py::arg("files"), py::arg("format") = "criteo", py::arg("on_error") = "skip", py::arg("rank") = 0,
           py::arg("world") = 1, py::arg("batch_size") = 512, py::arg("limit") = 0, py::arg("per_worker") = 0,
           py::arg("prefetch") = 8)
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__",
           [](Reader& r) {
             Batch b;
             bool more;
             {
               py::gil_scoped_release no_gil;
               more = r.next(&b);
             }
             if (!more) throw py::stop_iteration();
             return to_tensors(b);
           })
      .def_property_readonly("skipped", &Reader::skipped)
      .def_property_readonly("first_error", &Reader::first_error)
      .def_property_readonly("wait_seconds", &Reader::wait_seconds);

  py::class_<EvalStats>(m, "EvalStats", "dtrain-ctr's evaluation counters: AUC buckets and log loss sums")
      .def(py::init<>())
      .def(
          "add",
          [](EvalStats& s, const torch::Tensor& probs, const torch::Tensor& labels) {
            auto p = probs.to(torch::kFloat).contiguous();
            auto l = labels.to(torch::kFloat).contiguous();
            TORCH_CHECK(p.numel() == l.numel(), "EvalStats.add: ", p.numel(), " probabilities for ", l.numel(),
                        " labels");
            s.add(p.data_ptr<float>(), l.data_ptr<float>(), static_cast<size_t>(p.numel()));
          },
          py::arg("probs"), py::arg("labels"))
      .def_readonly("pos", &EvalStats::pos)
      .def_readonly("neg", &EvalStats::neg)
      .def_readonly("loss_sum", &EvalStats::loss_sum)
      .def_readonly("count", &EvalStats::count);

  m.def("count_lines", &count_lines, py::arg("files"), py::arg("limit") = 0, py::call_guard<py::gil_scoped_release>());
  m.def(
      "generate",
      [](const std::string& dir, int64_t train_lines, int64_t test_lines, uint64_t seed) {
        GenResult r;
        {
          py::gil_scoped_release no_gil;
          r = generate(GenOptions{dir, train_lines, test_lines, seed, 0});
        }
        py::dict d;
        d["teacher_auc"] = r.teacher_auc;
        d["teacher_logloss"] = r.teacher_logloss;
        d["ctr"] = r.ctr;
        return d;
      },
      py::arg("dir"), py::arg("train_lines"), py::arg("test_lines"), py::arg("seed") = 1,
      "writes train.txt, test.txt and teacher.toml (dtrain-ctr gen)");
  m.def("pair_dots", &pair_dots, py::arg("emb"),
        "every (i < j) slot pair's dot product: [B, S, D] -> [B, S (S - 1) / 2], with its backward");
}
