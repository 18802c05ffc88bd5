#include "dtrain/role_maker.h"

#include <cstdlib>

#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"

namespace dtrain {

using sdk::trim;

namespace {

// One host-list item, its bracket groups expanded left to right.
void expand_hosts(const std::string& list, const std::string& item, std::vector<std::string>& out) {
  auto open = item.find('[');
  if (open == std::string::npos) {
    out.push_back(item);
    return;
  }
  auto close = item.find(']', open);
  const std::string prefix = item.substr(0, open), suffix = item.substr(close + 1);
  for (const std::string& range : sdk::split(item.substr(open + 1, close - open - 1), ',')) {
    auto dash = range.find('-');
    const std::string lo = range.substr(0, dash), hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    char* end = nullptr;
    long a = std::strtol(lo.c_str(), &end, 10);
    bool ok = !lo.empty() && *end == '\0';
    long b = std::strtol(hi.c_str(), &end, 10);
    if (!ok || hi.empty() || *end != '\0' || a > b || b - a >= 100000)
      throw InvalidUsage("Slurm host list '" + list + "': '" + range + "' is not a range such as 01-04");
    for (long v = a; v <= b; ++v) {
      std::string num = std::to_string(v);
      if (num.size() < lo.size()) num.insert(0, lo.size() - num.size(), '0');
      expand_hosts(list, prefix + num + suffix, out);
    }
  }
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(const std::string& list) {
  std::vector<std::string> items(1);
  int depth = 0;
  for (char c : list) {
    depth += c == '[' ? 1 : c == ']' ? -1 : 0;
    if (depth < 0 || depth > 1) throw InvalidUsage("Slurm host list '" + list + "' has unbalanced brackets");
    if (c == ',' && depth == 0)
      items.emplace_back();
    else
      items.back() += c;
  }
  if (depth != 0) throw InvalidUsage("Slurm host list '" + list + "' has an unmatched '['");
  std::vector<std::string> out;
  for (const std::string& item : items)
    if (!trim(item).empty()) expand_hosts(list, trim(item), out);
  return out;
}

}  // namespace dtrain
