#include "dtrain/plugin_registry.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "common/log.h"
#include "dtrain/error.h"
#include "dtrain/log.h"
#include "dtrain/sdk/caps.h"
#include "plugin/backend_impl.h"

namespace fs = std::filesystem;

namespace dtrain {

namespace {

constexpr const char* kPrefix = "libdtrain_";
constexpr const char* kSuffix = ".so";

void host_log(void*, int32_t level, const char* msg) {
  auto& l = detail::logger();
  switch (level) {
    case DT_LOG_TRACE: l.trace("{}", msg); break;
    case DT_LOG_DEBUG: l.debug("{}", msg); break;
    case DT_LOG_INFO: l.info("{}", msg); break;
    case DT_LOG_WARN: l.warn("{}", msg); break;
    default: l.error("{}", msg); break;
  }
}

const dt_host_v1_t* host_v1() {
  static dt_host_v1_t host = [] {
    dt_host_v1_t h{};
    h.struct_size = sizeof(h);
    h.abi_major = DT_BACKEND_V1_MAJOR;
    h.abi_minor = DT_BACKEND_V1_MINOR;
    h.log = host_log;
    h.core_version = core_version();
    return h;
  }();
  return &host;
}

std::string name_from_file(const fs::path& p) {
  std::string f = p.filename().string();
  if (f.rfind(kPrefix, 0) != 0 || f.size() <= std::strlen(kPrefix) + std::strlen(kSuffix) ||
      f.compare(f.size() - 3, 3, kSuffix) != 0)
    return "";
  return f.substr(std::strlen(kPrefix), f.size() - std::strlen(kPrefix) - std::strlen(kSuffix));
}

ConfigType parse_key_type(const char* t, const std::string& plugin, const char* key) {
  std::string s = t ? t : "";
  if (s == "string") return ConfigType::String;
  if (s == "int") return ConfigType::Int;
  if (s == "float") return ConfigType::Float;
  if (s == "bool") return ConfigType::Bool;
  throw InvalidUsage("plugin '" + plugin + "' declares option '" + (key ? key : "?") + "' with unknown type '" + s +
                     "' (use string, int, float or bool)");
}

// The parameter-server slots of minor 1. A table that covers them (abi_minor
// >= 1 and a struct_size reaching ps_stop) is checked slot by slot against
// its DT_CAP_PS_* bits; a v1.0 table is read only up to its v1.0 fields and
// must not claim a PS bit.
void check_ps_slots(const dt_backend_v1_t* t, const std::string& path) {
  constexpr uint64_t kPs = DT_CAP_PS_DENSE | DT_CAP_PS_SPARSE | DT_CAP_PS_SERVER;
  uint64_t ps = t->caps & kPs;
  bool covers = t->abi_minor >= 1 && t->struct_size >= offsetof(dt_backend_v1_t, ps_stop) + sizeof(t->ps_stop);
  if (!covers) {
    if (ps)
      throw InvalidUsage("plugin '" + path + "' claims " + sdk::caps_string(ps) + " but its table (ABI 1." +
                         std::to_string(t->abi_minor) + ", " + std::to_string(t->struct_size) +
                         " bytes) has no parameter-server slots; rebuild it against the ABI 1.1 header");
    return;
  }
  if (!ps) return;
  if (!(ps & DT_CAP_PS_SERVER))
    throw InvalidUsage("plugin '" + path + "' claims " + sdk::caps_string(ps) +
                       " without ps-server; a parameter-server backend must also serve (DT_CAP_PS_SERVER)");
  struct Need {
    uint64_t cap;
    const void* fn;
    const char* name;
  };
  const Need needs[] = {
      {DT_CAP_PS_DENSE | DT_CAP_PS_SPARSE, reinterpret_cast<const void*>(t->ps_table), "ps_table"},
      {DT_CAP_PS_DENSE, reinterpret_cast<const void*>(t->ps_pull_dense), "ps_pull_dense"},
      {DT_CAP_PS_DENSE, reinterpret_cast<const void*>(t->ps_push_dense), "ps_push_dense"},
      {DT_CAP_PS_SPARSE, reinterpret_cast<const void*>(t->ps_pull_sparse), "ps_pull_sparse"},
      {DT_CAP_PS_SPARSE, reinterpret_cast<const void*>(t->ps_push_sparse), "ps_push_sparse"},
      {DT_CAP_PS_SPARSE, reinterpret_cast<const void*>(t->ps_shrink), "ps_shrink"},
      {DT_CAP_PS_SERVER, reinterpret_cast<const void*>(t->ps_serve), "ps_serve"},
      {DT_CAP_PS_SERVER, reinterpret_cast<const void*>(t->ps_stop), "ps_stop"},
      {DT_CAP_PS_SERVER, reinterpret_cast<const void*>(t->ps_finish), "ps_finish"},
      {DT_CAP_PS_SERVER, reinterpret_cast<const void*>(t->ps_barrier), "ps_barrier"},
      {DT_CAP_PS_SERVER, reinterpret_cast<const void*>(t->ps_save), "ps_save"},
      {DT_CAP_PS_SERVER, reinterpret_cast<const void*>(t->ps_load), "ps_load"},
  };
  for (auto& n : needs)
    if ((t->caps & n.cap) && !n.fn)
      throw InvalidUsage("plugin '" + path + "' claims " + sdk::caps_string(t->caps & n.cap & kPs) +
                         " but its table has no " + n.name + " function");
}

// Which function each capability needs, so a table that claims a capability
// but leaves its function NULL is refused at load instead of crashing later.
void check_table(const dt_backend_v1_t* t, const std::string& path) {
  check_ps_slots(t, path);
  struct Need {
    uint64_t cap;
    const void* fn;
    const char* name;
  };
  const Need needs[] = {
      {DT_CAP_ALLREDUCE, reinterpret_cast<const void*>(t->allreduce), "allreduce"},
      {DT_CAP_BROADCAST, reinterpret_cast<const void*>(t->broadcast), "broadcast"},
      {DT_CAP_ALLGATHER, reinterpret_cast<const void*>(t->allgather), "allgather"},
      {DT_CAP_REDUCE_SCATTER, reinterpret_cast<const void*>(t->reduce_scatter), "reduce_scatter"},
      {DT_CAP_REDUCE, reinterpret_cast<const void*>(t->reduce), "reduce"},
      {DT_CAP_ALLTOALL, reinterpret_cast<const void*>(t->alltoall), "alltoall"},
      {DT_CAP_BARRIER, reinterpret_cast<const void*>(t->barrier), "barrier"},
      {DT_CAP_SENDRECV, reinterpret_cast<const void*>(t->send), "send"},
      {DT_CAP_SENDRECV, reinterpret_cast<const void*>(t->recv), "recv"},
  };
  for (auto& n : needs)
    if ((t->caps & n.cap) && !n.fn)
      throw InvalidUsage("plugin '" + path + "' claims " + n.name + " but its table has no " + n.name + " function");
  const std::pair<const void*, const char*> required[] = {
      {reinterpret_cast<const void*>(t->comm_create), "comm_create"},
      {reinterpret_cast<const void*>(t->comm_destroy), "comm_destroy"},
      {reinterpret_cast<const void*>(t->comm_abort), "comm_abort"},
      {reinterpret_cast<const void*>(t->comm_last_error), "comm_last_error"},
      {reinterpret_cast<const void*>(t->work_test), "work_test"},
      {reinterpret_cast<const void*>(t->work_wait), "work_wait"},
      {reinterpret_cast<const void*>(t->work_error), "work_error"},
      {reinterpret_cast<const void*>(t->work_release), "work_release"},
  };
  for (auto& [fn, name] : required)
    if (!fn) throw InvalidUsage("plugin '" + path + "' has no " + name + " function in its table");
}

// Entry points, newest ABI first. Only v1 exists so far; a v2 core probes
// dtrain_backend_v2 first and wraps a v1 table in an adapter.
std::unique_ptr<Backend::Impl> open_plugin(const fs::path& path) {
  std::string expected = name_from_file(path);
  auto impl = std::make_unique<Backend::Impl>();
  boost::dll::fs::error_code ec;
  // RTLD_NODELETE: a plugin stays mapped until the process ends, as NCCL's net
  // plugins and Python's extension modules do. Its threads may outlive its
  // last communicator: Gloo's device loop, or an op left blocked in the
  // transport by an abort (DetachedDrainers); unmapping their code under
  // them crashed processes at exit, after the tests had passed.
  const auto mode = static_cast<boost::dll::load_mode::type>(boost::dll::load_mode::rtld_now |
                                                             boost::dll::load_mode::rtld_local | RTLD_NODELETE);
  impl->library.load(boost::dll::fs::path(path.string()), mode, ec);
  if (ec) {
    const char* dl = ::dlerror();
    std::string why = dl ? dl : ec.message();
    // dlerror was consumed by Boost.DLL; reopen to get the loader's own words.
    if (void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      ::dlclose(h);
    } else if (const char* e = ::dlerror()) {
      why = e;
    }
    if (why.find("undefined symbol") != std::string::npos)
      throw InvalidUsage("plugin '" + path.string() + "' has unresolved symbols: " + why +
                         " (it was built against a different library version, or a dependency is missing; "
                         "check `ldd -r` on it)");
    if (why.find("invalid ELF header") != std::string::npos || why.find("file too short") != std::string::npos ||
        why.find("not an ELF") != std::string::npos)
      throw InvalidUsage("plugin file '" + path.string() + "' is not a shared library: " + why);
    throw InvalidUsage("plugin '" + path.string() + "' could not be loaded: " + why);
  }
  if (!impl->library.has(DT_BACKEND_V1_ENTRY))
    throw InvalidUsage("plugin '" + path.string() + "' exports no entry point (looked for " + DT_BACKEND_V1_ENTRY +
                       "); build it with DTRAIN_EXPORT_BACKEND_V1 or dtrain_add_plugin()");
  auto entry = impl->library.get<const dt_backend_v1_t*(const dt_host_v1_t*)>(DT_BACKEND_V1_ENTRY);
  const dt_backend_v1_t* t = entry(host_v1());
  if (!t) throw InvalidUsage("plugin '" + path.string() + "': " + DT_BACKEND_V1_ENTRY + " returned no table");
  if (t->abi_major != DT_BACKEND_V1_MAJOR)
    throw InvalidUsage("plugin '" + path.string() + "' is built for backend ABI " + std::to_string(t->abi_major) + "." +
                       std::to_string(t->abi_minor) + " but exports it as " + DT_BACKEND_V1_ENTRY +
                       "; this core speaks ABI " + std::to_string(DT_BACKEND_V1_MAJOR) + "." +
                       std::to_string(DT_BACKEND_V1_MINOR) + ". Rebuild the plugin against this dtrain SDK");
  if (t->struct_size < offsetof(dt_backend_v1_t, ps_table))
    throw InvalidUsage("plugin '" + path.string() + "' declares a backend table of " + std::to_string(t->struct_size) +
                       " bytes, smaller than the " + std::to_string(offsetof(dt_backend_v1_t, ps_table)) +
                       " bytes ABI 1.0 requires; it was built against a broken or foreign header");
  std::string declared = t->name ? t->name : "";
  if (declared != expected)
    throw InvalidUsage("plugin file '" + path.string() + "' declares the backend name '" + declared +
                       "', but its file name says '" + expected + "'; rename the file to libdtrain_" + declared +
                       ".so or fix the plugin's name");
  check_table(t, path.string());
  impl->table = t;
  auto& info = impl->info;
  info.name = declared;
  info.version = t->version ? t->version : "";
  info.description = t->description ? t->description : "";
  info.path = fs::absolute(path).string();
  info.abi_major = t->abi_major;
  info.abi_minor = t->abi_minor;
  info.caps = t->caps;
  for (uint32_t i = 0; i < t->num_config_keys; ++i) {
    auto& k = t->config_keys[i];
    info.config_keys.push_back({k.name ? k.name : "",
                                parse_key_type(k.type, declared, k.name),
                                k.default_value ? k.default_value : "",
                                k.description ? k.description : "",
                                {},
                                {}});
  }
  return impl;
}

// Loaded plugins stay loaded until the process exits: a plugin may have
// detached a thread that still runs its code after an abort.
std::mutex g_loaded_mu;
std::map<std::string, std::shared_ptr<Backend>> g_loaded;  // by canonical path

}  // namespace

Backend::Backend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Backend::~Backend() = default;
const PluginInfo& Backend::info() const { return impl_->info; }

std::string PluginInfo::caps_string() const { return sdk::caps_string(caps); }

void add_plugin_keys(ConfigSchema& schema, const PluginInfo& info) {
  for (auto& k : info.config_keys) schema.add(info.name + "." + k.path, k.type, k.default_text, k.description);
}

PluginRegistry::PluginRegistry(std::vector<std::string> extra_dirs) : dirs_(std::move(extra_dirs)) {}

std::string PluginRegistry::default_plugin_dir() {
  boost::dll::fs::error_code ec;
  auto self = boost::dll::this_line_location(ec);
  if (ec) return "";
  return (fs::path(self.parent_path().string()) / DTRAIN_INSTALL_PLUGIN_SUBDIR).string();
}

std::vector<std::string> PluginRegistry::search_path() const {
  std::vector<std::string> out = dirs_;
  if (const char* env = std::getenv("DTRAIN_PLUGIN_PATH")) {
    std::stringstream ss(env);
    std::string d;
    while (std::getline(ss, d, ':'))
      if (!d.empty()) out.push_back(d);
  }
  std::string def = default_plugin_dir();
  if (!def.empty()) out.push_back(def);
  return out;
}

std::vector<std::string> PluginRegistry::available() const {
  std::vector<std::string> names;
  for (auto& d : search_path()) {
    std::error_code ec;
    for (auto& e : fs::directory_iterator(d, ec)) {
      std::string n = name_from_file(e.path());
      if (!n.empty() && std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<PluginInfo> PluginRegistry::list(std::vector<std::string>* errors) const {
  std::vector<PluginInfo> out;
  for (auto& n : available()) {
    try {
      out.push_back(load(n)->info());
    } catch (const std::exception& e) {
      if (errors) errors->push_back(n + ": " + e.what());
    }
  }
  return out;
}

std::shared_ptr<Backend> PluginRegistry::load(const std::string& name) const {
  if (name.empty() || name.find('/') != std::string::npos)
    throw InvalidUsage("backend name '" + name + "' is not a plain name (use --backend gloo, not a path)");
  for (auto& d : search_path()) {
    fs::path p = fs::path(d) / (std::string(kPrefix) + name + kSuffix);
    std::error_code ec;
    if (fs::exists(p, ec)) return load_file(p.string());
  }
  auto names = available();
  std::string installed;
  for (auto& n : names) installed += (installed.empty() ? "" : ", ") + n;
  std::string dirs;
  for (auto& d : search_path()) dirs += (dirs.empty() ? "" : ", ") + d;
  throw NotSupported("no backend '" + name +
                     "' is installed. Installed backends: " + (installed.empty() ? "none" : installed) +
                     ". Searched: " + dirs + " (add folders with DTRAIN_PLUGIN_PATH or [plugins] path)");
}

std::shared_ptr<Backend> PluginRegistry::load_file(const std::string& path) const {
  std::error_code ec;
  fs::path canon = fs::weakly_canonical(path, ec);
  if (ec) canon = path;
  if (!fs::exists(canon)) throw InvalidUsage("plugin file '" + path + "' does not exist");
  if (name_from_file(canon).empty()) throw InvalidUsage("plugin file '" + path + "' is not named libdtrain_<name>.so");
  std::lock_guard<std::mutex> lk(g_loaded_mu);
  auto it = g_loaded.find(canon.string());
  if (it != g_loaded.end()) return it->second;
  auto b = std::make_shared<Backend>(open_plugin(canon));
  g_loaded[canon.string()] = b;
  detail::logger().debug("loaded backend '{}' {} from {}", b->name(), b->info().version, b->info().path);
  return b;
}

}  // namespace dtrain
