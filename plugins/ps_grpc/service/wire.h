#pragma once
// What the client and the server share beside ps.proto: the metadata keys,
// the mapping of dtrain statuses onto gRPC codes, table descriptors on the
// wire and their checks.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dtrain/sdk/backend.h"
#include "engine/files.h"
#include "service/staging.h"
#include "plugins/ps_grpc/service/ps.pb.h"

namespace dtrain::ps_grpc {

constexpr char kTokenKey[] = "dtrain-token";    // request metadata: the job token
constexpr char kStatusKey[] = "dtrain-status";  // trailing metadata of a failed call: the DT_ERR_* code
// The full name of ParameterServer.PullSparse, which both sides handle as raw
// bytes (below). Its position in ps.proto's service is kPullSparseIndex.
constexpr char kPullSparseMethod[] = "/dtrain.ps_grpc.ParameterServer/PullSparse";
constexpr int kPullSparseIndex = 4;
// ParameterServer.PullDense's position: the server sends its chunks as raw bytes.
constexpr int kPullDenseIndex = 2;
// ParameterServer.PushDense: the client sends its chunks as raw bytes.
constexpr char kPushDenseMethod[] = "/dtrain.ps_grpc.ParameterServer/PushDense";
constexpr int kPushDenseIndex = 3;
// ParameterServer.PushSparse: the client sends its chunks as raw bytes.
constexpr char kPushSparseMethod[] = "/dtrain.ps_grpc.ParameterServer/PushSparse";
constexpr int kPushSparseIndex = 5;
// A dense push to a server goes as parts of about this many bytes, each its
// own call, all at once, at most kMaxDensePushParts (client.cc).
constexpr uint64_t kDensePushPartBytes = uint64_t{4} << 20;
constexpr uint64_t kMaxDensePushParts = 8;

grpc::StatusCode grpc_code(dt_status_t status);

void to_proto(const sdk::TableDesc& d, TableDesc* out);
sdk::TableDesc from_proto(const TableDesc& p);

// Refuses (DT_ERR_INVALID_USAGE, naming the table and the field) a
// descriptor the engine does not take: bad name, dim 0, a dtype other than
// f32, an unknown kind, mode, rule or initializer, GEO with a rule other than SGD.
void check_desc(const sdk::TableDesc& d);

// A serialized message built in place, for replies whose payload is one
// large `bytes` field: the server writes the payload straight into the slice
// gRPC sends (SparseValues: the table's rows), or points a slice at memory it
// already holds (DenseChunk: a part of the dense range), with no protobuf
// string between (no zero fill, no serialization copy).
// grpc::SerializationTraits below.
struct RawMessage {
  std::vector<grpc::Slice> slices;  // the message's bytes, in order
  // Makes the message hold bytes field `field` (< 16) of n bytes; returns
  // where the n bytes go (uninitialized, 16-byte aligned; null if n is 0).
  char* make_bytes(uint32_t field, size_t n);
  // As make_bytes, in memory the caller provides: mem (16-byte aligned, at
  // least 16 + n bytes) until gRPC calls release(user).
  char* make_bytes(uint32_t field, size_t n, char* mem, void (*release)(void*), void* user);
  // Appends varint field `field` (< 16) with value v.
  void add_varint(uint32_t field, uint64_t v);
  // Appends bytes field `field` (< 16) whose n bytes are `data`, sent
  // without a copy: gRPC holds `data` (it takes a reference).
  void add_bytes(uint32_t field, grpc::Slice data);
};

// The reading side: a received message whose only field is bytes field
// `field` (absent: empty), read from gRPC's slices without a copy into a
// protobuf string.
class BytesField {
 public:
  // false if bb is not such a message.
  bool open(const grpc::ByteBuffer& bb, uint32_t field);
  size_t size() const { return size_; }
  // Copies the field's bytes to dst (size() bytes).
  void copy_to(char* dst) const;
  // Copies the field as rows of `row` bytes, row i to dst(i).
  template <typename F>
  void scatter(size_t row, F&& dst) const {
    size_t i = 0, at = 0;  // row, byte within the row
    for_each_span([&](const char* p, size_t n) {
      while (n > 0) {
        const size_t take = std::min(n, row - at);
        std::memcpy(static_cast<char*>(static_cast<void*>(dst(i))) + at, p, take);
        p += take, n -= take, at += take;
        if (at == row) ++i, at = 0;
      }
    });
  }

 private:
  template <typename F>
  void for_each_span(F&& f) const {
    size_t skip = skip_, left = size_;
    for (const grpc::Slice& s : slices_) {
      if (left == 0) break;
      size_t n = s.size();
      if (skip >= n) {
        skip -= n;
        continue;
      }
      const size_t take = std::min(n - skip, left);
      f(reinterpret_cast<const char*>(s.begin()) + skip, take);
      left -= take;
      skip = 0;
    }
  }
  std::vector<grpc::Slice> slices_;
  size_t skip_ = 0, size_ = 0;  // header bytes, field bytes
};

// A received message kept as gRPC's slices (no parse, no copy): the server's
// side of a dense push reads its fields with FieldReader.
struct RawRequest {
  grpc::ByteBuffer bb;
};

// Reads a protobuf message's fields straight from gRPC's slices: varints and
// length-delimited fields; a bytes field's payload is copied once, to where
// the caller wants it. Fixed-width fields are skipped.
class FieldReader {
 public:
  // false if bb's slices could not be read.
  bool open(const grpc::ByteBuffer& bb);
  // The next field: its number, wire type (0 varint, 2 length-delimited) and
  // its varint value or its length. A length-delimited field's bytes must be
  // taken next (copy_to, text or skip). false at the end; throws sdk::Error
  // (DT_ERR_INVALID_USAGE) on a malformed message.
  bool next(uint32_t* field, uint32_t* type, uint64_t* value);
  void copy_to(char* dst, size_t n);
  std::string text(size_t n);
  void skip(size_t n);

 private:
  uint8_t byte();
  uint64_t varint();
  template <typename F>
  void take(size_t n, F&& f);
  std::vector<grpc::Slice> slices_;
  size_t slice_ = 0, at_ = 0;  // cursor: slice, byte in it
};

// The server's side of a sparse push (a stream of SparsePush messages in
// raw bytes): each message's keys, gradients and show/click are copied from
// gRPC's slices straight to where begin() said, back to back over the
// messages. begin(header) runs once, at the first message's first bytes
// field (or its end): it checks the header (worker, table, size) and returns
// the table's dim and room for total keys, total x dim gradients and, with
// show/click, 2 x total values. A malformed message throws sdk::Error
// (DT_ERR_INVALID_USAGE) naming the table and what is wrong.
class SparsePushReader {
 public:
  struct Header {
    int32_t worker = 0;
    std::string table;
    uint64_t total = 0;
    bool show_click = false;
  };
  struct Target {
    uint64_t dim = 0;
    uint64_t* keys = nullptr;
    float* grads = nullptr;
    float* show_click = nullptr;  // used only when the header has show/click
  };
  void read(const grpc::ByteBuffer& bb, const std::function<Target(const Header&)>& begin);
  // After the last message: throws unless every announced key came.
  void finish() const;
  const Header& header() const { return header_; }

 private:
  [[noreturn]] void bad(const std::string& what) const;
  Header header_;
  Target to_;
  bool started_ = false;
  uint64_t got_ = 0;  // keys of the messages read so far
};

// A SparsePull request (ps.proto) of n keys as one slice, serialized in
// place: the header fields written here, the n keys (8 bytes each,
// little-endian) by write_keys(dst) (dst unaligned).
grpc::ByteBuffer sparse_pull_request(int32_t worker, const std::string& table, uint64_t total_keys, uint64_t n,
                                     const std::function<void(char* dst)>& write_keys);

// A protobuf message as a ByteBuffer (for a call through grpc::GenericStub).
grpc::ByteBuffer to_buffer(const google::protobuf::MessageLite& m);

// A slice over the first `bytes` bytes of a staging lease (empty if bytes is
// 0): the lease goes back to its pool when gRPC lets go of the slice and of
// every sub-slice of it.
grpc::Slice lease_slice(Staging::Lease lease, size_t bytes);

}  // namespace dtrain::ps_grpc

template <>
class grpc::SerializationTraits<dtrain::ps_grpc::RawRequest> {
 public:
  static grpc::Status Serialize(const dtrain::ps_grpc::RawRequest& m, grpc::ByteBuffer* bb, bool* own_buffer) {
    *bb = m.bb;
    *own_buffer = true;
    return grpc::Status::OK;
  }
  static grpc::Status Deserialize(grpc::ByteBuffer* bb, dtrain::ps_grpc::RawRequest* m) {
    m->bb.Swap(bb);
    bb->Clear();
    return grpc::Status::OK;
  }
};

template <>
class grpc::SerializationTraits<dtrain::ps_grpc::RawMessage> {
 public:
  static grpc::Status Serialize(const dtrain::ps_grpc::RawMessage& m, grpc::ByteBuffer* bb, bool* own_buffer) {
    *bb = grpc::ByteBuffer(m.slices.data(), m.slices.size());
    *own_buffer = true;
    return grpc::Status::OK;
  }
  static grpc::Status Deserialize(grpc::ByteBuffer* bb, dtrain::ps_grpc::RawMessage* m) {
    m->slices.resize(1);
    grpc::Status st = bb->DumpToSingleSlice(&m->slices[0]);
    bb->Clear();
    return st;
  }
};
