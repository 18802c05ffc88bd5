#pragma once
// The raw-Gloo reference: the same Gloo algorithms that dtrain's gloo plugin
// calls, called directly on a gloo::rendezvous::Context (TCP on "lo"), which
// rendezvouses through the job's dtrain store. This is what a program using
// Gloo without dtrain would do, so dtrain's overhead is the difference.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "dtrain/buffer.h"
#include "dtrain/error.h"
#include "dtrain/store.h"

namespace dtrain::bench {

// Mirrors the gloo plugin's options (plugins/gloo/communicator.cc).
struct GlooRefConfig {
  std::string algorithm = "auto";  // auto | ring | bcube | halving_doubling
  size_t small_message_bytes = 0;  // 0: by world size, as the plugin
  int bcube_base = 2;
  std::string iface = "lo";
};

// The all-reduce algorithm the gloo plugin picks for count elements of bytes
// in all, as its pick(): "ring", "bcube" or "hd"; throws InvalidUsage for an
// unknown algorithm name.
inline std::string gloo_allreduce_algorithm(const GlooRefConfig& cfg, int world, size_t count, size_t bytes) {
  const std::string& a = cfg.algorithm;
  if (a == "ring" || a == "bcube") return a;
  if (a == "halving_doubling" || a == "halving-doubling") return "hd";
  size_t small = cfg.small_message_bytes ? cfg.small_message_bytes : world == 2 ? size_t{16} << 20 : size_t{1} << 20;
  if (a == "auto") return count > static_cast<size_t>(world) && bytes <= small ? "bcube" : "ring";
  throw InvalidUsage("gloo algorithm \"" + a + "\" is not known; use auto, ring, bcube or halving_doubling");
}

class GlooReference {
 public:
  GlooReference(int rank, int size, std::shared_ptr<Store> store, const GlooRefConfig& cfg,
                std::chrono::milliseconds timeout);
  ~GlooReference();

  // Whether the raw reference can run this dtype ("" if yes, else why not).
  static std::string unsupported_reason(DType t);

  void allreduce(void* ptr, size_t count, DType t);
  void broadcast(void* ptr, size_t bytes, int root);
  void allgather(const void* send, void* recv, size_t bytes_per_rank);
  void barrier();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::bench
