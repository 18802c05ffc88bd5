#include "common/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "dtrain/error.h"
#include "tensorboard.pb.h"

namespace dtrain::apps {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string serialize(const tensorboard::Event& e) {
  std::string out;
  if (!e.SerializeToString(&out)) throw IoError("cannot serialize a TensorBoard event");
  return out;
}

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

bool event_files_supported(std::string*) { return true; }

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
  tensorboard::Event e;
  e.set_wall_time(now_seconds());
  e.set_file_version("brain.Event:2");
  write_record(serialize(e));
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
  tensorboard::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(value);
  write_record(serialize(e));
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
    tensorboard::Event e;
    auto where = [&] { return "TensorBoard event file '" + path + "': record " + std::to_string(i) + ": "; };
    if (!e.ParseFromString(records[i])) throw IoError(where() + "not an Event protobuf");
    if (i == 0) {
      if (e.what_case() != tensorboard::Event::kFileVersion || e.file_version().rfind("brain.Event:", 0) != 0)
        throw IoError(where() + "the first record is not a file version ('brain.Event:N')");
      continue;
    }
    if (e.what_case() != tensorboard::Event::kSummary) continue;
    for (const auto& v : e.summary().value())
      if (v.value_case() == tensorboard::Summary::Value::kSimpleValue)
        out.push_back({e.step(), v.tag(), v.simple_value(), e.wall_time()});
  }
  return out;
}

}  // namespace dtrain::apps
