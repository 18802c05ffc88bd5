#pragma once

#include <string>

namespace dtrain {

// The core logs through spdlog to stderr as "[time] [level] [dtrain] message".
// Levels: trace, debug, info, warn, error, off. DTRAIN_LOG_LEVEL sets the
// initial level; this call overrides it. Throws InvalidUsage on a bad name.
void set_log_level(const std::string& level);
void log_info(const std::string& message);
void log_warn(const std::string& message);
void log_error(const std::string& message);
void log_debug(const std::string& message);

// Version of libdtrain_core.
const char* core_version();

}  // namespace dtrain
