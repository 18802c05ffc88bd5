#include "report.h"

#include <signal.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <sstream>
#include <utility>
#include <cstdlib>

#include <fmt/format.h>

#include "dtrain/sdk/strings.h"

namespace dtrain::launch {

namespace {

// Lines of a failed process's log shown in the report, and follow-up failures listed.
constexpr int kLogTailLines = 20;
constexpr size_t kFollowUpsShown = 7;

std::string format_time(int64_t ms) {
  time_t secs = static_cast<time_t>(ms / 1000);
  tm t{};
  localtime_r(&secs, &t);
  char buf[64];
  strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &t);
  return fmt::format("{}.{:03d}", buf, static_cast<int>(ms % 1000));
}

std::string indent(const std::string& text, const std::string& prefix) {
  std::string out;
  for (const std::string& line : sdk::split(text, '\n')) out += prefix + line + "\n";
  return out;
}

// The first JSON string value of `key` in text (torch's error file is
// {"message": {"message": "...", "extraInfo": {"py_callstack": "..."}}}),
// unescaped; "" when absent.
std::string json_string(const std::string& text, const std::string& key) {
  for (size_t at = text.find('"' + key + '"'); at != std::string::npos; at = text.find('"' + key + '"', at + 1)) {
    size_t i = text.find_first_not_of(" \t\r\n", at + key.size() + 2);
    if (i == std::string::npos || text[i] != ':') continue;
    i = text.find_first_not_of(" \t\r\n", i + 1);
    if (i == std::string::npos || text[i] != '"') continue;
    std::string out;
    for (++i; i < text.size() && text[i] != '"'; ++i) {
      if (text[i] != '\\' || i + 1 >= text.size()) {
        out += text[i];
        continue;
      }
      char c = text[++i];
      if (c == 'n')
        out += '\n';
      else if (c == 't')
        out += '\t';
      else if (c == 'u' && i + 4 < text.size()) {
        unsigned long cp = std::strtoul(text.substr(i + 1, 4).c_str(), nullptr, 16);
        out += cp < 0x80 ? static_cast<char>(cp) : '?';
        i += 4;
      } else
        out += c;
    }
    return out;
  }
  return "";
}

// What torch's @record wrote for a Python program's uncaught exception:
// (the exception line, its traceback), or empty strings.
std::pair<std::string, std::string> python_error(const JobPlan& plan, const Slot& s) {
  std::ifstream in(plan.python_error_file(s));
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  return {json_string(text, "message"), json_string(text, "py_callstack")};
}

}  // namespace

namespace {

std::string process_text(const JobPlan& plan, const Slot& s, const Process& p, int attempt, const std::string& endpoint,
                         const std::string& how, int64_t time_ms) {
  return fmt::format(
      "root cause: {} {}\n  role {}, rank {}, local rank {}, machine {} ({}), {}attempt {}, at {}\n"
      "  log {} (last lines):\n{}",
      s.name(), how, s.role_name(), s.index, s.local, plan.machines.node, plan.machines.my_ip,
      endpoint.empty() ? "" : "endpoint " + endpoint + ", ", attempt, format_time(time_ms), plan.log_file(s),
      indent(p.log_tail(kLogTailLines), "    | "));
}

std::string with_endpoint(const Slot& s, const std::string& endpoint) {
  return endpoint.empty() ? s.name() : fmt::format("{} ({})", s.name(), endpoint);
}

}  // namespace

Failure describe_exit(const JobPlan& plan, const Slot& s, const Process& p, int attempt, const std::string& endpoint) {
  const int node = plan.machines.node;
  const std::string& ip = plan.machines.my_ip;
  Failure f;
  f.time_ms = p.exit_time_ms();
  // SIGPIPE is what a peer's death does to a process writing to it: not a cause.
  f.signal = p.term_signal() == SIGPIPE ? 0 : p.term_signal();
  std::string how = p.term_signal() ? "was killed by " + signal_name(p.term_signal())
                                    : "exited with code " + std::to_string(p.exit_code());
  std::ifstream ef(plan.error_file(s));
  std::string kind;
  // A SIGPIPE death is a consequence too: the launcher then waits for the
  // peer whose death closed the socket to be reaped, and names it first.
  f.consequence = (std::getline(ef, kind) && kind == "peer") || p.term_signal() == SIGPIPE;
  f.summary = fmt::format("{} {} (node {}, {}, pid {}){}", with_endpoint(s, endpoint), how, node, ip, p.pid(),
                          f.consequence ? " after losing a peer" : "");
  f.text = process_text(plan, s, p, attempt, endpoint, how, f.time_ms);
  auto [message, traceback] = python_error(plan, s);
  if (!message.empty()) {
    f.summary += ": " + message;
    f.text += "  Python exception (torch's @record, TORCHELASTIC_ERROR_FILE): " + message + "\n";
    if (!traceback.empty()) f.text += indent(traceback, "    | ");
  }
  return f;
}

Failure describe_stuck_server(const JobPlan& plan, const Slot& s, const Process& p, int attempt,
                              const std::string& endpoint, double waited_s) {
  Failure f;
  f.time_ms = unix_ms();
  std::string how = fmt::format(
      "did not exit within {} s after every worker had finished and the launcher set ps/stop; it was killed "
      "(SIGKILL). A larger --server_stop_timeout gives a slow save more time",
      waited_s);
  f.summary = fmt::format("{} {} (node {}, {}, pid {})", with_endpoint(s, endpoint), "did not exit after ps/stop",
                          plan.machines.node, plan.machines.my_ip, p.pid());
  f.text = process_text(plan, s, p, attempt, endpoint, how, f.time_ms);
  return f;
}

Failure machine_failure(int64_t time_ms, const std::string& summary, const std::string& detail) {
  Failure f;
  f.time_ms = time_ms;
  f.summary = summary;
  f.text = "root cause: " + summary + detail + "\n";
  return f;
}

void order_by_root_cause(std::vector<Failure>& all) {
  const int64_t tie = kSignalTieBreak.count();
  std::stable_sort(all.begin(), all.end(), [tie](const Failure& x, const Failure& y) {
    if (x.consequence != y.consequence) return y.consequence;
    return x.time_ms - (x.signal ? tie : 0) < y.time_ms - (y.signal ? tie : 0);
  });
}

std::string failure_report(const std::vector<Failure>& all, double grace_s) {
  std::ostringstream r;
  r << "======================== dtrain: job failed ========================\n";
  r << all[0].text;
  if (all.size() > 1) {
    r << "  then:\n";
    for (size_t i = 1; i < all.size() && i <= kFollowUpsShown; ++i) r << "    " << all[i].summary << "\n";
  }
  r << fmt::format("  every other process of the job was stopped (SIGTERM, SIGKILL after {} s)\n", grace_s);
  r << "====================================================================\n";
  return r.str();
}

}  // namespace dtrain::launch
