#include "common/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>

#include "dtrain/error.h"

namespace dtrain::apps {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The few messages of apps/common/proto/tensorboard.proto, in protobuf's wire
// format by hand: no libprotobuf in the apps (a PyTorch wheel's libtorch may
// carry its own protobuf). tests/apps/tensorboard_test checks these bytes
// against the classes protoc generates from that file.
void put_varint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void put_tag(std::string* out, int field, int wire) { put_varint(out, (uint64_t(field) << 3) | uint64_t(wire)); }

void put_bytes(std::string* out, int field, const std::string& b) {
  put_tag(out, field, 2);
  put_varint(out, b.size());
  out->append(b);
}

template <typename T>
void put_fixed(std::string* out, int field, T v) {
  put_tag(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host, as the wire format wants
  out->append(b, sizeof(T));
}

// Event{wall_time = 1, step = 2, file_version = 3 | summary = 5}.
std::string event_bytes(double wall_time, int64_t step, const std::string* file_version, const std::string* summary) {
  std::string e;
  if (wall_time != 0) put_fixed(&e, 1, wall_time);
  if (step != 0) put_tag(&e, 2, 0), put_varint(&e, static_cast<uint64_t>(step));
  if (file_version) put_bytes(&e, 3, *file_version);
  if (summary) put_bytes(&e, 5, *summary);
  return e;
}

// A protobuf message's fields, one at a time; false at the end, throws on
// malformed bytes.
struct WireReader {
  explicit WireReader(std::string_view b) : p(b.data()), end(b.data() + b.size()) {}
  const char* p;
  const char* end;
  int field = 0, wire = 0;
  uint64_t varint = 0;
  std::string_view bytes;

  struct Malformed {};
  uint64_t read_varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p == end) throw Malformed{};
      uint8_t c = static_cast<uint8_t>(*p++);
      v |= uint64_t(c & 0x7f) << shift;
      if (!(c & 0x80)) return v;
    }
    throw Malformed{};
  }
  bool next() {
    if (p == end) return false;
    uint64_t key = read_varint();
    field = static_cast<int>(key >> 3);
    wire = static_cast<int>(key & 7);
    size_t n = 0;
    switch (wire) {
      case 0: varint = read_varint(); return true;
      case 1: n = 8; break;
      case 5: n = 4; break;
      case 2: n = read_varint(); break;
      default: throw Malformed{};  // groups: not in these messages
    }
    if (n > static_cast<size_t>(end - p)) throw Malformed{};
    bytes = std::string_view(p, n);
    p += n;
    return true;
  }
  template <typename T>
  T fixed() const {
    T v{};
    if (bytes.size() == sizeof(T)) std::memcpy(&v, bytes.data(), sizeof(T));
    return v;
  }
};

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError("cannot create TensorBoard folder '" + dir + "': " + ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) +
                                         "." + host + "." + std::to_string(getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw IoError("cannot create TensorBoard event file '" + path_ + "': " + std::strerror(errno));
  const std::string version = "brain.Event:2";
  write_record(event_bytes(now_seconds(), 0, &version, nullptr));
  flush();
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::write_record(const std::string& data) {
  uint64_t len = data.size();
  char header[12];
  std::memcpy(header, &len, 8);  // little-endian host, as the format wants
  uint32_t lcrc = masked_crc32c(header, 8);
  std::memcpy(header + 8, &lcrc, 4);
  uint32_t dcrc = masked_crc32c(data.data(), data.size());
  std::fwrite(header, 1, 12, file_);
  std::fwrite(data.data(), 1, data.size(), file_);
  std::fwrite(&dcrc, 1, 4, file_);
}

void EventWriter::add_scalar(const std::string& tag, float value, int64_t step) {
  std::string v, summary;  // Summary{value = 1: Value{tag = 1, simple_value = 2}}
  put_bytes(&v, 1, tag);
  put_fixed(&v, 2, value);
  put_bytes(&summary, 1, v);
  write_record(event_bytes(now_seconds(), step, nullptr, &summary));
}

void EventWriter::flush() {
  if (file_ && std::fflush(file_) != 0)
    throw IoError("cannot write TensorBoard event file '" + path_ + "': " + std::strerror(errno));
}

std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open TensorBoard event file '" + path + "'");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  size_t off = 0;
  auto bad = [&](const std::string& what) {
    return IoError("TensorBoard event file '" + path + "': record " + std::to_string(records.size()) + " at byte " +
                   std::to_string(off) + ": " + what);
  };
  while (off < bytes.size()) {
    if (bytes.size() - off < 12) throw bad("truncated header");
    uint64_t len;
    uint32_t lcrc, dcrc;
    std::memcpy(&len, bytes.data() + off, 8);
    std::memcpy(&lcrc, bytes.data() + off + 8, 4);
    if (lcrc != masked_crc32c(bytes.data() + off, 8)) throw bad("length CRC mismatch");
    if (len > bytes.size() - off - 12 || bytes.size() - off - 12 - len < 4) throw bad("truncated data");
    const char* data = bytes.data() + off + 12;
    std::memcpy(&dcrc, data + len, 4);
    if (dcrc != masked_crc32c(data, len)) throw bad("data CRC mismatch");
    records.emplace_back(data, len);
    off += 12 + len + 4;
  }
  return records;
}

std::vector<ScalarEvent> read_scalars(const std::string& path) {
  std::vector<ScalarEvent> out;
  auto records = read_records(path);
  for (size_t i = 0; i < records.size(); ++i) {
    auto where = [&] { return "TensorBoard event file '" + path + "': record " + std::to_string(i) + ": "; };
    double wall_time = 0;
    int64_t step = 0;
    int what = 0;  // the oneof's field: 3 file_version, 4 graph_def, 5 summary (the last one wins)
    std::string_view version, summary;
    std::vector<std::pair<std::string, float>> values;
    try {
      WireReader e(records[i]);
      while (e.next()) {
        if (e.field == 1 && e.wire == 1) wall_time = e.fixed<double>();
        if (e.field == 2 && e.wire == 0) step = static_cast<int64_t>(e.varint);
        if (e.field >= 3 && e.field <= 5 && e.wire == 2) what = e.field, version = summary = e.bytes;
      }
      if (what == 5) {
        WireReader s(summary);
        while (s.next()) {
          if (s.field != 1 || s.wire != 2) continue;
          WireReader v(s.bytes);
          std::string tag;
          bool simple = false;
          float value = 0;
          while (v.next()) {
            if (v.field == 1 && v.wire == 2) tag = std::string(v.bytes);
            if (v.field == 2 && v.wire == 5) simple = true, value = v.fixed<float>();
            if (v.field >= 3 && v.field <= 8 && v.field != 7) simple = false;  // another member of the value oneof
          }
          if (simple) values.emplace_back(std::move(tag), value);
        }
      }
    } catch (const WireReader::Malformed&) {
      throw IoError(where() + "not an Event protobuf");
    }
    if (i == 0) {
      if (what != 3 || version.rfind("brain.Event:", 0) != 0)
        throw IoError(where() + "the first record is not a file version ('brain.Event:N')");
      continue;
    }
    for (auto& [tag, value] : values) out.push_back({step, tag, value, wall_time});
  }
  return out;
}

}  // namespace dtrain::apps
