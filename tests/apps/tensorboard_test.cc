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

TEST(EventWriter, BytesAreProtobufsOwnAndItsBytesReadBack) {
  // The hand encoder writes what SerializeToString writes for the same Event;
  // read_scalars reads what protobuf writes, other fields included.
  fs::path dir = fresh_dir("protobuf");
  std::string path;
  {
    EventWriter w(dir.string());
    path = w.path();
    w.add_scalar("eval/top1", 88.5f, 3);
    w.add_scalar("neg", -1.5f, -2);
  }
  auto records = read_records(path);
  ASSERT_EQ(records.size(), 3u);
  for (const auto& r : records) {
    dtrain::tensorboard::Event e;
    ASSERT_TRUE(e.ParseFromString(r));
    std::string again;
    ASSERT_TRUE(e.SerializeToString(&again));
    EXPECT_EQ(again, r);
  }
  dtrain::tensorboard::Event e;
  ASSERT_TRUE(e.ParseFromString(records[2]));
  EXPECT_EQ(e.step(), -2);

  dtrain::tensorboard::Event theirs;
  theirs.set_wall_time(1.7e9);
  theirs.set_step(12345678901ll);
  auto* v = theirs.mutable_summary()->add_value();
  v->set_node_name("node");
  v->set_tag("a/b");
  v->set_simple_value(0.25f);
  theirs.mutable_summary()->add_value()->set_tag("no value");
  std::string bytes;
  ASSERT_TRUE(theirs.SerializeToString(&bytes));
  std::string file = (dir / "theirs").string();
  {
    std::ofstream out(file, std::ios::binary);
    auto record = [&](const std::string& data) {
      uint64_t len = data.size();
      char h[12];
      std::memcpy(h, &len, 8);
      uint32_t c = masked_crc32c(h, 8);
      std::memcpy(h + 8, &c, 4);
      out.write(h, 12);
      out << data;
      c = masked_crc32c(data.data(), data.size());
      out.write(reinterpret_cast<const char*>(&c), 4);
    };
    record(records[0]);
    record(bytes);
  }
  auto s = read_scalars(file);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].tag, "a/b");
  EXPECT_EQ(s[0].step, 12345678901ll);
  EXPECT_EQ(s[0].value, 0.25f);
  EXPECT_EQ(s[0].wall_time, 1.7e9);
  fs::remove_all(dir);
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
