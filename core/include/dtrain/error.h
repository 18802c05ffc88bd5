#pragma once

#include <stdexcept>
#include <string>

namespace dtrain {

// Every failure the core reports is a dtrain::Error of one kind. Messages say what
// happened and what to do next; they never need a stack trace to be understood.
enum class ErrorKind {
  InvalidUsage,  // the caller broke a contract (bad argument, poisoned communicator)
  Io,            // file, socket or system failure
  Timeout,       // a deadline passed (collective, store wait)
  NotSupported,  // the backend or build lacks the feature
  Config,        // malformed or invalid configuration
  Remote,        // a peer failed or went away
  Aborted,       // the operation was aborted
  Internal,      // a bug
};

const char* to_string(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

#define DTRAIN_DEFINE_ERROR(Name, Kind)                                \
  class Name : public Error {                                          \
   public:                                                             \
    explicit Name(const std::string& m) : Error(ErrorKind::Kind, m) {} \
  };
DTRAIN_DEFINE_ERROR(InvalidUsage, InvalidUsage)
DTRAIN_DEFINE_ERROR(IoError, Io)
DTRAIN_DEFINE_ERROR(TimeoutError, Timeout)
DTRAIN_DEFINE_ERROR(NotSupported, NotSupported)
DTRAIN_DEFINE_ERROR(RemoteError, Remote)
DTRAIN_DEFINE_ERROR(AbortedError, Aborted)
DTRAIN_DEFINE_ERROR(InternalError, Internal)
#undef DTRAIN_DEFINE_ERROR

// A configuration error located in a file: "file:line:col: key 'a.b': message".
// line/column are 0 when unknown (e.g. a -o override, which names itself as file).
class ConfigError : public Error {
 public:
  ConfigError(std::string file, int line, int column, std::string key, const std::string& message);
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& key() const { return key_; }

 private:
  std::string file_;
  int line_;
  int column_;
  std::string key_;
};

}  // namespace dtrain
