#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/config.h"

namespace dtrain {

class Communicator;
struct CommOptions;

// What a plugin declares about itself.
struct PluginInfo {
  std::string name;
  std::string version;
  std::string description;
  std::string path;  // the file it was loaded from
  uint32_t abi_major = 0;
  uint32_t abi_minor = 0;
  uint64_t caps = 0;                   // DT_CAP_* bits
  std::vector<ConfigKey> config_keys;  // its own table's keys, paths relative to the table
  // "allreduce broadcast ... sendrecv cpu" — the capability bits as words.
  std::string caps_string() const;
};

// Adds the plugin's own keys under "[<name>]" to a schema.
void add_plugin_keys(ConfigSchema& schema, const PluginInfo& info);

// A loaded backend plugin. Keeps its library loaded for as long as it, or any
// communicator or work created from it, is alive.
class Backend : public std::enable_shared_from_this<Backend> {
 public:
  struct Impl;
  explicit Backend(std::unique_ptr<Impl> impl);
  ~Backend();
  const PluginInfo& info() const;
  const std::string& name() const { return info().name; }
  bool supports(uint64_t cap) const { return (info().caps & cap) == cap; }
  // Creates a communicator; blocks until all ranks are connected (through the
  // store) or options.timeout passes. Throws ConfigError for an option not in
  // the plugin's key list, and the backend's error otherwise.
  std::shared_ptr<Communicator> create_communicator(const CommOptions& options);
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Finds and loads backend plugins: files named libdtrain_<name>.so, searched in
//   1. the directories given to the constructor (the TOML [plugins] path),
//   2. the ':'-separated DTRAIN_PLUGIN_PATH,
//   3. the plugin folder of this installation: <dir of libdtrain_core>/dtrain/plugins.
// The first match wins. Loading checks, with a clear InvalidUsage/NotSupported
// message for each: the file is a loadable shared library with all symbols
// resolved, it exports dtrain_backend_v<N> (probed newest first), its table's
// ABI major matches, its struct_size covers the version's fields, and its
// declared name equals the <name> in its file name. A plugin is loaded once per
// process; later loads return the same Backend.
class PluginRegistry {
 public:
  explicit PluginRegistry(std::vector<std::string> extra_dirs = {});
  std::vector<std::string> search_path() const;
  // Names of every libdtrain_*.so on the search path (not loaded).
  std::vector<std::string> available() const;
  // Loads every available plugin; ones that fail to load are reported in
  // errors (when given) as "name: message" and left out.
  std::vector<PluginInfo> list(std::vector<std::string>* errors = nullptr) const;
  // Loads by name; throws NotSupported("no backend 'x' ... installed: a, b") when absent.
  std::shared_ptr<Backend> load(const std::string& name) const;
  // Loads a plugin from an explicit file path (name checked against the file name).
  std::shared_ptr<Backend> load_file(const std::string& path) const;

  static std::string default_plugin_dir();

 private:
  std::vector<std::string> dirs_;
};

}  // namespace dtrain
