#pragma once
// The UCX plugin's options ([ucx] table), read once at communicator creation.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "dtrain/sdk/backend.h"
#include "fabric.h"

namespace dtrain::ucx_backend {

enum class Algorithm { Auto, RecursiveDoubling, Ring };

// The [ucx] keys as the job file sets them; the initializers are the
// defaults. Each key is declared once, with its bound and doc, in ucx_keys()
// (plugin.cc), which reads them all (bounds checked) for UcxOptions::parse.
struct UcxKeys {
  std::string tls;
  std::string net_devices;
  std::string error_handling = "auto";
  bool shared_memory = true;
  std::string algorithm = "auto";
  int64_t small_message_bytes = 8192;
  int64_t chunk_bytes = 131072;
  int pipeline_depth = 8;
  int64_t stream_bytes = 8388608;
  bool adaptive_stream = true;
  int64_t spin_us = 2000;
  int64_t grace_us = 1000;
};
const sdk::ConfigTable<UcxKeys>& ucx_keys();

// What the algorithms need; every rank must run with the same values (see
// fingerprint()). UcxOptions::parse fills every field from UcxKeys.
struct Settings {
  Algorithm algorithm = Algorithm::Auto;
  size_t small_bytes = 0;  // auto: recursive doubling up to here, ring above
  size_t chunk_bytes = 0;  // ring pipeline chunk
  int depth = 0;           // chunks in flight per ring step
  std::chrono::microseconds spin{0};
  bool shm = false;  // shared-memory mailboxes for large messages on one host
  // Ops of at least this many bytes write the mailboxes with non-temporal
  // stores (0: never). A rank's own choice: the reader is the same either way.
  size_t stream_bytes = 0;
  // Ring all-reduces below stream_bytes pick plain or non-temporal stores by
  // their measured time (Algorithms::StoreChoice); false: plain stores.
  bool adaptive_stream = false;
};

// Everything the [ucx] table says, checked: an unknown name or a value out of
// range fails with DT_ERR_INVALID_USAGE naming the key.
struct UcxOptions {
  Settings settings;
  std::string algorithm_name;
  std::string tls;          // "" = UCX's default
  std::string net_devices;  // after the default (see default_net_devices())
  ErrorHandling errors = ErrorHandling::Auto;
  std::chrono::microseconds grace{0};

  static UcxOptions parse(const sdk::CommInit& init);
  // The options every rank must share, as text (compared at connection).
  std::string fingerprint() const;
};

}  // namespace dtrain::ucx_backend
