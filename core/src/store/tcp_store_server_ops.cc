// The TCP store's requests: each operation, the GET, GETS and WAIT requests
// the server holds until their keys exist or their deadline passes, and the
// answers (a large value's GET answer built once). The event loop that feeds
// them is tcp_store_server.cc.

#include <algorithm>
#include <string>

#include "common/log.h"
#include "dtrain/error.h"
#include "store/store_util.h"
#include "store/tcp_store_server_impl.h"

namespace dtrain {
namespace {

using std::chrono::milliseconds;

bool constant_time_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

void TcpStoreServer::Impl::handle_hello(Conn& c, Reader& r) {
  if (static_cast<Op>(r.u8()) != Op::Hello) return refuse(c, "missing job token");
  if (r.u32() != kMagic) return refuse(c, "missing job token");
  uint32_t version = r.u32();
  std::string presented = r.str();
  r.end();
  if (version != kVersion)
    return refuse(c, "store protocol version " + std::to_string(version) + " is not the server's " +
                         std::to_string(kVersion) + " (mixed dtrain versions?)");
  if (presented.empty() && !token.empty()) return refuse(c, "missing job token");
  if (!constant_time_equal(presented, token)) return refuse(c, "wrong job token");
  c.authed = true;
  reply(c, Writer().u8(uint8_t(Status::Ok)).frame());
}

void TcpStoreServer::Impl::handle(Conn& c, Reader& r) {
  if (!c.authed) return handle_hello(c, r);
  auto op = static_cast<Op>(r.u8());
  switch (op) {
    case Op::Set: {
      std::string key = r.str();
      Bytes value = r.bytes();
      r.end();
      data[key] = std::move(value);
      reply(c, Writer().u8(uint8_t(Status::Ok)).frame());
      changed(key);
      return;
    }
    case Op::Get: {
      std::string key = r.str();
      int64_t timeout = r.i64();
      r.end();
      if (data.count(key)) return send_frame(c, get_answer(key));
      c.get_keys = {key};
      return start_wait(c, Op::Get, {key}, timeout);
    }
    case Op::TryGet: {
      std::string key = r.str();
      r.end();
      auto it = data.find(key);
      if (it == data.end()) return reply(c, Writer().u8(uint8_t(Status::NotFound)).frame());
      return reply(c, Writer().u8(uint8_t(Status::Ok)).bytes(it->second).frame());
    }
    case Op::Add: {
      std::string key = r.str();
      int64_t delta = r.i64();
      r.end();
      int64_t value;
      try {
        auto it = data.find(key);
        value =
            store_detail::checked_add(key, it == data.end() ? 0 : store_detail::parse_counter(key, it->second), delta);
      } catch (const Error& e) {
        return reply(c, Writer().u8(uint8_t(Status::Error)).str(e.what()).frame());
      }
      data[key] = store_detail::format_counter(value);
      reply(c, Writer().u8(uint8_t(Status::Ok)).i64(value).frame());
      changed(key);
      return;
    }
    case Op::CompareSet: {
      std::string key = r.str();
      Bytes expected = r.bytes();
      Bytes desired = r.bytes();
      r.end();
      auto it = data.find(key);
      if (it == data.end() ? expected.empty() : it->second == expected) {
        reply(c, Writer().u8(uint8_t(Status::Ok)).bytes(desired).frame());
        data[key] = std::move(desired);
        changed(key);
        return;
      }
      return reply(c, Writer().u8(uint8_t(Status::Ok)).bytes(it == data.end() ? Bytes{} : it->second).frame());
    }
    case Op::Check: {
      auto keys = r.strs();
      r.end();
      bool all = std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; });
      return reply(c, Writer().u8(uint8_t(Status::Ok)).u8(all ? 1 : 0).frame());
    }
    case Op::GetMany:
    case Op::Wait: {
      auto keys = r.strs();
      int64_t timeout = r.i64();
      r.end();
      std::vector<std::string> missing;
      for (const auto& k : keys)
        if (!data.count(k)) missing.push_back(k);
      if (missing.empty())
        return reply(c, op == Op::Wait ? Writer().u8(uint8_t(Status::Ok)).frame() : values_frame(keys));
      if (op == Op::GetMany) c.get_keys = std::move(keys);
      return start_wait(c, op, std::move(missing), timeout);
    }
    case Op::Remove: {
      std::string key = r.str();
      r.end();
      bool existed = data.erase(key) > 0;
      answers.erase(key);
      return reply(c, Writer().u8(uint8_t(Status::Ok)).u8(existed ? 1 : 0).frame());
    }
    default: throw ProtocolError("unknown operation " + std::to_string(int(op)));
  }
}

void TcpStoreServer::Impl::start_wait(Conn& c, Op op, std::vector<std::string> missing, int64_t timeout_ms) {
  c.waiting = true;
  c.wait_op = op;
  c.wait_keys = std::move(missing);
  c.deadline = store_detail::deadline_after(milliseconds(timeout_ms));
  for (const auto& k : c.wait_keys) waiters[k].insert(c.id);
  if (timeout_ms <= 0) return finish_wait(c, true);
  if (deadlines.size() > 4 * conns.size() + 1024) {
    // Requests answered early leave their entries behind; drop those.
    std::vector<Deadline> keep;
    for (; !deadlines.empty(); deadlines.pop()) {
      auto [when, id] = deadlines.top();
      auto it = conns.find(id);
      if (it != conns.end() && ((it->second->waiting && it->second->deadline == when) ||
                                (!it->second->authed && it->second->hello_deadline == when)))
        keep.emplace_back(when, id);
    }
    deadlines = decltype(deadlines)(std::greater<>(), std::move(keep));
  }
  deadlines.emplace(c.deadline, c.id);
}

void TcpStoreServer::Impl::key_created(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  auto ids = std::move(it->second);
  waiters.erase(it);
  for (uint64_t id : ids) {
    auto ci = conns.find(id);
    if (ci == conns.end()) continue;
    Conn& c = *ci->second;
    if (c.dead || !c.waiting) continue;
    auto& keys = c.wait_keys;
    keys.erase(std::remove_if(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; }),
               keys.end());
    if (keys.empty()) finish_wait(c, false);
  }
}

void TcpStoreServer::Impl::drop_waiter(Conn& c) {
  for (const auto& k : c.wait_keys) {
    auto it = waiters.find(k);
    if (it == waiters.end()) continue;
    it->second.erase(c.id);
    if (it->second.empty()) waiters.erase(it);
  }
}

std::vector<uint8_t> TcpStoreServer::Impl::values_frame(const std::vector<std::string>& keys) {
  size_t n = 5;
  for (const auto& k : keys) n += 4 + data.at(k).size();
  if (n > kMaxMessage)
    throw InvalidUsage("the values of " + std::to_string(keys.size()) + " keys (" + std::to_string(n) +
                       " bytes) exceed the 1 GiB answer limit: ask for fewer at once");
  Writer w;
  w.reserve(n).u8(uint8_t(Status::Ok)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.bytes(data.at(k));
  return w.frame();
}

void TcpStoreServer::Impl::changed(const std::string& key) {
  answers.erase(key);
  key_created(key);
}

TcpStoreServer::Impl::Frame TcpStoreServer::Impl::get_answer(const std::string& key) {
  if (auto it = answers.find(key); it != answers.end()) return it->second;
  const Bytes& value = data[key];
  auto f = std::make_shared<const std::vector<uint8_t>>(Writer().u8(uint8_t(Status::Ok)).bytes(value).frame());
  if (value.size() >= 1024 && value.size() <= (size_t(16) << 20)) answers.emplace(key, f);
  return f;
}

void TcpStoreServer::Impl::finish_wait(Conn& c, bool timed_out) {
  drop_waiter(c);
  if (!timed_out && c.wait_op == Op::GetMany) {
    // A key present when GETS came may have been removed since: wait for it again.
    for (const auto& k : c.get_keys)
      if (!data.count(k)) c.wait_keys.push_back(k);
    if (!c.wait_keys.empty()) {
      for (const auto& k : c.wait_keys) waiters[k].insert(c.id);
      return;  // still waiting, under the same deadline (its heap entry stands)
    }
  }
  c.waiting = false;
  try {
    if (timed_out) {
      reply(c, Writer().u8(uint8_t(Status::Timeout)).strs(c.wait_keys).frame());
    } else if (c.wait_op == Op::Get) {
      send_frame(c, get_answer(c.get_keys[0]));
    } else if (c.wait_op == Op::GetMany) {
      reply(c, values_frame(c.get_keys));
    } else {
      reply(c, Writer().u8(uint8_t(Status::Ok)).frame());
    }
  } catch (const std::exception& e) {
    reply(c, Writer().u8(uint8_t(Status::Error)).str(e.what()).frame());
  }
  c.wait_keys.clear();
  c.get_keys.clear();
  runnable.push_back(c.id);
}

void TcpStoreServer::Impl::expire(Clock::time_point now) {
  while (!deadlines.empty() && deadlines.top().first <= now) {
    uint64_t id = deadlines.top().second;
    deadlines.pop();
    auto it = conns.find(id);
    if (it == conns.end() || it->second->dead) continue;
    Conn& c = *it->second;
    if (c.waiting && c.deadline <= now) finish_wait(c, true);
    if (!c.authed && !c.closing && c.hello_deadline <= now)
      refuse(c, "missing job token (none presented within " + std::to_string(kHelloTimeout.count()) + " s)");
  }
}

}  // namespace dtrain
