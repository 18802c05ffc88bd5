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

// A SparsePush message as the client writes it: the header in the first,
// then keys, gradients and (if given) show/click.
grpc::ByteBuffer sparse_push(bool first, uint64_t total, bool sc, const std::vector<uint64_t>& keys,
                             const std::vector<float>& grads, const std::vector<float>& show_click = {}) {
  RawMessage m;
  if (first) {
    m.add_varint(SparsePush::kWorkerFieldNumber, 1);
    m.add_bytes(SparsePush::kTableFieldNumber, grpc::Slice(std::string("emb")));
    m.add_varint(SparsePush::kTotalKeysFieldNumber, total);
    if (sc) m.add_varint(SparsePush::kHasShowClickFieldNumber, 1);
  }
  auto bytes = [](const void* p, size_t n) { return grpc::Slice(p, n); };
  if (!keys.empty()) m.add_bytes(SparsePush::kKeysFieldNumber, bytes(keys.data(), keys.size() * 8));
  if (!grads.empty()) m.add_bytes(SparsePush::kGradsFieldNumber, bytes(grads.data(), grads.size() * 4));
  if (!show_click.empty())
    m.add_bytes(SparsePush::kShowClickFieldNumber, bytes(show_click.data(), show_click.size() * 4));
  return serialize(m);
}

// Reads the messages into buffers sized from the header (dim 2); returns
// the error text, empty if none.
struct PushInto {
  std::vector<uint64_t> keys;
  std::vector<float> grads, show_click;
  SparsePushReader::Header header;
  int begins = 0;
  std::string read(const std::vector<grpc::ByteBuffer>& msgs) {
    SparsePushReader r;
    auto begin = [&](const SparsePushReader::Header& h) {
      ++begins;
      header = h;
      keys.assign(h.total, 0);
      grads.assign(h.total * 2, 0.0f);
      show_click.assign(h.total * 2, 0.0f);
      return SparsePushReader::Target{2, keys.data(), grads.data(), show_click.data()};
    };
    try {
      for (const auto& m : msgs) r.read(m, begin);
      r.finish();
    } catch (const sdk::Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST(SparsePushReader, MessagesLandBackToBack) {
  PushInto p;
  ASSERT_EQ(p.read({sparse_push(true, 3, true, {7, 8}, {1, 2, 3, 4}, {1, 0, 2, 1}),
                    sparse_push(false, 3, true, {9}, {5, 6}, {3, 1})}),
            "");
  EXPECT_EQ(p.begins, 1);
  EXPECT_EQ(p.header.worker, 1);
  EXPECT_EQ(p.header.table, "emb");
  EXPECT_TRUE(p.header.show_click);
  EXPECT_EQ(p.keys, (std::vector<uint64_t>{7, 8, 9}));
  EXPECT_EQ(p.grads, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(p.show_click, (std::vector<float>{1, 0, 2, 1, 3, 1}));
  // An empty push (sync mode sends one to every server): the header alone.
  PushInto e;
  EXPECT_EQ(e.read({sparse_push(true, 0, false, {}, {})}), "");
  EXPECT_EQ(e.begins, 1);
}

TEST(SparsePushReader, AMalformedPushNamesTheTableAndWhatIsWrong) {
  auto error_of = [](const std::vector<grpc::ByteBuffer>& msgs) { return PushInto().read(msgs); };
  auto has = [](const std::string& e, const std::string& part) {
    return e.find("table 'emb'") != std::string::npos && e.find(part) != std::string::npos;
  };
  RawMessage odd;
  odd.add_varint(SparsePush::kTotalKeysFieldNumber, 1);
  odd.add_bytes(SparsePush::kTableFieldNumber, grpc::Slice(std::string("emb")));
  odd.add_bytes(SparsePush::kKeysFieldNumber, grpc::Slice(std::string(12, 'k')));
  std::string e = error_of({serialize(odd)});
  EXPECT_TRUE(has(e, "keys are 12 bytes, not a multiple of 8")) << e;
  e = error_of({sparse_push(true, 2, false, {1, 2}, {1, 1, 1, 1}), sparse_push(false, 2, false, {3}, {1, 1})});
  EXPECT_TRUE(has(e, "announced 2 keys and sent more")) << e;
  e = error_of({sparse_push(true, 2, false, {1, 2}, {1, 1, 1})});
  EXPECT_TRUE(has(e, "of 2 keys carries 3 gradient values; dim is 2, so 4 were expected")) << e;
  e = error_of({sparse_push(true, 2, false, {1, 2}, {})});
  EXPECT_TRUE(has(e, "of 2 keys carries 0 gradient values")) << e;
  e = error_of({sparse_push(true, 1, false, {1}, {1, 1}, {1, 0})});
  EXPECT_TRUE(has(e, "carries 2 show/click values, not 0")) << e;
  e = error_of({sparse_push(true, 1, true, {1}, {1, 1})});
  EXPECT_TRUE(has(e, "carries 0 show/click values, not 2")) << e;
  e = error_of({sparse_push(true, 5, false, {1, 2}, {1, 1, 1, 1})});
  EXPECT_TRUE(has(e, "sent 2 of 5 keys")) << e;
}

}  // namespace
}  // namespace dtrain::ps_grpc
