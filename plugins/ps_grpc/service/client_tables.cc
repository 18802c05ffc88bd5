// The client's table operations: declare, dense and sparse pull and push,
// save (parts on every server, then the MANIFEST), load, shrink, the worker
// barrier and finish; each an Op fanned out by client.cc's run_unary and
// run_streams.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "service/client.h"
#include "service/wire.h"

namespace dtrain::ps_grpc {

namespace {

std::string fresh_generation() {
  std::random_device rd;
  uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(r));
  return buf;
}

void check_f32(const char* op, const std::string& table, uint64_t count, uint64_t want, const char* what) {
  if (count != want)
    sdk::fail(DT_ERR_INVALID_USAGE, std::string(op) + " of table '" + table + "': " + what + " has " +
                                        std::to_string(count) + " values, " + std::to_string(want) + " expected");
}

// A request naming this worker and a table, as Save, Load and Shrink take.
template <typename Request>
std::shared_ptr<Request> table_request(int worker, const std::string& table) {
  auto req = std::make_shared<Request>();
  req->set_worker(worker);
  req->set_table(table);
  return req;
}

}  // namespace

std::shared_ptr<sdk::Work> PsClient::declare(const sdk::TableDesc& desc, uint32_t* id, const Opts& o) {
  check_open("ps_table");
  check_desc(desc);
  // A name declared before keeps its id: the same descriptor returns the same
  // declaration; a declaration that failed may be retried with another.
  uint32_t slot = static_cast<uint32_t>(tables_.size());
  for (uint32_t i = 0; i < tables_.size(); ++i) {
    if (tables_[i].desc.name != desc.name) continue;
    DeclareRequest a, b;
    to_proto(tables_[i].desc, a.mutable_desc());
    to_proto(desc, b.mutable_desc());
    dt_status_t before = tables_[i].declared->test();
    bool failed = before != DT_OK && before != DT_IN_PROGRESS;
    if (a.SerializeAsString() == b.SerializeAsString() && !failed) {
      *id = i;
      return tables_[i].declared;
    }
    if (!failed)
      sdk::fail(DT_ERR_INVALID_USAGE, "ps_table: table '" + desc.name + "' was already declared here differently");
    slot = i;
  }
  auto op = new_op("the declaration of table '" + desc.name + "'", num_servers_, o);
  auto req = std::make_shared<DeclareRequest>();
  req->set_worker(rank_);
  to_proto(desc, req->mutable_desc());
  for (int s = 0; s < num_servers_; ++s)
    run(op, s, [req](grpc::ClientContext& ctx, Server& srv) {
      Empty reply;
      return srv.stub().DeclareTable(&ctx, *req, &reply);
    });
  *id = slot;
  if (slot == tables_.size())
    tables_.push_back(ClientTable{desc, op, nullptr});
  else
    tables_[slot] = ClientTable{desc, op, nullptr};
  return submit(op);
}

std::shared_ptr<sdk::Work> PsClient::pull_dense(uint32_t id, float* values, uint64_t count, const Opts& o) {
  ClientTable& t = table(id, DT_PS_TABLE_DENSE, "ps_pull_dense");
  check_f32("ps_pull_dense", t.desc.name, count, t.desc.dim, "values");
  auto op = new_op("a pull of dense table '" + t.desc.name + "'", num_servers_, o, count * sizeof(float));
  op->after = {t.declared, t.last_push};
  const uint64_t dim = t.desc.dim;
  std::vector<PullPart> parts(num_servers_);
  for (int s = 0; s < num_servers_; ++s) {
    const uint64_t begin = sharding_.dense_begin(dim, s), n = sharding_.dense_end(dim, s) - begin;
    PullPart& part = parts[s];
    part.server = s;
    part.request.set_worker(rank_);
    part.request.set_table(t.desc.name);
    auto got = std::make_shared<uint64_t>(0);
    part.on_chunk = [op, values, begin, n, got](const DenseChunk& msg) {
      const uint64_t len = msg.values().size() / sizeof(float);
      if (msg.total() != n || msg.offset() + len > n || msg.values().size() % sizeof(float))
        sdk::fail(DT_ERR_REMOTE, "sent a dense chunk outside its range (total " + std::to_string(msg.total()) +
                                     ", offset " + std::to_string(msg.offset()) + ", expected " + std::to_string(n) +
                                     " values): is it a different dtrain version?");
      if (!op->write_out([&] { std::memcpy(values + begin + msg.offset(), msg.values().data(), len * 4); }))
        return false;
      *got += len;
      return true;
    };
    part.on_end = [op, n, got] {
      if (*got != n && !op->done())
        sdk::fail(DT_ERR_REMOTE, "sent " + std::to_string(*got) + " of " + std::to_string(n) + " values");
    };
  }
  run_pulls(op, std::move(parts));
  return submit(op);
}

std::shared_ptr<sdk::Work> PsClient::push_dense(uint32_t id, const float* grads, uint64_t count, const Opts& o) {
  ClientTable& t = table(id, DT_PS_TABLE_DENSE, "ps_push_dense");
  check_f32("ps_push_dense", t.desc.name, count, t.desc.dim, "grads");
  const uint64_t dim = t.desc.dim, push = ++dense_pushes_;
  const uint64_t per = std::max<uint64_t>(1, chunk_bytes_ / sizeof(float));
  // A server's range goes as several calls at once (parts of about
  // kDensePushPartBytes, each a stream of chunks): one HTTP/2 stream's
  // window and one server thread per part.
  std::vector<uint64_t> parts(num_servers_);
  int total_parts = 0;
  for (int s = 0; s < num_servers_; ++s) {
    uint64_t n = sharding_.dense_end(dim, s) - sharding_.dense_begin(dim, s);
    parts[s] = std::clamp<uint64_t>((n * sizeof(float) + kDensePushPartBytes - 1) / kDensePushPartBytes, 1,
                                    kMaxDensePushParts);
    parts[s] = std::min<uint64_t>(parts[s], std::max<uint64_t>(1, (n + per - 1) / per));
    total_parts += static_cast<int>(parts[s]);
  }
  auto op = new_op("a push to dense table '" + t.desc.name + "'", total_parts, o, count * sizeof(float));
  op->after = {t.declared, t.last_push};
  auto name = std::make_shared<grpc::Slice>(t.desc.name);
  std::vector<StreamPart> streams;
  for (int s = 0; s < num_servers_; ++s) {
    const uint64_t begin = sharding_.dense_begin(dim, s), n = sharding_.dense_end(dim, s) - begin;
    // The values staged in reused memory, each chunk a slice of it (no page
    // faults on fresh memory); each chunk's values are copied in just before
    // it is written, guarded like a write into the caller's memory (the
    // caller may reuse grads once the op is done, aborted ops included).
    grpc::Slice all = lease_slice(staging_->get(n * sizeof(float)), n * sizeof(float));
    char* dst = reinterpret_cast<char*>(const_cast<uint8_t*>(all.begin()));
    const float* src = grads + begin;
    for (uint64_t p = 0; p < parts[s]; ++p) {
      const uint64_t pb = n * p / parts[s], pe = n * (p + 1) / parts[s];
      // A message is built once its values are in (a sub-slice under 24
      // bytes is an inlined copy, not a reference).
      // The headers of a part of several chunks go out before any values; a
      // part of one chunk is one message.
      const uint64_t chunks = (pe - pb + per - 1) / per;
      const bool single = chunks <= 1;
      StreamPart& part = streams.emplace_back();
      part.server = s;
      part.count = single ? 1 : 1 + chunks;
      part.make = [this, op, name, all, dst, src, n, pb, pe, per, push, single](size_t i, RawMessage* m) {
        if (i == 0) {
          m->add_varint(DenseChunk::kWorkerFieldNumber, static_cast<uint64_t>(rank_));
          m->add_bytes(DenseChunk::kTableFieldNumber, *name);
          m->add_varint(DenseChunk::kTotalFieldNumber, n);
          m->add_varint(DenseChunk::kPushFieldNumber, push);
          m->add_varint(DenseChunk::kPartValuesFieldNumber, pe - pb);
          if (!single || pe == pb) {
            m->add_varint(DenseChunk::kOffsetFieldNumber, pb);
            return !op->done();
          }
        }
        const uint64_t off = pb + (single ? i : i - 1) * per, len = std::min(per, pe - off);
        if (!op->write_out([&] { std::memcpy(dst + off * sizeof(float), src + off, len * sizeof(float)); }))
          return false;
        m->add_varint(DenseChunk::kOffsetFieldNumber, off);
        m->add_bytes(DenseChunk::kValuesFieldNumber, all.sub(off * sizeof(float), (off + len) * sizeof(float)));
        return true;
      };
    }
  }
  run_streams(op, kPushDenseMethod, std::move(streams));
  t.last_push = op;
  return submit(op);
}

std::shared_ptr<sdk::Work> PsClient::pull_sparse(uint32_t id, const uint64_t* keys, uint64_t n, float* values,
                                                 uint64_t count, const Opts& o) {
  ClientTable& t = table(id, DT_PS_TABLE_SPARSE, "ps_pull_sparse");
  uint64_t dim = t.desc.dim;
  check_f32("ps_pull_sparse", t.desc.name, count, n * dim, "values");
  if (n && !keys) sdk::fail(DT_ERR_INVALID_USAGE, "ps_pull_sparse: keys is null");
  // A call's request carries its keys and its reply their rows: each
  // message within chunk_bytes. A server's keys split evenly over its calls.
  const uint64_t per = std::max<uint64_t>(1, chunk_bytes_ / std::max<uint64_t>(sizeof(uint64_t), dim * sizeof(float)));
  // Positions of each server's keys in the caller's order (none with one server).
  std::vector<std::shared_ptr<std::vector<uint64_t>>> pos(num_servers_);
  std::vector<uint64_t> per_server(num_servers_, 0);
  if (num_servers_ == 1) {
    per_server[0] = n;
  } else {
    for (auto& p : pos) p = std::make_shared<std::vector<uint64_t>>();
    for (uint64_t i = 0; i < n; ++i) pos[sharding_.server_of(keys[i])]->push_back(i);
    for (int s = 0; s < num_servers_; ++s) per_server[s] = pos[s]->size();
  }
  int parts = 0;
  for (int s = 0; s < num_servers_; ++s) parts += static_cast<int>((per_server[s] + per - 1) / per);
  auto op =
      new_op("a pull of sparse table '" + t.desc.name + "'", parts, o, n * (sizeof(uint64_t) + dim * sizeof(float)));
  op->after = {t.declared, t.last_push};
  std::vector<UnaryPart> calls;
  calls.reserve(static_cast<size_t>(parts));
  for (int s = 0; s < num_servers_; ++s) {
    uint64_t total = per_server[s];
    const uint64_t n_calls = (total + per - 1) / per;
    std::shared_ptr<std::vector<uint64_t>> p = pos[s];
    for (uint64_t c = 0; c < n_calls; ++c) {
      const uint64_t off = total * c / n_calls, len = total * (c + 1) / n_calls - off;
      UnaryPart& part = calls.emplace_back();
      part.server = s;
      // The request serialized once, straight into the slice gRPC sends.
      part.request = sparse_pull_request(rank_, t.desc.name, total, len, [&](char* dst) {
        if (!p) {
          std::memcpy(dst, keys + off, len * sizeof(uint64_t));
          return;
        }
        for (uint64_t i = 0; i < len; ++i)
          std::memcpy(dst + i * sizeof(uint64_t), &keys[(*p)[off + i]], sizeof(uint64_t));
      });
      part.on_reply = [op, p, off, len, dim, values](const grpc::ByteBuffer& reply) {
        // The reply's bytes go from gRPC's slices straight into the caller's values.
        BytesField v;
        if (!v.open(reply, SparseValues::kValuesFieldNumber))
          sdk::fail(DT_ERR_REMOTE, "answered a pull of " + std::to_string(len) +
                                       " keys with a malformed reply: is it a different dtrain version?");
        if (v.size() != len * dim * sizeof(float))
          sdk::fail(DT_ERR_REMOTE, "answered a pull of " + std::to_string(len) + " keys with " +
                                       std::to_string(v.size()) + " bytes, not " +
                                       std::to_string(len * dim * sizeof(float)));
        op->write_out([&] {
          if (!p) {
            v.copy_to(reinterpret_cast<char*>(values + off * dim));
            return;
          }
          v.scatter(dim * sizeof(float), [&](size_t i) { return values + (*p)[off + i] * dim; });
        });
      };
    }
  }
  if (!calls.empty()) run_unary(op, kPullSparseMethod, std::move(calls));
  return submit(op);
}

std::shared_ptr<sdk::Work> PsClient::push_sparse(uint32_t id, const uint64_t* keys, uint64_t n, const float* grads,
                                                 uint64_t count, const float* show_click, const Opts& o) {
  ClientTable& t = table(id, DT_PS_TABLE_SPARSE, "ps_push_sparse");
  uint64_t dim = t.desc.dim;
  check_f32("ps_push_sparse", t.desc.name, count, n * dim, "grads");
  if (n && !keys) sdk::fail(DT_ERR_INVALID_USAGE, "ps_push_sparse: keys is null");
  bool sc = show_click != nullptr;
  uint64_t per = std::max<uint64_t>(1, chunk_bytes_ / (sizeof(uint64_t) + (dim + (sc ? 2 : 0)) * sizeof(float)));
  std::vector<std::vector<uint64_t>> pos(num_servers_);
  if (num_servers_ > 1)
    for (uint64_t i = 0; i < n; ++i) pos[sharding_.server_of(keys[i])].push_back(i);
  // Sync mode counts every push as a step on every server, so each server
  // gets one, empty or not.
  bool every = t.desc.mode == DT_PS_MODE_SYNC;
  auto positions = std::make_shared<std::vector<std::vector<uint64_t>>>(std::move(pos));
  auto name = std::make_shared<grpc::Slice>(t.desc.name);
  const size_t row = dim * sizeof(float), scb = 2 * sizeof(float);
  auto total_of = [&](int s) { return num_servers_ > 1 ? (*positions)[s].size() : n; };
  int parts = 0;
  for (int s = 0; s < num_servers_; ++s) parts += total_of(s) > 0 || every;
  auto op =
      new_op("a push to sparse table '" + t.desc.name + "'", parts, o, n * (sizeof(uint64_t) + dim * sizeof(float)));
  op->after = {t.declared, t.last_push};
  std::vector<StreamPart> streams;
  for (int s = 0; s < num_servers_; ++s) {
    const std::vector<uint64_t>* p = num_servers_ > 1 ? &(*positions)[s] : nullptr;
    const uint64_t total = total_of(s);
    if (total == 0 && !every) continue;
    // This server's keys, gradients and show/click staged in reused memory
    // (keys, then gradients, then show/click), each chunk's copied in just
    // before its message is written and sent as sub-slices of it.
    const size_t bytes = total * (sizeof(uint64_t) + row + (sc ? scb : 0));
    grpc::Slice all = lease_slice(staging_->get(std::max<size_t>(1, bytes)), bytes);
    char* base = reinterpret_cast<char*>(const_cast<uint8_t*>(all.begin()));
    StreamPart& part = streams.emplace_back();
    part.server = s;
    part.count = std::max<uint64_t>(1, (total + per - 1) / per);
    part.make = [this, op, name, all, base, total, per, row, scb, sc, keys, grads, show_click, dim, p, positions](
                    size_t i, RawMessage* m) {
      const uint64_t off = i * per, len = total > off ? std::min(per, total - off) : 0;
      char* kd = base + off * sizeof(uint64_t);
      char* gd = base + total * sizeof(uint64_t) + off * row;
      char* cd = base + total * (sizeof(uint64_t) + row) + off * scb;
      if (i == 0) {
        m->add_varint(SparsePush::kWorkerFieldNumber, static_cast<uint64_t>(rank_));
        m->add_bytes(SparsePush::kTableFieldNumber, *name);
        m->add_varint(SparsePush::kTotalKeysFieldNumber, total);
        if (sc) m->add_varint(SparsePush::kHasShowClickFieldNumber, 1);
      }
      if (len == 0) return !op->done();
      // Guarded as a write into the caller's memory: once the op is done
      // (aborted included) the caller may reuse keys and grads.
      const bool copied = op->write_out([&] {
        if (!p) {
          std::memcpy(kd, keys + off, len * sizeof(uint64_t));
          std::memcpy(gd, grads + off * dim, len * row);
          if (sc) std::memcpy(cd, show_click + 2 * off, len * scb);
          return;
        }
        for (uint64_t j = 0; j < len; ++j) {
          const uint64_t at = (*p)[off + j];
          std::memcpy(kd + j * sizeof(uint64_t), keys + at, sizeof(uint64_t));
          std::memcpy(gd + j * row, grads + at * dim, row);
          if (sc) std::memcpy(cd + j * scb, show_click + 2 * at, scb);
        }
      });
      if (!copied) return false;
      const size_t kb = static_cast<size_t>(kd - base), gb = static_cast<size_t>(gd - base),
                   cb = static_cast<size_t>(cd - base);
      m->add_bytes(SparsePush::kKeysFieldNumber, all.sub(kb, kb + len * sizeof(uint64_t)));
      m->add_bytes(SparsePush::kGradsFieldNumber, all.sub(gb, gb + len * row));
      if (sc) m->add_bytes(SparsePush::kShowClickFieldNumber, all.sub(cb, cb + len * scb));
      return true;
    };
  }
  run_streams(op, kPushSparseMethod, std::move(streams));
  t.last_push = op;
  return submit(op);
}

std::shared_ptr<sdk::Work> PsClient::save(uint32_t id, const std::string& dir, int32_t mode, int32_t format,
                                          const Opts& o) {
  ClientTable& t = table(id, -1, "ps_save");
  if (mode < DT_PS_SAVE_FULL || mode > DT_PS_SAVE_DELTA)
    sdk::fail(DT_ERR_INVALID_USAGE,
              "ps_save of table '" + t.desc.name + "': save mode " + std::to_string(mode) + " is unknown");
  if (format != DT_PS_FORMAT_BINARY && format != DT_PS_FORMAT_TEXT)
    sdk::fail(DT_ERR_INVALID_USAGE,
              "ps_save of table '" + t.desc.name + "': format " + std::to_string(format) + " is unknown");
  if (dir.empty()) sdk::fail(DT_ERR_INVALID_USAGE, "ps_save of table '" + t.desc.name + "': the directory is empty");
  auto op = new_op("a save of table '" + t.desc.name + "' to " + dir, num_servers_, o);
  op->after = {t.declared, t.last_push};
  auto files = std::make_shared<std::vector<std::vector<std::string>>>(num_servers_);
  auto req = table_request<SaveRequest>(rank_, t.desc.name);
  req->set_dir(dir);
  req->set_mode(mode);
  req->set_format(format);
  req->set_generation(fresh_generation());
  Manifest m;
  m.table = t.desc.name;
  m.kind = t.desc.kind;
  m.dim = t.desc.dim;
  m.optimizer = t.desc.optimizer;
  m.mode = mode;
  m.format = format;
  m.num_servers = num_servers_;
  m.generation = req->generation();
  op->on_success = [m, files, dir]() mutable {
    for (auto& f : *files) m.files.insert(m.files.end(), f.begin(), f.end());
    m.write(dir + "/" + m.table);
  };
  for (int s = 0; s < num_servers_; ++s)
    run(op, s, [req, files, s](grpc::ClientContext& ctx, Server& srv) {
      SaveReply reply;
      grpc::Status st = srv.stub().Save(&ctx, *req, &reply);
      (*files)[s].assign(reply.files().begin(), reply.files().end());
      return st;
    });
  return submit(op);
}

template <typename Rpc>
std::shared_ptr<sdk::Work> PsClient::every_server(ClientTable& t, const std::string& what,
                                                  std::shared_ptr<const TableRequest> req, const Opts& o, Rpc rpc) {
  auto op = new_op(what, num_servers_, o);
  op->after = {t.declared, t.last_push};
  for (int s = 0; s < num_servers_; ++s)
    run(op, s, [req, rpc](grpc::ClientContext& ctx, Server& srv) { return rpc(ctx, srv, *req); });
  t.last_push = op;
  return submit(op);
}

std::shared_ptr<sdk::Work> PsClient::load(uint32_t id, const std::string& dir, const Opts& o) {
  ClientTable& t = table(id, -1, "ps_load");
  auto req = table_request<TableRequest>(rank_, t.desc.name);
  req->set_dir(dir);
  return every_server(t, "a load of table '" + t.desc.name + "' from " + dir, req, o,
                      [](grpc::ClientContext& ctx, Server& srv, const TableRequest& r) {
                        Empty reply;
                        return srv.stub().Load(&ctx, r, &reply);
                      });
}

std::shared_ptr<sdk::Work> PsClient::shrink(uint32_t id, uint32_t flags, const Opts& o) {
  ClientTable& t = table(id, DT_PS_TABLE_SPARSE, "ps_shrink");
  auto req = table_request<TableRequest>(rank_, t.desc.name);
  req->set_flags(flags);
  return every_server(t, "a shrink of table '" + t.desc.name + "'", req, o,
                      [](grpc::ClientContext& ctx, Server& srv, const TableRequest& r) {
                        ShrinkReply reply;
                        return srv.stub().Shrink(&ctx, r, &reply);
                      });
}

std::shared_ptr<sdk::Work> PsClient::barrier(const Opts& o) {
  check_open("ps_barrier");
  auto op = new_op("barrier " + std::to_string(barriers_), 1, o);
  BarrierRequest req;
  req.set_worker(rank_);
  req.set_generation(barriers_++);
  run(op, 0, [req](grpc::ClientContext& ctx, Server& srv) {
    Empty reply;
    return srv.stub().Barrier(&ctx, req, &reply);
  });
  return submit(op);
}

std::shared_ptr<sdk::Work> PsClient::finish(const Opts& o) {
  check_open("ps_finish");
  auto op = new_op("finish", num_servers_, o);
  for (auto& t : tables_) op->after.push_back(t.last_push);
  FinishRequest req;
  req.set_worker(rank_);
  for (int s = 0; s < num_servers_; ++s)
    run(op, s, [req](grpc::ClientContext& ctx, Server& srv) {
      Empty reply;
      return srv.stub().Finish(&ctx, req, &reply);
    });
  return submit(op);
}

}  // namespace dtrain::ps_grpc
