#include "service/wire.h"

#include <cctype>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>

namespace dtrain::ps_grpc {

grpc::StatusCode grpc_code(dt_status_t status) {
  switch (status) {
    case DT_OK: return grpc::StatusCode::OK;
    case DT_ERR_INVALID_USAGE: return grpc::StatusCode::INVALID_ARGUMENT;
    case DT_ERR_TIMEOUT: return grpc::StatusCode::DEADLINE_EXCEEDED;
    case DT_ERR_NOT_SUPPORTED: return grpc::StatusCode::UNIMPLEMENTED;
    case DT_ERR_ABORTED: return grpc::StatusCode::ABORTED;
    case DT_ERR_REMOTE: return grpc::StatusCode::FAILED_PRECONDITION;
    case DT_ERR_SYSTEM: return grpc::StatusCode::DATA_LOSS;
    default: return grpc::StatusCode::INTERNAL;
  }
}

// ps.proto's TableDesc holds every listed field by its name, of its listed
// type (proto3's int32/uint32/uint64/double getters return exactly these).
#define DTRAIN_PS_PROTO_TYPE(field, type, ...)                                                          \
  static_assert(std::is_same_v<std::decay_t<decltype(std::declval<const TableDesc&>().field())>, type>, \
                "ps.proto's TableDesc." #field " is not of its listed type (dtrain/sdk/ps_table_fields.h)");
DTRAIN_PS_TABLE_FIELDS(DTRAIN_PS_PROTO_TYPE)
#undef DTRAIN_PS_PROTO_TYPE

void to_proto(const sdk::TableDesc& d, TableDesc* p) {
  p->set_name(d.name);
#define DTRAIN_PS_SET(field, ...) p->set_##field(d.field);
  DTRAIN_PS_TABLE_FIELDS(DTRAIN_PS_SET)
#undef DTRAIN_PS_SET
}

sdk::TableDesc from_proto(const TableDesc& p) {
  sdk::TableDesc d;
  d.name = p.name();
#define DTRAIN_PS_GET(field, ...) d.field = p.field();
  DTRAIN_PS_TABLE_FIELDS(DTRAIN_PS_GET)
#undef DTRAIN_PS_GET
  return d;
}

void check_desc(const sdk::TableDesc& d) {
  auto bad = [&](const std::string& what) { sdk::fail(DT_ERR_INVALID_USAGE, "ps table '" + d.name + "': " + what); };
  if (d.name.empty()) sdk::fail(DT_ERR_INVALID_USAGE, "ps table: the name is empty");
  for (char c : d.name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-')
      bad("the name may hold only letters, digits, '_', '.' and '-'");
  if (d.name == "." || d.name == "..") bad("the name may not be '.' or '..'");
  if (d.kind != DT_PS_TABLE_DENSE && d.kind != DT_PS_TABLE_SPARSE)
    bad("kind " + std::to_string(d.kind) + " is unknown");
  if (d.dim == 0) bad("dim is 0");
  if (d.dtype != DT_DTYPE_F32) bad(std::string("dtype ") + sdk::dtype_name(d.dtype) + " is not supported (only f32)");
  if (d.mode < DT_PS_MODE_SYNC || d.mode > DT_PS_MODE_GEO) bad("mode " + std::to_string(d.mode) + " is unknown");
  if (d.optimizer < DT_PS_OPT_SGD || d.optimizer > DT_PS_OPT_ADAM)
    bad("optimizer " + std::to_string(d.optimizer) + " is unknown");
  if (d.initializer < DT_PS_INIT_CONSTANT || d.initializer > DT_PS_INIT_NORMAL)
    bad("initializer " + std::to_string(d.initializer) + " is unknown");
  if (d.mode == DT_PS_MODE_GEO && d.optimizer != DT_PS_OPT_SGD)
    bad("GEO mode takes only the sgd rule (the workers apply the optimizer)");
}

namespace {
// Appends the varint of v at p; returns the bytes written (at most 10).
size_t put_varint(uint8_t* p, uint64_t v) {
  size_t h = 0;
  for (;; v >>= 7) {
    p[h++] = static_cast<uint8_t>(v < 0x80 ? v : (v & 0x7f) | 0x80);
    if (v < 0x80) return h;
  }
}
}  // namespace

char* RawMessage::make_bytes(uint32_t field, size_t n) {
  if (n == 0) return make_bytes(field, 0, nullptr, nullptr, nullptr);
  char* mem = static_cast<char*>(std::malloc(16 + n));
  if (!mem) throw std::bad_alloc();
  return make_bytes(
      field, n, mem, [](void* m) { std::free(m); }, mem);
}

char* RawMessage::make_bytes(uint32_t field, size_t n, char* mem, void (*release)(void*), void* user) {
  slices.clear();
  if (n == 0) {
    if (release) release(user);
    slices.emplace_back();
    return nullptr;
  }
  uint8_t head[16];
  size_t h = 0;
  head[h++] = static_cast<uint8_t>(field << 3 | 2);
  h += put_varint(head + h, n);
  // The payload 16-byte aligned (the table writes floats into it), the header just before it.
  char* payload = mem + 16;
  std::memcpy(payload - h, head, h);
  slices.emplace_back(payload - h, h + n, release, user);
  return payload;
}

void RawMessage::add_varint(uint32_t field, uint64_t v) {
  uint8_t head[16];
  size_t h = 0;
  head[h++] = static_cast<uint8_t>(field << 3 | 0);
  h += put_varint(head + h, v);
  slices.emplace_back(head, h);
}

void RawMessage::add_bytes(uint32_t field, grpc::Slice data) {
  uint8_t head[16];
  size_t h = 0;
  head[h++] = static_cast<uint8_t>(field << 3 | 2);
  h += put_varint(head + h, data.size());
  slices.emplace_back(head, h);
  if (data.size() > 0) slices.push_back(std::move(data));
}

bool BytesField::open(const grpc::ByteBuffer& bb, uint32_t field) {
  slices_.clear();
  skip_ = size_ = 0;
  const size_t total = bb.Length();
  if (total == 0) return true;
  if (!bb.Dump(&slices_).ok()) return false;
  // The header (tag, varint length) may straddle slices: gather its first bytes.
  uint8_t head[11];
  size_t got = 0;
  for (const grpc::Slice& s : slices_) {
    const size_t take = std::min(sizeof(head) - got, s.size());
    std::memcpy(head + got, s.begin(), take);
    got += take;
    if (got == sizeof(head)) break;
  }
  if (head[0] != static_cast<uint8_t>(field << 3 | 2)) return false;
  uint64_t len = 0;
  size_t h = 1;
  for (int shift = 0;; shift += 7) {
    if (h >= got || shift > 63) return false;
    const uint8_t b = head[h++];
    len |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) break;
  }
  if (h + len != total) return false;  // another field, or a truncated one
  skip_ = h;
  size_ = len;
  return true;
}

bool FieldReader::open(const grpc::ByteBuffer& bb) {
  slices_.clear();
  slice_ = at_ = 0;
  return bb.Length() == 0 || bb.Dump(&slices_).ok();
}

uint8_t FieldReader::byte() {
  while (slice_ < slices_.size() && at_ == slices_[slice_].size()) ++slice_, at_ = 0;
  if (slice_ == slices_.size()) sdk::fail(DT_ERR_INVALID_USAGE, "a truncated message");
  return slices_[slice_].begin()[at_++];
}

uint64_t FieldReader::varint() {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    const uint8_t b = byte();
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  sdk::fail(DT_ERR_INVALID_USAGE, "a malformed message (a varint of more than 10 bytes)");
}

bool FieldReader::next(uint32_t* field, uint32_t* type, uint64_t* value) {
  for (;;) {
    while (slice_ < slices_.size() && at_ == slices_[slice_].size()) ++slice_, at_ = 0;
    if (slice_ == slices_.size()) return false;
    const uint64_t tag = varint();
    *field = static_cast<uint32_t>(tag >> 3);
    *type = static_cast<uint32_t>(tag & 7);
    switch (*type) {
      case 0:
      case 2: *value = varint(); return true;
      case 1: skip(8); break;
      case 5: skip(4); break;
      default: sdk::fail(DT_ERR_INVALID_USAGE, "a malformed message (wire type " + std::to_string(*type) + ")");
    }
  }
}

template <typename F>
void FieldReader::take(size_t n, F&& f) {
  while (n > 0) {
    while (slice_ < slices_.size() && at_ == slices_[slice_].size()) ++slice_, at_ = 0;
    if (slice_ == slices_.size()) sdk::fail(DT_ERR_INVALID_USAGE, "a truncated message");
    const size_t k = std::min(n, slices_[slice_].size() - at_);
    f(reinterpret_cast<const char*>(slices_[slice_].begin()) + at_, k);
    at_ += k, n -= k;
  }
}

void FieldReader::copy_to(char* dst, size_t n) {
  take(n, [&](const char* p, size_t k) {
    std::memcpy(dst, p, k);
    dst += k;
  });
}

std::string FieldReader::text(size_t n) {
  std::string s;
  take(n, [&](const char* p, size_t k) { s.append(p, k); });
  return s;
}

void FieldReader::skip(size_t n) {
  take(n, [](const char*, size_t) {});
}

void BytesField::copy_to(char* dst) const {
  for_each_span([&](const char* p, size_t n) {
    std::memcpy(dst, p, n);
    dst += n;
  });
}

grpc::ByteBuffer sparse_pull_request(int32_t worker, const std::string& table, uint64_t total_keys, uint64_t n,
                                     const std::function<void(char* dst)>& write_keys) {
  // worker (1, varint), table (2, bytes), total_keys (3, varint), keys (4, bytes).
  uint8_t head[64];
  size_t h = 0;
  head[h++] = SparsePull::kWorkerFieldNumber << 3 | 0;
  h += put_varint(head + h, static_cast<uint64_t>(static_cast<int64_t>(worker)));
  head[h++] = SparsePull::kTableFieldNumber << 3 | 2;
  h += put_varint(head + h, table.size());
  const size_t table_at = h;
  uint8_t tail[32];
  size_t t = 0;
  tail[t++] = SparsePull::kTotalKeysFieldNumber << 3 | 0;
  t += put_varint(tail + t, total_keys);
  tail[t++] = SparsePull::kKeysFieldNumber << 3 | 2;
  t += put_varint(tail + t, n * sizeof(uint64_t));
  const size_t header = table_at + table.size() + t;
  grpc::Slice slice(header + n * sizeof(uint64_t));
  uint8_t* msg = const_cast<uint8_t*>(slice.begin());
  std::memcpy(msg, head, table_at);
  std::memcpy(msg + table_at, table.data(), table.size());
  std::memcpy(msg + table_at + table.size(), tail, t);
  // Written before the buffer is made: a small slice is inlined (copied by value).
  write_keys(reinterpret_cast<char*>(msg + header));
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer to_buffer(const google::protobuf::MessageLite& m) {
  grpc::Slice s(m.ByteSizeLong());
  m.SerializeWithCachedSizesToArray(const_cast<uint8_t*>(s.begin()));
  return grpc::ByteBuffer(&s, 1);
}

grpc::Slice lease_slice(Staging::Lease lease, size_t bytes) {
  if (bytes == 0) return grpc::Slice();
  auto* held = new Staging::Lease(std::move(lease));
  return grpc::Slice(
      held->as<char>(), bytes, [](void* l) { delete static_cast<Staging::Lease*>(l); }, held);
}

void SparsePushReader::bad(const std::string& what) const {
  sdk::fail(DT_ERR_INVALID_USAGE, "table '" + header_.table + "': a sparse push " + what);
}

void SparsePushReader::read(const grpc::ByteBuffer& bb, const std::function<Target(const Header&)>& begin) {
  FieldReader r;
  if (!r.open(bb)) sdk::fail(DT_ERR_INVALID_USAGE, "an unreadable sparse push chunk");
  auto start = [&] {
    if (started_) return;
    to_ = begin(header_);
    started_ = true;
  };
  uint64_t v = 0, k = 0;
  uint32_t f = 0, type = 0;
  bool have_keys = false, have_grads = false, have_sc = false;
  while (r.next(&f, &type, &v)) {
    if (!started_ && type == 0 && f == SparsePush::kWorkerFieldNumber) {
      header_.worker = static_cast<int32_t>(v);
    } else if (!started_ && type == 2 && f == SparsePush::kTableFieldNumber) {
      header_.table = r.text(v);
    } else if (!started_ && type == 0 && f == SparsePush::kTotalKeysFieldNumber) {
      header_.total = v;
    } else if (!started_ && type == 0 && f == SparsePush::kHasShowClickFieldNumber) {
      header_.show_click = v != 0;
    } else if (type == 2 && f == SparsePush::kKeysFieldNumber) {
      start();
      if (have_keys) bad("message carries its keys twice");
      if (v % sizeof(uint64_t) != 0) bad("'s keys are " + std::to_string(v) + " bytes, not a multiple of 8");
      k = v / sizeof(uint64_t);
      if (k > header_.total - got_) bad("announced " + std::to_string(header_.total) + " keys and sent more");
      r.copy_to(reinterpret_cast<char*>(to_.keys + got_), v);
      have_keys = true;
    } else if (type == 2 && f == SparsePush::kGradsFieldNumber) {
      start();
      if (have_grads) bad("message carries its gradients twice");
      if (v != k * to_.dim * sizeof(float))
        bad("of " + std::to_string(k) + " keys carries " + std::to_string(v / sizeof(float)) +
            " gradient values; dim is " + std::to_string(to_.dim) + ", so " + std::to_string(k * to_.dim) +
            " were expected");
      r.copy_to(reinterpret_cast<char*>(to_.grads + got_ * to_.dim), v);
      have_grads = true;
    } else if (type == 2 && f == SparsePush::kShowClickFieldNumber) {
      start();
      if (have_sc) bad("message carries its show/click twice");
      if (!header_.show_click || v != k * 2 * sizeof(float))
        bad("of " + std::to_string(k) + " keys carries " + std::to_string(v / sizeof(float)) +
            " show/click values, not " + std::to_string(header_.show_click ? 2 * k : 0));
      r.copy_to(reinterpret_cast<char*>(to_.show_click + 2 * got_), v);
      have_sc = true;
    } else if (type == 2) {
      r.skip(v);
    }
  }
  start();
  if (k > 0 && !have_grads)
    bad("of " + std::to_string(k) + " keys carries 0 gradient values; dim is " + std::to_string(to_.dim) + ", so " +
        std::to_string(k * to_.dim) + " were expected");
  if (k > 0 && header_.show_click && !have_sc)
    bad("of " + std::to_string(k) + " keys carries 0 show/click values, not " + std::to_string(2 * k));
  got_ += k;
}

void SparsePushReader::finish() const {
  if (got_ != header_.total) bad("sent " + std::to_string(got_) + " of " + std::to_string(header_.total) + " keys");
}

}  // namespace dtrain::ps_grpc
