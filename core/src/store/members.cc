#include <algorithm>
#include <string>

#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/store_util.h"

namespace dtrain {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kSlice{200};

std::string member_key(int i) { return "member/" + std::to_string(i); }

void put_u32(Bytes& out, size_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

Bytes encode_table(const std::vector<Bytes>& values) {
  size_t total = 4 + 4 * (values.size() + 1);
  for (const auto& v : values) total += v.size();
  Bytes out;
  out.reserve(total);
  put_u32(out, values.size());
  size_t off = 0;
  put_u32(out, off);
  for (const auto& v : values) put_u32(out, off += v.size());
  for (const auto& v : values) out.insert(out.end(), v.begin(), v.end());
  return out;
}

}  // namespace

MemberTable::MemberTable(Bytes encoded, int count) : data_(std::move(encoded)) {
  auto bad = [](const std::string& why) { return InvalidUsage("store key 'members/table' " + why); };
  if (data_.size() < 8) throw bad("is truncated");
  n_ = u32_at(0);
  if (n_ != static_cast<size_t>(count))
    throw bad("lists " + std::to_string(n_) + " members, expected " + std::to_string(count) +
              " (two joins sharing one key space?)");
  values_ = 4 + 4 * (n_ + 1);
  if (data_.size() < values_) throw bad("is truncated");
  size_t prev = 0;
  for (size_t i = 0; i <= n_; ++i) {
    size_t o = offset(i);
    if (o < prev) throw bad("is malformed");
    prev = o;
  }
  if (values_ + prev != data_.size()) throw bad("is truncated");
}

void publish_member(Store& store, int index, int count, const Bytes& value) {
  if (count < 1 || index < 0 || index >= count)
    throw InvalidUsage("member " + std::to_string(index) + " of " + std::to_string(count) + ": no such member");
  store.set(member_key(index), value);
  if (store.add("members/joined", 1) != count) return;
  std::vector<std::string> keys;
  keys.reserve(count);
  for (int i = 0; i < count; ++i) keys.push_back(member_key(i));
  store.set("members/table", encode_table(store.multi_get(keys, milliseconds(0))));
}

MemberTable read_members(Store& store, int count, milliseconds timeout, const std::function<void()>& between) {
  auto deadline = store_detail::deadline_after(timeout);
  for (;;) {
    if (between) between();
    auto left = std::chrono::duration_cast<milliseconds>(deadline - store_detail::Clock::now());
    try {
      return MemberTable(store.get("members/table", std::clamp(left, milliseconds(0), kSlice)), count);
    } catch (const TimeoutError&) {
      if (left > kSlice) continue;
    }
    std::string names;
    for (int i : missing_members(store, count)) names += (names.empty() ? "" : ", ") + std::to_string(i);
    throw TimeoutError("timed out after " + std::to_string(timeout.count()) + " ms: " +
                       (names.empty() ? "every member published, but the table was not written"
                                      : "members " + names + " of " + std::to_string(count) + " have not joined"));
  }
}

std::vector<int> missing_members(Store& store, int count) {
  std::vector<int> out;
  for (int i = 0; i < count; ++i)
    if (!store.check({member_key(i)})) out.push_back(i);
  return out;
}

}  // namespace dtrain
