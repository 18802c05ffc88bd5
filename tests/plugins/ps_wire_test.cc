// The ps_grpc plugin's raw messages (plugins/ps_grpc/service/wire.h): a RawMessage
// built in place must parse as the protobuf message the client expects,
// memory it sends without a copy must be released exactly once, after gRPC
// has let go of it, and FieldReader must read what protobuf serializes.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "service/wire.h"

namespace dtrain::ps_grpc {
namespace {

grpc::ByteBuffer serialize(const RawMessage& m) {
  grpc::ByteBuffer bb;
  bool own = false;
  EXPECT_TRUE(grpc::SerializationTraits<RawMessage>::Serialize(m, &bb, &own).ok());
  return bb;
}

template <typename Msg>
Msg parse(const grpc::ByteBuffer& bb) {
  grpc::Slice all;
  EXPECT_TRUE(bb.DumpToSingleSlice(&all).ok());
  Msg m;
  EXPECT_TRUE(m.ParseFromArray(all.begin(), static_cast<int>(all.size())));
  return m;
}

TEST(RawMessage, SparseValuesWrittenInPlaceParse) {
  for (size_t n : {size_t{0}, size_t{4}, size_t{100}, size_t{300000}}) {
    RawMessage m;
    char* p = m.make_bytes(SparseValues::kValuesFieldNumber, n);
    ASSERT_EQ(p == nullptr, n == 0);
    if (p) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u);
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(i * 7);
    }
    SparseValues v = parse<SparseValues>(serialize(m));
    ASSERT_EQ(v.values().size(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(v.values()[i], static_cast<char>(i * 7)) << "byte " << i;
  }
}

// A dense chunk as the server sends it: varint fields, then a slice of a
// buffer the server holds, sent without a copy.
TEST(SparsePullRequest, SerializedInPlaceParses) {
  // 0 and 1 keys: a slice small enough for gRPC to inline; a long table name; a large call.
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{40000}}) {
    for (const std::string& table : {std::string("t"), std::string(200, 'x')}) {
      std::vector<uint64_t> keys(n);
      for (size_t i = 0; i < n; ++i) keys[i] = 0x0123456789abcdefull * (i + 1);
      grpc::ByteBuffer bb = sparse_pull_request(7, table, 123456789012ull, n, [&](char* dst) {
        if (n) std::memcpy(dst, keys.data(), n * sizeof(uint64_t));
      });
      const auto m = parse<SparsePull>(bb);
      EXPECT_EQ(m.worker(), 7);
      EXPECT_EQ(m.table(), table);
      EXPECT_EQ(m.total_keys(), 123456789012ull);
      ASSERT_EQ(m.keys().size(), n * sizeof(uint64_t));
      if (n) {
        EXPECT_EQ(std::memcmp(m.keys().data(), keys.data(), m.keys().size()), 0) << n << " keys";
      }
    }
  }
}

TEST(RawMessage, DenseChunkOfASharedBufferParsesAndReleasesOnce) {
  std::vector<float> values(50000);
  std::iota(values.begin(), values.end(), 0.5f);
  int released = 0;
  {
    grpc::Slice all(
        values.data(), values.size() * sizeof(float), [](void* n) { ++*static_cast<int*>(n); }, &released);
    const uint64_t total = 5'000'000'000ull;  // a varint over 32 bits
    for (uint64_t off : {uint64_t{0}, uint64_t{1000}, uint64_t{49000}}) {
      RawMessage m;
      m.add_varint(DenseChunk::kTotalFieldNumber, total);
      m.add_varint(DenseChunk::kOffsetFieldNumber, off);
      m.add_bytes(DenseChunk::kValuesFieldNumber, all.sub(off * sizeof(float), (off + 1000) * sizeof(float)));
      DenseChunk c = parse<DenseChunk>(serialize(m));
      EXPECT_EQ(c.total(), total);
      EXPECT_EQ(c.offset(), off);
      ASSERT_EQ(c.values().size(), 1000 * sizeof(float));
      EXPECT_EQ(std::memcmp(c.values().data(), values.data() + off, 1000 * sizeof(float)), 0) << "offset " << off;
    }
    EXPECT_EQ(released, 0);  // `all` still holds the buffer
  }
  EXPECT_EQ(released, 1);
}

TEST(RawMessage, EmptyDenseChunkParses) {
  RawMessage m;
  m.add_varint(DenseChunk::kTotalFieldNumber, 0);
  m.add_varint(DenseChunk::kOffsetFieldNumber, 0);
  m.add_bytes(DenseChunk::kValuesFieldNumber, grpc::Slice());
  DenseChunk c = parse<DenseChunk>(serialize(m));
  EXPECT_EQ(c.total(), 0u);
  EXPECT_TRUE(c.values().empty());
}

// The client's side of a sparse pull reads the field from gRPC's slices.
TEST(BytesField, ReadsARawReplyAcrossSlices) {
  RawMessage m;
  const size_t n = 200001;
  char* p = m.make_bytes(SparseValues::kValuesFieldNumber, n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(i % 251);
  grpc::ByteBuffer one = serialize(m);
  grpc::Slice all;
  ASSERT_TRUE(one.DumpToSingleSlice(&all).ok());
  // The same bytes in three slices, split inside the header and the payload.
  std::vector<grpc::Slice> parts{all.sub(0, 2), all.sub(2, 70000), all.sub(70000, all.size())};
  grpc::ByteBuffer split(parts.data(), parts.size());
  BytesField f;
  ASSERT_TRUE(f.open(split, SparseValues::kValuesFieldNumber));
  ASSERT_EQ(f.size(), n);
  std::vector<char> out(n);
  f.copy_to(out.data());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], static_cast<char>(i % 251)) << "byte " << i;
  BytesField wrong;
  EXPECT_FALSE(wrong.open(split, 2));
}

// The server's side of a dense push: the fields of a DenseChunk as protobuf
// serializes it, read from slices split anywhere, unknown fields skipped.
TEST(FieldReader, ReadsADenseChunkAcrossSlices) {
  DenseChunk c;
  c.set_worker(3);
  c.set_table("dense_w");
  c.set_total(5'000'000'000ull);
  c.set_offset(77);
  std::vector<float> v(3000);
  std::iota(v.begin(), v.end(), -1.25f);
  c.set_values(v.data(), v.size() * sizeof(float));
  std::string wire = c.SerializeAsString();
  wire += std::string("\x35\x01\x02\x03\x04", 5);  // field 6, fixed32: unknown, skipped
  for (size_t cut : {size_t{1}, size_t{5}, size_t{13}, wire.size() / 2}) {
    std::vector<grpc::Slice> parts{grpc::Slice(wire.data(), cut), grpc::Slice(wire.data() + cut, wire.size() - cut)};
    grpc::ByteBuffer bb(parts.data(), parts.size());
    FieldReader r;
    ASSERT_TRUE(r.open(bb));
    uint32_t f = 0, type = 0;
    uint64_t val = 0;
    std::vector<float> got;
    std::string table;
    uint64_t worker = 99, total = 0, offset = 0;
    while (r.next(&f, &type, &val)) {
      if (f == 1) worker = val;
      if (f == 2) table = r.text(val);
      if (f == 3) total = val;
      if (f == 4) offset = val;
      if (f == 5) {
        got.resize(val / sizeof(float));
        r.copy_to(reinterpret_cast<char*>(got.data()), val);
      }
    }
    EXPECT_EQ(worker, 3u) << "cut " << cut;
    EXPECT_EQ(table, "dense_w");
    EXPECT_EQ(total, 5'000'000'000ull);
    EXPECT_EQ(offset, 77u);
    EXPECT_EQ(got, v);
  }
}

TEST(FieldReader, ATruncatedMessageIsAnError) {
  DenseChunk c;
  c.set_table("t");
  c.set_values(std::string(100, 'x'));
  const std::string wire = c.SerializeAsString().substr(0, 50);
  grpc::Slice one(wire.data(), wire.size());
  grpc::ByteBuffer bb(&one, 1);
  FieldReader r;
  ASSERT_TRUE(r.open(bb));
  uint32_t f = 0, type = 0;
  uint64_t val = 0;
  ASSERT_TRUE(r.next(&f, &type, &val));
  EXPECT_EQ(r.text(val), "t");
  ASSERT_TRUE(r.next(&f, &type, &val));
  EXPECT_EQ(val, 100u);
  std::vector<char> out(100);
  EXPECT_THROW(r.copy_to(out.data(), val), sdk::Error);
}

}  // namespace
}  // namespace dtrain::ps_grpc
