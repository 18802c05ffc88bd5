#include "service/service.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "service/wire.h"

namespace dtrain::ps_grpc {

namespace {

constexpr std::chrono::milliseconds kWaitSlice{200};
// ASYNC and GEO dense pushes are applied in blocks of this many values, each
// copied from gRPC's slices into a small buffer that stays in L1/L2.
constexpr uint64_t kApplyBlock = 8192;

std::string list_of(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// A bytes field as T[] in place when aligned (heap strings are), else copied.
template <typename T>
const T* view(const std::string& s, std::vector<T>* scratch) {
  if (reinterpret_cast<uintptr_t>(s.data()) % alignof(T) == 0) return reinterpret_cast<const T*>(s.data());
  scratch->resize(s.size() / sizeof(T));
  std::memcpy(scratch->data(), s.data(), scratch->size() * sizeof(T));
  return scratch->data();
}

}  // namespace

PsService::PsService(const sdk::CommInit& init, const PsOptions& options)
    : server_(init.rank),
      num_servers_(init.num_servers),
      num_workers_(init.num_workers),
      default_timeout_ms_(init.timeout_ms > 0 ? init.timeout_ms : 300000),
      token_(init.job_token),
      options_(options),
      serve_(std::make_shared<LongWork>()) {
  sharding_.num_servers = num_servers_;
  sharding_.num_shards = options.shard_num;
  MarkMethodStreamed(kPullSparseIndex,
                     new grpc::internal::StreamedUnaryHandler<SparsePull, RawMessage>(
                         [this](grpc::ServerContext* ctx, auto* stream) { return PullSparseRaw(ctx, stream); }));
  MarkMethodStreamed(kPushDenseIndex, new grpc::internal::BidiStreamingHandler<PsService, RawRequest, Empty>(
                                          [](PsService* self, grpc::ServerContext* ctx, auto* stream) {
                                            return self->PushDenseRaw(ctx, stream);
                                          },
                                          this));
  MarkMethodStreamed(kPushSparseIndex, new grpc::internal::BidiStreamingHandler<PsService, RawRequest, Empty>(
                                           [](PsService* self, grpc::ServerContext* ctx, auto* stream) {
                                             return self->PushSparseRaw(ctx, stream);
                                           },
                                           this));
  MarkMethodStreamed(kPullDenseIndex,
                     new grpc::internal::SplitServerStreamingHandler<DensePull, RawMessage>(
                         [this](grpc::ServerContext* ctx, auto* stream) { return PullDenseRaw(ctx, stream); }));
}

std::string PsService::who() const {
  return "parameter server " + std::to_string(server_) + (endpoint_.empty() ? "" : " (" + endpoint_ + ")");
}

void PsService::stop(dt_status_t status, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  serve_->complete(status, status == DT_OK ? "" : reason);
}

template <typename F>
grpc::Status PsService::guarded(grpc::ServerContext* ctx, F&& f) {
  if (!token_.empty()) {
    auto& md = ctx->client_metadata();
    auto it = md.find(kTokenKey);
    if (it == md.end() || it->second != grpc::string_ref(token_)) {
      const char* why = it == md.end() ? "missing job token" : "wrong job token";
      sdk::Log::warn("ps_grpc: " + who() + " refused a client from " + ctx->peer() + ": " + why);
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          std::string(why) + " (this client is not part of the job)");
    }
  }
  auto failed = [&](dt_status_t st, const std::string& msg) {
    ctx->AddTrailingMetadata(kStatusKey, std::to_string(st));
    return grpc::Status(grpc_code(st), msg);
  };
  try {
    f();
    return grpc::Status::OK;
  } catch (const sdk::Error& e) {
    return failed(e.status(), e.what());
  } catch (const std::bad_alloc&) {
    return failed(DT_ERR_SYSTEM, "out of memory");
  } catch (const std::exception& e) {
    return failed(DT_ERR_INTERNAL, e.what());
  }
}

int PsService::worker(int32_t w) const {
  if (w < 0 || w >= num_workers_)
    sdk::fail(DT_ERR_INVALID_USAGE,
              "worker rank " + std::to_string(w) + " is not in [0, " + std::to_string(num_workers_) + ")");
  return w;
}

Table& PsService::table(const std::string& name, int kind) {
  std::shared_lock<std::shared_mutex> lk(tables_mu_);
  auto it = tables_.find(name);
  if (it == tables_.end())
    sdk::fail(DT_ERR_INVALID_USAGE, "table '" + name + "' is unknown on " + who() + " (declare it first)");
  if (kind >= 0 && it->second->desc().kind != kind)
    sdk::fail(DT_ERR_INVALID_USAGE,
              "table '" + name + "' is " + kind_name(it->second->desc().kind) + ", not " + kind_name(kind));
  return *it->second;
}

Clock::time_point PsService::deadline(grpc::ServerContext* ctx) const {
  auto left = ctx->deadline() - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24 * 365)) left = std::chrono::milliseconds(default_timeout_ms_);  // no deadline sent
  auto margin = std::clamp<std::chrono::system_clock::duration>(left / 10, std::chrono::milliseconds(10),
                                                                std::chrono::milliseconds(500));
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left - margin);
}

template <typename F>
void PsService::interruptible(grpc::ServerContext* ctx, F&& f) {
  const Clock::time_point until = deadline(ctx);
  for (;;) {
    Clock::time_point slice = std::min(until, Clock::now() + kWaitSlice);
    try {
      f(slice);
      return;
    } catch (const sdk::Error& e) {
      if (e.status() != DT_ERR_TIMEOUT || slice >= until) throw;
    }
    if (ctx->IsCancelled()) sdk::fail(DT_ERR_ABORTED, "the worker cancelled the call");
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) sdk::fail(DT_ERR_ABORTED, who() + " is stopping");
  }
}

void PsService::check_size(const Table& t, uint64_t bytes, const std::string& what) const {
  if (bytes > options_.max_request_bytes)
    sdk::fail(DT_ERR_INVALID_USAGE, "table '" + t.desc().name + "': " + what + " of " + std::to_string(bytes) +
                                        " bytes (" + mib(bytes) + ") to " + who() +
                                        " is over max_request_bytes = " + std::to_string(options_.max_request_bytes));
}

grpc::Status PsService::Hello(grpc::ServerContext* ctx, const HelloRequest* req, HelloReply* reply) {
  return guarded(ctx, [&] {
    auto mismatch = [&](const char* what, int64_t here, int64_t there) {
      sdk::fail(DT_ERR_INVALID_USAGE, std::string(what) + " is " + std::to_string(here) + " on " + who() + " and " +
                                          std::to_string(there) + " on worker " + std::to_string(req->worker()));
    };
    if (req->num_servers() != num_servers_) mismatch("num_servers", num_servers_, req->num_servers());
    if (req->num_workers() != num_workers_) mismatch("num_workers", num_workers_, req->num_workers());
    if (req->server() != server_) mismatch("the server index", server_, req->server());
    if (req->shard_num() != options_.shard_num) mismatch("ps_grpc.shard_num", options_.shard_num, req->shard_num());
    worker(req->worker());
    reply->set_server(server_);
    reply->set_chunk_bytes(options_.chunk_bytes);
    reply->set_max_request_bytes(options_.max_request_bytes);
  });
}

grpc::Status PsService::DeclareTable(grpc::ServerContext* ctx, const DeclareRequest* req, Empty*) {
  return guarded(ctx, [&] {
    worker(req->worker());
    sdk::TableDesc d = from_proto(req->desc());
    check_desc(d);
    std::unique_lock<std::shared_mutex> lk(tables_mu_);
    auto it = tables_.find(d.name);
    if (it != tables_.end()) {
      std::string diff = it->second->differs(d);
      if (!diff.empty())
        sdk::fail(DT_ERR_INVALID_USAGE, "table '" + d.name + "' was declared differently by worker " +
                                            std::to_string(req->worker()) + ": " + diff);
      return;
    }
    tables_.emplace(d.name, Table::create(d, sharding_, server_, num_workers_));
  });
}

grpc::Status PsService::PullDenseRaw(grpc::ServerContext* ctx,
                                     grpc::ServerSplitStreamer<DensePull, RawMessage>* stream) {
  DensePull msg;
  const DensePull* req = &msg;
  if (!stream->Read(&msg)) return grpc::Status(grpc::StatusCode::INTERNAL, "a dense pull without its request");
  return guarded(ctx, [&] {
    int wk = worker(req->worker());
    Table& t = table(req->table(), DT_PS_TABLE_DENSE);
    uint64_t dim = t.desc().dim;
    uint64_t n = sharding_.dense_end(dim, server_) - sharding_.dense_begin(dim, server_);
    check_size(t, n * sizeof(float), "a dense pull");
    uint64_t per = std::max<uint64_t>(1, options_.chunk_bytes / sizeof(float));
    // The range in one staging buffer, each chunk a slice of it: the buffer
    // goes back to the pool when gRPC lets go of the last chunk.
    auto* lease = new Staging::Lease(staging_->get(n * sizeof(float)));
    float* buf = lease->as<float>();
    grpc::Slice all(
        buf, n * sizeof(float), [](void* l) { delete static_cast<Staging::Lease*>(l); }, lease);
    interruptible(ctx, [&](Clock::time_point until) { t.pull_dense(wk, buf, n, until); });
    uint64_t off = 0;
    do {  // one chunk even for an empty range: it carries the total
      uint64_t len = std::min(per, n - off);
      RawMessage chunk;
      chunk.add_varint(DenseChunk::kTotalFieldNumber, n);
      chunk.add_varint(DenseChunk::kOffsetFieldNumber, off);
      chunk.add_bytes(DenseChunk::kValuesFieldNumber, all.sub(off * sizeof(float), (off + len) * sizeof(float)));
      if (!stream->Write(chunk))
        sdk::fail(DT_ERR_REMOTE, "worker " + std::to_string(wk) + " went away during a dense pull");
      off += len;
    } while (off < n);
  });
}

void PsService::DensePush::claim(uint64_t offset, uint64_t len, const std::string& table) {
  std::lock_guard<std::mutex> lk(mu);
  if (failed) sdk::fail(DT_ERR_ABORTED, "table '" + table + "': another part of this dense push failed");
  for (auto [b, e] : spans)
    if (offset < e && b < offset + len)
      sdk::fail(DT_ERR_INVALID_USAGE, "table '" + table + "': a dense push chunk [" + std::to_string(offset) + ", " +
                                          std::to_string(offset + len) + ") overlaps values [" + std::to_string(b) +
                                          ", " + std::to_string(e) + ") sent before in the same push");
  spans.emplace_back(offset, offset + len);
}

void PsService::DensePush::arrived(uint64_t len) {
  std::lock_guard<std::mutex> lk(mu);
  got += len;
}

void PsService::DensePush::fail() {
  std::lock_guard<std::mutex> lk(mu);
  failed = true;
}

bool PsService::DensePush::complete(uint64_t n, const std::string& table) {
  std::lock_guard<std::mutex> lk(mu);
  if (failed) sdk::fail(DT_ERR_ABORTED, "table '" + table + "': another part of this dense push failed");
  if (applied || got != n) return false;
  applied = true;
  return true;
}

std::shared_ptr<PsService::DensePush> PsService::join_push(Table& t, int worker, uint64_t id, uint64_t n) {
  std::lock_guard<std::mutex> lk(pushes_mu_);
  auto& slot = pushes_[{&t, worker}];
  // Another id: that push failed part-way (its worker went on); drop it.
  if (slot && slot->id == id) return slot;
  if (t.desc().mode == DT_PS_MODE_SYNC)
    slot = std::make_shared<DensePush>(id, staging_->get(n * sizeof(float)), 0);
  else
    slot = std::make_shared<DensePush>(id, std::nullopt, t.begin_dense_push(worker));
  return slot;
}

void PsService::drop_push(const Table& t, int worker, const std::shared_ptr<DensePush>& p) {
  std::lock_guard<std::mutex> lk(pushes_mu_);
  auto it = pushes_.find({&t, worker});
  if (it != pushes_.end() && it->second == p) pushes_.erase(it);
}

grpc::Status PsService::PushDenseRaw(grpc::ServerContext* ctx, grpc::ServerReaderWriter<Empty, RawRequest>* stream) {
  grpc::Status st = guarded(ctx, [&] {
    RawRequest raw;
    if (!stream->Read(&raw)) sdk::fail(DT_ERR_INVALID_USAGE, "an empty dense push");
    // The first chunk names the worker, the table, the total and the push.
    // SYNC: every chunk's values are copied from gRPC's slices straight into
    // the push's staging buffer, which the push's other parts (calls running
    // beside this one) fill too, and the part that completes it applies the
    // push. ASYNC and GEO: each chunk is copied, a block at a time, into a
    // small buffer that stays in cache and applied at once, so the rule's
    // pass over the values overlaps the transfer. Every value must come
    // exactly once.
    int32_t worker_field = 0;
    std::string table_name;
    uint64_t total = 0, n = 0, push_id = 0, part_values = 0, sent = 0;
    int wk = -1;
    Table* t = nullptr;
    std::shared_ptr<DensePush> p;
    float* buf = nullptr;              // SYNC: the staged values
    std::unique_ptr<float[]> scratch;  // ASYNC, GEO
    auto start = [&] {
      wk = worker(worker_field);
      t = &table(table_name, DT_PS_TABLE_DENSE);
      uint64_t dim = t->desc().dim;
      n = sharding_.dense_end(dim, server_) - sharding_.dense_begin(dim, server_);
      if (total != n)
        sdk::fail(DT_ERR_INVALID_USAGE, "table '" + t->desc().name + "': a dense push of " + std::to_string(total) +
                                            " values to " + who() + ", which holds " + std::to_string(n) + " (dim " +
                                            std::to_string(dim) + " over " + std::to_string(num_servers_) +
                                            " servers)");
      check_size(*t, n * sizeof(float), "a dense push");
      p = join_push(*t, wk, push_id, n);
      if (p->lease) buf = p->lease->as<float>();
    };
    try {
      do {
        FieldReader r;
        if (!r.open(raw.bb)) sdk::fail(DT_ERR_INVALID_USAGE, "an unreadable dense push chunk");
        uint64_t offset = 0, v = 0;
        uint32_t f = 0, type = 0;
        while (r.next(&f, &type, &v)) {
          if (!t && type == 0 && f == DenseChunk::kWorkerFieldNumber) {
            worker_field = static_cast<int32_t>(v);
          } else if (!t && type == 2 && f == DenseChunk::kTableFieldNumber) {
            table_name = r.text(v);
          } else if (!t && type == 0 && f == DenseChunk::kTotalFieldNumber) {
            total = v;
          } else if (!t && type == 0 && f == DenseChunk::kPushFieldNumber) {
            push_id = v;
          } else if (!t && type == 0 && f == DenseChunk::kPartValuesFieldNumber) {
            part_values = v;
          } else if (type == 0 && f == DenseChunk::kOffsetFieldNumber) {
            offset = v;
          } else if (type == 2 && f == DenseChunk::kValuesFieldNumber) {
            if (!t) start();
            const uint64_t len = v / sizeof(float);
            if (v % sizeof(float) != 0 || offset > n || len > n - offset)
              sdk::fail(DT_ERR_INVALID_USAGE, "table '" + t->desc().name + "': a dense push chunk [" +
                                                  std::to_string(offset) + ", +" + std::to_string(v) +
                                                  " bytes) is outside the server's " + std::to_string(n) + " values");
            p->claim(offset, len, t->desc().name);
            if (buf) {
              r.copy_to(reinterpret_cast<char*>(buf + offset), v);
            } else {
              if (!scratch) scratch.reset(new float[kApplyBlock]);
              for (uint64_t at = 0; at < len; at += kApplyBlock) {
                const uint64_t k = std::min<uint64_t>(kApplyBlock, len - at);
                r.copy_to(reinterpret_cast<char*>(scratch.get()), k * sizeof(float));
                t->push_dense_range(p->step, offset + at, scratch.get(), k);
              }
            }
            p->arrived(len);
            sent += len;
          } else if (type == 2) {
            r.skip(v);
          }
        }
        if (!t) start();
      } while (stream->Read(&raw));
      if (sent != part_values)
        sdk::fail(DT_ERR_INVALID_USAGE, "table '" + t->desc().name + "': a dense push part announced " +
                                            std::to_string(part_values) + " values and sent " + std::to_string(sent));
    } catch (...) {
      if (p) {
        p->fail();
        drop_push(*t, wk, p);
      }
      throw;
    }
    if (!p->complete(n, t->desc().name)) return;  // another part completes it
    drop_push(*t, wk, p);
    if (buf)
      t->push_dense(wk, buf, n);
    else
      t->end_dense_push();
  });
  // The reply goes out with the status (one write, not two round trips).
  if (st.ok()) stream->WriteLast(Empty(), grpc::WriteOptions());
  return st;
}

grpc::Status PsService::PullSparseRaw(grpc::ServerContext* ctx,
                                      grpc::ServerUnaryStreamer<SparsePull, RawMessage>* stream) {
  SparsePull msg;
  const SparsePull* req = &msg;
  if (!stream->Read(&msg)) return grpc::Status(grpc::StatusCode::INTERNAL, "a sparse pull without its request");
  RawMessage reply;
  grpc::Status st = guarded(ctx, [&] {
    int wk = worker(req->worker());
    Table& t = table(req->table(), DT_PS_TABLE_SPARSE);
    uint64_t dim = t.desc().dim;
    check_size(t, req->total_keys() * (sizeof(uint64_t) + dim * sizeof(float)),
               "a sparse pull of " + std::to_string(req->total_keys()) + " keys");
    if (req->keys().size() % sizeof(uint64_t) != 0)
      sdk::fail(DT_ERR_INVALID_USAGE, "table '" + t.desc().name + "': a sparse pull's keys are " +
                                          std::to_string(req->keys().size()) + " bytes, not a multiple of 8");
    uint64_t n = req->keys().size() / sizeof(uint64_t);
    std::vector<uint64_t> scratch;
    const uint64_t* keys = view<uint64_t>(req->keys(), &scratch);
    // The reply in a reused staging buffer (no page faults on a fresh one).
    auto* lease = new Staging::Lease(staging_->get(16 + n * dim * sizeof(float)));
    float* out = reinterpret_cast<float*>(reply.make_bytes(
        SparseValues::kValuesFieldNumber, n * dim * sizeof(float), lease->as<char>(),
        [](void* l) { delete static_cast<Staging::Lease*>(l); }, lease));
    interruptible(ctx, [&](Clock::time_point until) { t.pull_sparse(wk, keys, n, out, until); });
  });
  if (st.ok()) stream->Write(reply);
  return st;
}

grpc::Status PsService::PushSparseRaw(grpc::ServerContext* ctx, grpc::ServerReaderWriter<Empty, RawRequest>* stream) {
  grpc::Status st = guarded(ctx, [&] {
    RawRequest raw;
    if (!stream->Read(&raw)) sdk::fail(DT_ERR_INVALID_USAGE, "an empty sparse push");
    // Keys, gradients and show/click of every message into one staging
    // buffer (each back to back), applied as one push at the end.
    SparsePushReader reader;
    int wk = -1;
    Table* t = nullptr;
    std::optional<Staging::Lease> lease;
    SparsePushReader::Target to;
    const std::function<SparsePushReader::Target(const SparsePushReader::Header&)> begin =
        [&](const SparsePushReader::Header& h) {
          wk = worker(h.worker);
          t = &table(h.table, DT_PS_TABLE_SPARSE);
          to.dim = t->desc().dim;
          const uint64_t row_bytes = sizeof(uint64_t) + to.dim * sizeof(float) + (h.show_click ? 2 * sizeof(float) : 0);
          check_size(*t, h.total * row_bytes, "a sparse push of " + std::to_string(h.total) + " keys");
          lease.emplace(staging_->get(std::max<uint64_t>(1, h.total * row_bytes)));
          to.keys = lease->as<uint64_t>();
          to.grads = reinterpret_cast<float*>(to.keys + h.total);
          to.show_click = to.grads + h.total * to.dim;
          return to;
        };
    do {
      reader.read(raw.bb, begin);
    } while (stream->Read(&raw));
    reader.finish();
    const auto& h = reader.header();
    t->push_sparse(wk, to.keys, h.total, to.grads, h.show_click ? to.show_click : nullptr);
  });
  if (st.ok()) stream->WriteLast(Empty(), grpc::WriteOptions());
  return st;
}

grpc::Status PsService::Save(grpc::ServerContext* ctx, const SaveRequest* req, SaveReply* reply) {
  return guarded(ctx, [&] {
    worker(req->worker());
    Table& t = table(req->table(), -1);
    std::string dir = req->dir() + "/" + t.desc().name;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) sdk::fail(DT_ERR_SYSTEM, "cannot create the directory " + dir + ": " + ec.message());
    for (auto& f : t.save(dir, req->generation(), req->mode(), req->format())) reply->add_files(f);
  });
}

grpc::Status PsService::Load(grpc::ServerContext* ctx, const TableRequest* req, Empty*) {
  return guarded(ctx, [&] {
    worker(req->worker());
    Table& t = table(req->table(), -1);
    t.load(req->dir() + "/" + t.desc().name);
  });
}

grpc::Status PsService::Shrink(grpc::ServerContext* ctx, const TableRequest* req, ShrinkReply* reply) {
  return guarded(ctx, [&] {
    worker(req->worker());
    reply->set_deleted(table(req->table(), DT_PS_TABLE_SPARSE).shrink(req->flags()));
  });
}

grpc::Status PsService::Barrier(grpc::ServerContext* ctx, const BarrierRequest* req, Empty*) {
  return guarded(ctx, [&] {
    int wk = worker(req->worker());
    if (server_ != 0) sdk::fail(DT_ERR_INVALID_USAGE, "barriers are counted on server 0, not on " + who());
    uint64_t gen = req->generation();
    auto until = deadline(ctx);
    std::unique_lock<std::mutex> lk(mu_);
    if (gen < barriers_done_) return;
    auto& arrived = barrier_arrived_[gen];
    arrived.insert(wk);
    if (static_cast<int>(arrived.size()) == num_workers_) {
      barriers_done_ = std::max(barriers_done_, gen + 1);
      barrier_arrived_.erase(gen);
      cv_.notify_all();
      return;
    }
    while (barriers_done_ <= gen && !stopping_ && !ctx->IsCancelled() && Clock::now() < until)
      cv_.wait_until(lk, std::min(until, Clock::now() + kWaitSlice));
    if (barriers_done_ > gen) return;
    if (stopping_) sdk::fail(DT_ERR_ABORTED, who() + " is stopping");
    if (ctx->IsCancelled()) sdk::fail(DT_ERR_ABORTED, "the worker cancelled the call");
    std::vector<int> missing;
    const auto& now = barrier_arrived_[gen];
    for (int i = 0; i < num_workers_; ++i)
      if (!now.count(i)) missing.push_back(i);
    sdk::fail(DT_ERR_TIMEOUT, "barrier " + std::to_string(gen) + ": worker" + (missing.size() > 1 ? "s " : " ") +
                                  list_of(missing) + " of " + std::to_string(num_workers_) +
                                  " did not arrive before the deadline");
  });
}

grpc::Status PsService::Finish(grpc::ServerContext* ctx, const FinishRequest* req, Empty*) {
  return guarded(ctx, [&] {
    int wk = worker(req->worker());
    bool all;
    {
      std::lock_guard<std::mutex> lk(mu_);
      finished_.insert(wk);
      all = static_cast<int>(finished_.size()) == num_workers_;
    }
    if (all) {
      sdk::Log::info("ps_grpc: " + who() + ": all " + std::to_string(num_workers_) + " workers finished");
      serve_->complete(DT_OK);
    }
  });
}

}  // namespace dtrain::ps_grpc
