// The ps_grpc plugin's raw replies (plugins/ps_grpc/wire.h): a RawMessage
// built in place must parse as the protobuf message the client expects, and
// memory it sends without a copy must be released exactly once, after gRPC
// has let go of it.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "wire.h"

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

}  // namespace
}  // namespace dtrain::ps_grpc
