#include "common/log.h"

#include <cstdlib>

#include <spdlog/sinks/stdout_sinks.h>

#include "dtrain/error.h"
#include "dtrain/log.h"

namespace dtrain {
namespace detail {

spdlog::logger& logger() {
  // Never destroyed, as the watchdog (comm/watchdog.cc): its detached thread
  // may log a timeout while the process runs its exit handlers.
  static spdlog::logger* instance = [] {
    auto* l = new spdlog::logger("dtrain", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("[%H:%M:%S.%e] [%^%l%$] [dtrain] %v");
    l->set_level(spdlog::level::warn);
    if (const char* v = std::getenv("DTRAIN_LOG_LEVEL")) {
      auto lvl = spdlog::level::from_str(v);
      if (lvl != spdlog::level::off || std::string(v) == "off") l->set_level(lvl);
    }
    return l;
  }();
  return *instance;
}

}  // namespace detail

void set_log_level(const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off")
    throw InvalidUsage("unknown log level '" + level + "' (use trace, debug, info, warn, error or off)");
  detail::logger().set_level(lvl);
}
void log_info(const std::string& m) { detail::logger().info(m); }
void log_warn(const std::string& m) { detail::logger().warn(m); }
void log_error(const std::string& m) { detail::logger().error(m); }
void log_debug(const std::string& m) { detail::logger().debug(m); }
const char* core_version() { return DTRAIN_VERSION; }

}  // namespace dtrain
