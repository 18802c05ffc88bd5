#include "options.h"

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
  const UcxKeys k = ucx_keys().read(init.options);  // bounds checked there
  UcxOptions u;
  Settings& s = u.settings;
  u.algorithm_name = k.algorithm;
  s.algorithm = parse_algorithm(k.algorithm);
  s.small_bytes = static_cast<size_t>(k.small_message_bytes);
  s.chunk_bytes = static_cast<size_t>(k.chunk_bytes);
  s.depth = k.pipeline_depth;
  s.spin = std::chrono::microseconds(k.spin_us);
  s.shm = k.shared_memory;
  s.stream_bytes = static_cast<size_t>(k.stream_bytes);
  s.adaptive_stream = k.adaptive_stream;
  u.tls = k.tls;
  u.net_devices = k.net_devices.empty() ? default_net_devices(init) : k.net_devices;
  u.errors = parse_error_handling(k.error_handling);
  u.grace = std::chrono::microseconds(k.grace_us);
  return u;
}

std::string UcxOptions::fingerprint() const {
  return "algorithm=" + algorithm_name + " small_message_bytes=" + std::to_string(settings.small_bytes) +
         " chunk_bytes=" + std::to_string(settings.chunk_bytes) + " pipeline_depth=" + std::to_string(settings.depth) +
         " shared_memory=" + (settings.shm ? "true" : "false");
}

}  // namespace dtrain::ucx_backend
