// EventWriter's files read back through the generated protobuf classes, with
// both CRCs of every record checked.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/tensorboard.h"
#include "dtrain/error.h"
#include "tensorboard.pb.h"

namespace fs = std::filesystem;
using namespace dtrain::apps;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("dtrain_tb_test." + std::to_string(getpid()) + "." + name);
  fs::remove_all(d);
  return d;
}

}  // namespace

TEST(Crc32c, KnownVectors) {
  // RFC 3720 (iSCSI) check value and the all-zero 32-byte vector.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
}

TEST(EventWriter, ScalarsReadBackThroughGeneratedClasses) {
  fs::path dir = fresh_dir("scalars");
  std::string path;
  {
    EventWriter w(dir.string());
    path = w.path();
    w.add_scalar("train/loss", 2.5f, 1);
    w.add_scalar("train/lr", 0.1f, 1);
    w.add_scalar("eval/top1", 91.25f, 400);
    w.add_scalar("train/loss", -0.0f, 1ll << 40);
    w.flush();
  }
  EXPECT_EQ(fs::path(path).parent_path(), dir);
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);

  auto records = read_records(path);
  ASSERT_EQ(records.size(), 5u);
  dtrain::tensorboard::Event first;
  ASSERT_TRUE(first.ParseFromString(records[0]));
  EXPECT_EQ(first.file_version(), "brain.Event:2");
  EXPECT_GT(first.wall_time(), 1.6e9);
  dtrain::tensorboard::Event third;
  ASSERT_TRUE(third.ParseFromString(records[3]));
  ASSERT_EQ(third.what_case(), dtrain::tensorboard::Event::kSummary);
  ASSERT_EQ(third.summary().value_size(), 1);
  EXPECT_EQ(third.step(), 400);
  EXPECT_EQ(third.summary().value(0).tag(), "eval/top1");
  EXPECT_EQ(third.summary().value(0).simple_value(), 91.25f);

  auto s = read_scalars(path);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].tag, "train/loss");
  EXPECT_EQ(s[0].step, 1);
  EXPECT_EQ(s[0].value, 2.5f);
  EXPECT_EQ(s[1].tag, "train/lr");
  EXPECT_EQ(s[1].value, 0.1f);
  EXPECT_EQ(s[3].step, 1ll << 40);
  EXPECT_TRUE(std::signbit(s[3].value));
  fs::remove_all(dir);
}

TEST(EventWriter, WireBytesMatchTensorBoardFieldNumbers) {
  // An Event with step 7 and one simple_value, encoded by hand from
  // TensorBoard's event.proto/summary.proto numbers, must parse the same.
  std::string summary_value =
      std::string("\x0a\x01x", 3) + std::string("\x15\x00\x00\x80\x3f", 5);                   // tag=1, simple_value=2
  std::string summary = "\x0a" + std::string(1, char(summary_value.size())) + summary_value;  // value=1
  std::string event =
      std::string("\x10\x07", 2) + "\x2a" + std::string(1, char(summary.size())) + summary;  // step=2, summary=5
  dtrain::tensorboard::Event e;
  ASSERT_TRUE(e.ParseFromString(event));
  EXPECT_EQ(e.step(), 7);
  ASSERT_EQ(e.summary().value_size(), 1);
  EXPECT_EQ(e.summary().value(0).tag(), "x");
  EXPECT_EQ(e.summary().value(0).simple_value(), 1.0f);
  std::string again;
  ASSERT_TRUE(e.SerializeToString(&again));
  EXPECT_EQ(again, event);
}

TEST(EventWriter, CorruptRecordsAreRefusedWithTheirOffset) {
  fs::path dir = fresh_dir("corrupt");
  std::string path;
  {
    EventWriter w(dir.string());
    path = w.path();
    w.add_scalar("a", 1.0f, 1);
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  uint64_t len0;
  std::memcpy(&len0, bytes.data(), 8);
  const size_t second = 12 + len0 + 4;  // where record 1 starts
  auto write = [&](const std::string& b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << b;
  };
  auto message_of = [&] {
    try {
      read_scalars(path);
    } catch (const dtrain::IoError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string flipped = bytes;
  flipped[second + 12 + 2] ^= 0x40;  // a data byte of record 1
  write(flipped);
  std::string m = message_of();
  EXPECT_NE(m.find("record 1 at byte " + std::to_string(second) + ": data CRC mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find(path), std::string::npos) << m;

  flipped = bytes;
  flipped[second + 1] ^= 0x01;  // the length of record 1
  write(flipped);
  m = message_of();
  EXPECT_NE(m.find("length CRC mismatch"), std::string::npos) << m;

  write(bytes.substr(0, bytes.size() - 3));
  m = message_of();
  EXPECT_NE(m.find("truncated data"), std::string::npos) << m;

  write(bytes);
  EXPECT_EQ(read_scalars(path).size(), 1u);
  fs::remove_all(dir);
}
