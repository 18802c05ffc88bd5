#pragma once
// What the machines' dtrain processes tell each other through the job store,
// encoded as TOML tables (one table per store value).

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::launch {

// One machine's dtrain at the start of the job (store key launch/join/member/<n>, see publish_member).
struct NodeInfo {
  int node = 0;
  std::string ip, hostname, version;
  std::vector<std::string> workers, servers;  // endpoints of its processes

  std::string encode() const;
  // Throws InvalidUsage naming key when the text is not a node table.
  static NodeInfo decode(const std::string& text, const std::string& key);
};

// One failure seen by one machine (store key launch/a<attempt>/fail/<i>).
struct Failure {
  int64_t time_ms = 0;  // Unix time of the failure
  int signal = 0;       // the signal that killed the process (0: none, or SIGPIPE)
  // The process's communicator aborted because it lost a peer (its error file
  // says so): a consequence of another failure, never chosen over one.
  bool consequence = false;
  std::string summary;  // one line
  std::string text;     // the report body

  std::string encode() const;
  // A value that is not a failure table becomes a failure whose text is the value.
  static Failure decode(const std::string& text);
};

}  // namespace dtrain::launch
