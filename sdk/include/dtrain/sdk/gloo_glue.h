#pragma once
// What any program calling Gloo over a dtrain store needs, in one place: the
// gloo plugin uses it, and so does the raw-Gloo reference of dtrain-bench
// (bench/gloo_reference.cc), so the reference reaches Gloo exactly as the
// plugin does. Header-only; depends on Gloo, the C ABI's dtype codes and the
// standard library only (no plugin internals, no core). Unlike the rest of
// the SDK it needs Gloo's headers and library: include it only from a target
// that links Gloo (the core never does).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gloo/rendezvous/store.h>
#include <gloo/types.h>

#include "dtrain/abi/backend_v1.h"

namespace dtrain::sdk::gloo_glue {

// Calls f(T{}) with the element type Gloo is given for a DT_DTYPE_* code
// (f16 as gloo::float16; bf16, which Gloo has no type for, as raw 16-bit
// words: the caller supplies its reduction). False for an unknown code.
template <typename F>
bool with_gloo_type(int32_t dtype, F&& f) {
  switch (dtype) {
    case DT_DTYPE_F32: f(float{}); return true;
    case DT_DTYPE_F64: f(double{}); return true;
    case DT_DTYPE_F16: f(::gloo::float16{}); return true;
    case DT_DTYPE_BF16: f(uint16_t{}); return true;
    case DT_DTYPE_I8: f(int8_t{}); return true;
    case DT_DTYPE_U8: f(uint8_t{}); return true;
    case DT_DTYPE_I32: f(int32_t{}); return true;
    case DT_DTYPE_I64: f(int64_t{}); return true;
  }
  return false;
}

namespace detail {
// The two dtrain stores differ in how they take a timeout: the SDK's
// sdk::Store in milliseconds as an integer, the core's dtrain::Store as a
// std::chrono::milliseconds. Exactly one overload of each fits a store.
template <typename S>
auto get(S& s, const std::string& key, std::chrono::milliseconds t) -> decltype(s.get(key, t)) {
  return s.get(key, t);
}
template <typename S>
auto get(S& s, const std::string& key, std::chrono::milliseconds t) -> decltype(s.get(key, t.count())) {
  return s.get(key, t.count());
}
template <typename S>
auto wait(S& s, const std::vector<std::string>& keys, std::chrono::milliseconds t) -> decltype(s.wait(keys, t)) {
  s.wait(keys, t);
}
template <typename S>
auto wait(S& s, const std::vector<std::string>& keys, std::chrono::milliseconds t)
    -> decltype(s.wait(keys, t.count())) {
  s.wait(keys, t.count());
}
template <typename T>
struct IsSharedPtr : std::false_type {};
template <typename T>
struct IsSharedPtr<std::shared_ptr<T>> : std::true_type {};
}  // namespace detail

// Gloo's rendezvous store over a dtrain store (Debian's Gloo has no TCP store
// of its own). Handle is how the store is held: sdk::Store (a value, in a
// plugin) or std::shared_ptr<dtrain::Store> (the core's, in the bench).
// Gloo's waits without a timeout of their own use `timeout`.
template <typename Handle>
class RendezvousStore : public ::gloo::rendezvous::Store {
 public:
  RendezvousStore(Handle store, std::chrono::milliseconds timeout) : s_(std::move(store)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store().set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = detail::get(store(), key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { detail::wait(store(), keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    detail::wait(store(), keys, timeout);
  }

 private:
  auto& store() {
    if constexpr (detail::IsSharedPtr<Handle>::value)
      return *s_;
    else
      return s_;
  }

  Handle s_;
  std::chrono::milliseconds timeout_;
};

// Connects every pair of ranks through `store`. Gloo's
// rendezvous::Context::connectFullMesh takes the store by reference in
// Debian 12's libgloo-dev and as a std::shared_ptr in later Gloo (Debian 13):
// both are served. `store` lives as long as the context needs it either way.
template <typename Context, typename Device>
void connect_full_mesh(Context& context, const std::shared_ptr<::gloo::rendezvous::Store>& store, Device& device) {
  if constexpr (std::is_invocable_v<decltype(&Context::connectFullMesh), Context&,
                                    std::shared_ptr<::gloo::rendezvous::Store>, Device&>)
    context.connectFullMesh(store, device);
  else
    context.connectFullMesh(*store, device);
}

}  // namespace dtrain::sdk::gloo_glue
