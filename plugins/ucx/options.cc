#include "options.h"

#include <algorithm>

namespace dtrain::ucx_backend {

namespace {

Algorithm parse_algorithm(const std::string& s) {
  if (s == "auto") return Algorithm::Auto;
  if (s == "recursive_doubling") return Algorithm::RecursiveDoubling;
  if (s == "ring") return Algorithm::Ring;
  sdk::fail(DT_ERR_INVALID_USAGE,
            "ucx.algorithm = \"" + s + "\" is not known; use \"auto\", \"recursive_doubling\" or \"ring\"");
}

ErrorHandling parse_error_handling(const std::string& s) {
  if (s == "auto") return ErrorHandling::Auto;
  if (s == "peer") return ErrorHandling::Peer;
  if (s == "none") return ErrorHandling::None;
  sdk::fail(DT_ERR_INVALID_USAGE,
            "ucx.error_handling = \"" + s + "\" is not known; use \"auto\", \"peer\" or \"none\"");
}

}  // namespace

UcxOptions UcxOptions::parse(const sdk::CommInit& init) {
  const sdk::Options& o = init.options;
  UcxOptions u;
  Settings& s = u.settings;
  u.algorithm_name = o.get_string("algorithm");
  s.algorithm = parse_algorithm(u.algorithm_name);
  // Values below a key's lowest are raised to it; the defaults are kKeys' (plugin.cc).
  auto at_least = [&](const char* key, int64_t lowest) { return std::max<int64_t>(lowest, o.get_int(key)); };
  s.small_bytes = static_cast<size_t>(at_least("small_message_bytes", 0));
  s.chunk_bytes = static_cast<size_t>(at_least("chunk_bytes", 4096));
  s.depth = static_cast<int>(at_least("pipeline_depth", 1));
  s.spin = std::chrono::microseconds(at_least("spin_us", 0));
  s.shm = o.get_bool("shared_memory");
  s.stream_bytes = static_cast<size_t>(at_least("stream_bytes", 0));
  s.adaptive_stream = o.get_bool("adaptive_stream");
  u.tls = o.get_string("tls");
  u.net_devices = o.get_string("net_devices");
  if (u.net_devices.empty()) u.net_devices = default_net_devices(init);
  u.errors = parse_error_handling(o.get_string("error_handling"));
  u.grace = std::chrono::microseconds(at_least("grace_us", 0));
  return u;
}

std::string UcxOptions::fingerprint() const {
  return "algorithm=" + algorithm_name + " small_message_bytes=" + std::to_string(settings.small_bytes) +
         " chunk_bytes=" + std::to_string(settings.chunk_bytes) + " pipeline_depth=" + std::to_string(settings.depth) +
         " shared_memory=" + (settings.shm ? "true" : "false");
}

}  // namespace dtrain::ucx_backend
