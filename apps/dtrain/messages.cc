#include "messages.h"

#include <sstream>

#include <toml++/toml.h>

#include "dtrain/error.h"

namespace dtrain::launch {

namespace {

toml::array to_array(const std::vector<std::string>& v) {
  toml::array a;
  for (const std::string& s : v) a.push_back(s);
  return a;
}

std::vector<std::string> from_array(const toml::node_view<const toml::node>& n) {
  std::vector<std::string> out;
  if (const toml::array* a = n.as_array())
    for (const toml::node& e : *a)
      if (auto s = e.value<std::string>()) out.push_back(*s);
  return out;
}

std::string to_text(const toml::table& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

}  // namespace

std::string NodeInfo::encode() const {
  return to_text(toml::table{{"node", node},
                             {"ip", ip},
                             {"hostname", hostname},
                             {"version", version},
                             {"workers", to_array(workers)},
                             {"servers", to_array(servers)}});
}

NodeInfo NodeInfo::decode(const std::string& text, const std::string& key) {
  toml::table t;
  try {
    t = toml::parse(text);
  } catch (const toml::parse_error& e) {
    throw InvalidUsage("store key " + key + " does not hold a machine's description (" + std::string(e.description()) +
                       "): another program wrote it, or mixed dtrain versions");
  }
  const toml::table& c = t;
  NodeInfo n;
  n.node = static_cast<int>(c["node"].value_or<int64_t>(-1));
  n.ip = c["ip"].value_or<std::string>("");
  n.hostname = c["hostname"].value_or<std::string>("");
  n.version = c["version"].value_or<std::string>("");
  n.workers = from_array(c["workers"]);
  n.servers = from_array(c["servers"]);
  return n;
}

std::string Failure::encode() const {
  return to_text(toml::table{
      {"time_ms", time_ms}, {"signal", signal}, {"consequence", consequence}, {"summary", summary}, {"text", text}});
}

Failure Failure::decode(const std::string& value) {
  Failure f;
  toml::table t;
  try {
    t = toml::parse(value);
  } catch (const toml::parse_error&) {
    f.text = value;
    f.summary = value.substr(0, value.find('\n'));
    return f;
  }
  const toml::table& c = t;
  f.time_ms = c["time_ms"].value_or<int64_t>(0);
  f.signal = static_cast<int>(c["signal"].value_or<int64_t>(0));
  f.consequence = c["consequence"].value_or(false);
  f.summary = c["summary"].value_or<std::string>("");
  f.text = c["text"].value_or<std::string>("");
  return f;
}

}  // namespace dtrain::launch
