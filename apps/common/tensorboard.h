#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dtrain::apps {

// Writes TensorBoard event files (events.out.tfevents.<time>.<host>.<pid>)
// with scalar summaries, in TensorFlow's record format: each record is
// uint64 length, masked crc32c of the length, the Event protobuf bytes,
// masked crc32c of those. The Event and Summary messages of
// apps/common/proto/tensorboard.proto (TensorBoard's field numbers) are
// encoded by hand, so the apps need no libprotobuf; tests/apps checks them
// against the classes protoc generates. One writer belongs to one thread; records reach the file at
// flush() or destruction.
class EventWriter {
 public:
  // Creates the folder if needed and writes the file-version record; throws
  // IoError naming the folder or file on failure.
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

// One scalar read back from an event file.
struct ScalarEvent {
  int64_t step = 0;
  std::string tag;
  float value = 0;
  double wall_time = 0;
};

// The payloads of every record of a TFRecord file, in order, after checking
// both masked CRCs of each. Throws IoError naming the file and the byte
// offset of the first truncated or corrupt record.
std::vector<std::string> read_records(const std::string& path);

// Every scalar of an event file written by EventWriter (or TensorBoard's own
// writers), parsed by hand (unknown fields skipped). Throws IoError when a
// record is corrupt, is not an Event, or the first record is not the file
// version.
std::vector<ScalarEvent> read_scalars(const std::string& path);

// CRC-32C (Castagnoli) and TensorFlow's masking of it.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace dtrain::apps
