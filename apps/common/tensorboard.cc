#include "common/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "dtrain/error.h"

namespace dtrain::apps {

namespace {

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_tag(std::string& out, int field, int wire) { put_varint(out, (uint64_t(field) << 3) | uint64_t(wire)); }

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

template <typename T>
void put_fixed(std::string& out, int field, int wire, T v) {
  put_tag(out, field, wire);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host
  out.append(b, sizeof(T));
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event { double wall_time = 1; int64 step = 2; oneof { string file_version = 3; Summary summary = 5; } }
std::string event(int64_t step, const std::string* file_version, const std::string* summary) {
  std::string e;
  put_fixed<double>(e, 1, 1, now_seconds());
  if (step != 0) {
    put_tag(e, 2, 0);
    put_varint(e, static_cast<uint64_t>(step));
  }
  if (file_version) put_bytes(e, 3, *file_version);
  if (summary) put_bytes(e, 5, *summary);
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static uint32_t table[256];
  static bool init = [] {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      table[i] = c;
    }
    return true;
  }();
  (void)init;
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
  std::string version = "brain.Event:2";
  write_record(event(0, &version, nullptr));
  flush();
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::write_record(const std::string& data) {
  uint64_t len = data.size();
  char header[12];
  std::memcpy(header, &len, 8);
  uint32_t lcrc = masked_crc32c(header, 8);
  std::memcpy(header + 8, &lcrc, 4);
  uint32_t dcrc = masked_crc32c(data.data(), data.size());
  std::fwrite(header, 1, 12, file_);
  std::fwrite(data.data(), 1, data.size(), file_);
  std::fwrite(&dcrc, 1, 4, file_);
}

void EventWriter::add_scalar(const std::string& tag, float value, int64_t step) {
  // Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
  std::string v;
  put_bytes(v, 1, tag);
  put_fixed<float>(v, 2, 5, value);
  std::string summary;
  put_bytes(summary, 1, v);
  write_record(event(step, nullptr, &summary));
}

void EventWriter::flush() {
  if (file_) std::fflush(file_);
}

}  // namespace dtrain::apps
