#pragma once

#include <boost/dll/shared_library.hpp>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/plugin_registry.h"

namespace dtrain {

struct Backend::Impl {
  boost::dll::shared_library library;
  const dt_backend_v1_t* table = nullptr;
  PluginInfo info;
};

}  // namespace dtrain
