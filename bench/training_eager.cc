// dtrain-bench training --device: the PyTorch eager reference, run under a
// Python interpreter (no torch in this file).
#include "training_eager.h"

#include <unistd.h>

#include <chrono>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "dtrain/sdk/strings.h"
#include "process.h"

namespace dtrain::bench {

namespace {

// bench/eager_reference.py: next to this program (bench/CMakeLists.txt copies
// it to bin/), else in the source tree it was built from (DTRAIN_EAGER_REFERENCE,
// defined there too; a build of this file elsewhere must do one or the other).
#ifndef DTRAIN_EAGER_REFERENCE
#define DTRAIN_EAGER_REFERENCE ""
#endif
std::string eager_script() {
  std::vector<std::string> tried{bench::dir_of(bench::self_exe()) + "/eager_reference.py"};
  if (*DTRAIN_EAGER_REFERENCE) tried.push_back(DTRAIN_EAGER_REFERENCE);
  for (const auto& p : tried)
    if (::access(p.c_str(), R_OK) == 0) return p;
  throw std::runtime_error("the PyTorch eager reference is missing: " + sdk::join(tried, " and ") +
                           (tried.size() > 1 ? " do not exist" : " does not exist"));
}

// One line of the script's stdout: "EAGER-PROBE k=v ...", "EAGER k=v ...".
std::map<std::string, std::string> eager_line(const std::string& out, const std::string& tag) {
  std::map<std::string, std::string> kv;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(tag + " ", 0) != 0) continue;
    std::istringstream words(line.substr(tag.size() + 1));
    std::string w;
    while (words >> w)
      if (auto eq = w.find('='); eq != std::string::npos) kv[w.substr(0, eq)] = w.substr(eq + 1);
    return kv;
  }
  return kv;
}

}  // namespace

EagerPython eager_python(const std::string& python, const Workload& w, const std::string& device, bool bf16,
                         bool channels_last) {
  EagerPython e;
  const std::string hint =
      "; point --python at a python whose torch can run on " + device +
      " (on the GPU machine: the PyTorch wheel's, as docs/gpu.md's env.sh sets up; here: Debian's python3-torch under "
      "/usr/bin/python3)";
  e.python = python.find('/') == std::string::npos ? bench::find_in_path(python) : python;
  if (e.python.empty())
    throw std::runtime_error("the PyTorch eager reference runs under " + python + ", but there is no " + python +
                             " on PATH" + hint);
  if (::access(e.python.c_str(), X_OK) != 0)
    throw std::runtime_error("the PyTorch eager reference runs under --python " + e.python +
                             ", which is not an "
                             "executable file" +
                             hint);
  e.script = eager_script();
  e.args = {"--model",        w.model,
            "--width",        fmt::format("{}", w.width),
            "--channels",     std::to_string(w.channels),
            "--size",         std::to_string(w.size),
            "--classes",      std::to_string(w.classes),
            "--batch",        std::to_string(w.batch),
            "--device",       device,
            "--lr",           fmt::format("{}", w.lr),
            "--momentum",     fmt::format("{}", w.momentum),
            "--weight-decay", fmt::format("{}", w.weight_decay),
            "--seed",         std::to_string(w.seed),
            "--threads",      "1"};
  if (bf16) e.args.push_back("--bf16");
  if (channels_last) e.args.push_back("--channels-last");
  std::vector<std::string> argv{e.python, e.script};
  argv.insert(argv.end(), e.args.begin(), e.args.end());
  argv.push_back("--probe");
  auto c = bench::run_capture(e.python, argv, {}, std::chrono::seconds(120));
  e.probe = eager_line(c.out, "EAGER-PROBE");
  if (c.failure.empty() && e.probe.count("params") && e.probe.count("layout")) return e;
  auto err = c.out.find("EAGER-ERROR ");
  std::string why = err != std::string::npos ? c.out.substr(err + 12, c.out.find('\n', err) - err - 12)
                                             : c.failure + (c.failure.empty() ? "printed no EAGER-PROBE line"
                                                                              : " without an EAGER-PROBE line");
  throw std::runtime_error("the PyTorch eager reference (" + e.script + ") cannot run under " + e.python + ": " + why +
                           hint);
}

Result run_eager_python(const EagerPython& e, int steps, int warmup) {
  std::vector<std::string> argv{e.python, e.script};
  argv.insert(argv.end(), e.args.begin(), e.args.end());
  argv.insert(argv.end(), {"--steps", std::to_string(steps), "--warmup", std::to_string(warmup), "--trials", "1"});
  auto c = bench::run_capture(e.python, argv, {}, std::chrono::seconds(600));
  auto kv = eager_line(c.out, "EAGER");
  if (!c.failure.empty() || !kv.count("images_per_s") || !kv.count("ms_per_step"))
    throw std::runtime_error("PyTorch eager (" + e.python + " " + e.script + ") " +
                             (c.failure.empty() ? "printed no EAGER line" : c.failure) + ": " + c.out);
  if (kv["params"] != e.probe.at("params") || kv["layout"] != e.probe.at("layout"))
    throw std::runtime_error("PyTorch eager's model changed between runs: " + kv["params"] + " parameters (layout " +
                             kv["layout"] + "), " + e.probe.at("params") + " at the probe (layout " +
                             e.probe.at("layout") + ")");
  Result r;
  r.ips = std::stod(kv["images_per_s"]);
  r.step_ms = std::stod(kv["ms_per_step"]);
  r.comm_ms = -1;
  return r;
}

}  // namespace dtrain::bench
