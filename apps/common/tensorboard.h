#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace dtrain::apps {

// Writes TensorBoard event files (events.out.tfevents.<time>.<host>) with
// scalar summaries, in TensorFlow's record format: each record is
// uint64 length, masked crc32c of the length, the Event protobuf bytes,
// masked crc32c of those. The protobufs are encoded here by hand; no
// TensorFlow or protobuf dependency.
class EventWriter {
 public:
  // Creates the folder if needed; throws IoError naming it on failure.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  void add_scalar(const std::string& tag, float value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// CRC-32C (Castagnoli) and TensorFlow's masking of it.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace dtrain::apps
