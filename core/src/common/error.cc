#include "dtrain/error.h"

namespace dtrain {

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidUsage: return "invalid usage";
    case ErrorKind::Io: return "I/O error";
    case ErrorKind::Timeout: return "timeout";
    case ErrorKind::NotSupported: return "not supported";
    case ErrorKind::Config: return "configuration error";
    case ErrorKind::Remote: return "remote error";
    case ErrorKind::Aborted: return "aborted";
    case ErrorKind::Internal: return "internal error";
  }
  return "error";
}

static std::string config_message(const std::string& file, int line, int column, const std::string& key,
                                  const std::string& message) {
  std::string s = file;
  if (line > 0) s += ":" + std::to_string(line) + (column > 0 ? ":" + std::to_string(column) : "");
  s += ": ";
  if (!key.empty()) s += "key '" + key + "': ";
  return s + message;
}

ConfigError::ConfigError(std::string file, int line, int column, std::string key, const std::string& message)
    : Error(ErrorKind::Config, config_message(file, line, column, key, message)),
      file_(std::move(file)),
      line_(line),
      column_(column),
      key_(std::move(key)) {}

}  // namespace dtrain
