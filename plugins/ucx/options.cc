#include "options.h"

namespace dtrain::ucx_backend {

UcxOptions UcxOptions::parse(const sdk::CommInit& init) {
  const UcxKeys k = ucx_keys().read(init.options);  // bounds checked there
  UcxOptions u;
  Settings& s = u.settings;
  u.algorithm_name = k.algorithm;
  s.algorithm = sdk::parse_name<Algorithm>(
      "ucx.algorithm", k.algorithm,
      {{"auto", Algorithm::Auto}, {"recursive_doubling", Algorithm::RecursiveDoubling}, {"ring", Algorithm::Ring}});
  s.small_bytes = static_cast<size_t>(k.small_message_bytes);
  s.chunk_bytes = static_cast<size_t>(k.chunk_bytes);
  s.depth = k.pipeline_depth;
  s.spin = std::chrono::microseconds(k.spin_us);
  s.shm = k.shared_memory;
  s.stream_bytes = static_cast<size_t>(k.stream_bytes);
  s.adaptive_stream = k.adaptive_stream;
  u.tls = k.tls;
  u.net_devices = k.net_devices.empty() ? default_net_devices(init) : k.net_devices;
  u.errors = sdk::parse_name<ErrorHandling>(
      "ucx.error_handling", k.error_handling,
      {{"auto", ErrorHandling::Auto}, {"peer", ErrorHandling::Peer}, {"none", ErrorHandling::None}});
  u.grace = std::chrono::microseconds(k.grace_us);
  return u;
}

std::string UcxOptions::fingerprint() const {
  return "algorithm=" + algorithm_name + " small_message_bytes=" + std::to_string(settings.small_bytes) +
         " chunk_bytes=" + std::to_string(settings.chunk_bytes) + " pipeline_depth=" + std::to_string(settings.depth) +
         " shared_memory=" + (settings.shm ? "true" : "false");
}

}  // namespace dtrain::ucx_backend
