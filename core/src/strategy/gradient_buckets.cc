#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <sstream>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/sdk/half.h"
#include "dtrain/strategy.h"
#include "dtrain/work.h"

namespace dtrain {

uint16_t float_to_f16(float f) { return sdk::float_to_half(f); }
float f16_to_float(uint16_t h) { return sdk::half_to_float(h); }
uint16_t float_to_bf16(float f) { return sdk::float_to_bf16(f); }
float bf16_to_float(uint16_t b) { return sdk::bf16_to_float(b); }

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void check_f32_cpu(const Buffer& b, const char* what) {
  if (b.dtype != DType::F32)
    throw InvalidUsage(std::string(what) + ": buffers must be f32, got " + dtype_name(b.dtype));
  if (b.device.type != DeviceType::CPU) throw NotSupported(std::string(what) + ": only CPU buffers are supported");
}

}  // namespace

namespace {

std::vector<size_t> byte_sizes(const std::vector<size_t>& counts) {
  std::vector<size_t> bytes;
  bytes.reserve(counts.size());
  for (size_t c : counts) bytes.push_back(c * sizeof(float));
  return bytes;
}

}  // namespace

GradientBuckets::GradientBuckets(std::shared_ptr<Communicator> comm, std::vector<size_t> counts,
                                 const StrategyOptions& options)
    : comm_(std::move(comm)),
      options_(options),
      counts_(std::move(counts)),
      bucketer_(byte_sizes(counts_), options.gradient_bucket_bytes()) {
  if (!comm_) throw InvalidUsage("GradientBuckets needs a communicator");
  if (options_.a_sync)
    throw InvalidUsage(
        "[strategy] a_sync = true asks for parameter-server training (" +
        std::string(ps::to_string(options_.ps_mode.mode)) +
        " mode), but this job all-reduces gradients (collective training); remove a_sync, or train through "
        "dtrain/ps.h with a [ps] backend and parameter servers (dtrain --server_num N --worker_num M)");
  targets_.assign(counts_.size(), Buffer());
  buckets_.resize(bucketer_.num_buckets());
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    for (size_t i : bucketer_.members(k)) {
      b.offsets.push_back(b.count);
      b.count += counts_[i];
    }
    b.data.assign(b.count, 0.0f);
    if (options_.fp16_allreduce) b.wire.assign(b.count, 0);
  }
}

GradientBuckets::~GradientBuckets() {
  // Buckets own the memory in flight: never free it under a running op.
  for (auto& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {
    }
  }
}

void GradientBuckets::begin() {
  std::lock_guard<std::mutex> lock(mu_);
  if (active_) throw InvalidUsage("GradientBuckets::begin called twice without finish");
  // No zero fill: a tensor whose gradient lives in its slot keeps its values;
  // finish() zeroes the slots of tensors never marked.
  for (auto& b : buckets_) b.work.reset();
  std::fill(targets_.begin(), targets_.end(), Buffer());
  bucketer_.begin();
  active_ = true;
}

void GradientBuckets::mark_ready(size_t index, const Buffer& grad) {
  if (index >= counts_.size())
    throw InvalidUsage("GradientBuckets::mark_ready: index " + std::to_string(index) + " out of range (" +
                       std::to_string(counts_.size()) + " tensors)");
  check_f32_cpu(grad, "GradientBuckets::mark_ready");
  if (grad.count != counts_[index])
    throw InvalidUsage("GradientBuckets::mark_ready: tensor " + std::to_string(index) + " has " +
                       std::to_string(grad.count) + " elements, registered with " + std::to_string(counts_[index]));
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) throw InvalidUsage("GradientBuckets::mark_ready outside begin()/finish()");
  if (bucketer_.ready(index)) return;  // already marked this step (a tensor used twice)
  float* dst = slot(index);
  if (grad.ptr != dst) std::memcpy(dst, grad.ptr, grad.count * sizeof(float));
  targets_[index] = grad;
  bucketer_.mark(index, *this);
}

float* GradientBuckets::slot(size_t index) {
  if (index >= counts_.size())
    throw InvalidUsage("GradientBuckets::slot: index " + std::to_string(index) + " out of range (" +
                       std::to_string(counts_.size()) + " tensors)");
  Bucket& b = buckets_[bucketer_.bucket_of(index)];
  return b.data.data() + b.offsets[bucketer_.position_of(index)];
}

void GradientBuckets::launch(size_t bucket) {
  Bucket& b = buckets_[bucket];
  stats_.allreduces++;
  if (!options_.fp16_allreduce) {
    stats_.bytes_on_wire += static_cast<int64_t>(b.count * sizeof(float));
    b.work = comm_->allreduce(Buffer::of(b.data.data(), b.count), ReduceOp::Avg);
    return;
  }
  const float scale = 1.0f / static_cast<float>(comm_->size());
  if (options_.wire_dtype == DType::BF16)
    for (size_t i = 0; i < b.count; ++i) b.wire[i] = sdk::float_to_bf16(b.data[i] * scale);
  else
    for (size_t i = 0; i < b.count; ++i) b.wire[i] = sdk::float_to_half(b.data[i] * scale);
  stats_.bytes_on_wire += static_cast<int64_t>(b.count * sizeof(uint16_t));
  b.work = comm_->allreduce(Buffer(b.wire.data(), b.count, options_.wire_dtype), ReduceOp::Sum);
}

void GradientBuckets::finish() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!active_) throw InvalidUsage("GradientBuckets::finish without begin()");
  active_ = false;
  // Tensors never marked count as zero gradients and are skipped on write-back.
  for (size_t i = 0; i < counts_.size(); ++i)
    if (!bucketer_.ready(i)) {
      std::fill_n(slot(i), counts_[i], 0.0f);
      bucketer_.mark(i, *this);
    }
  auto t0 = Clock::now();
  for (auto& b : buckets_) b.work->wait();
  stats_.wait_seconds += seconds_since(t0);
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    if (options_.fp16_allreduce) {
      if (options_.wire_dtype == DType::BF16)
        for (size_t i = 0; i < b.count; ++i) b.data[i] = sdk::bf16_to_float(b.wire[i]);
      else
        for (size_t i = 0; i < b.count; ++i) b.data[i] = sdk::half_to_float(b.wire[i]);
    }
    const auto& members = bucketer_.members(k);
    for (size_t s = 0; s < members.size(); ++s) {
      const Buffer& t = targets_[members[s]];
      const float* src = b.data.data() + b.offsets[s];
      if (!t.ptr || t.ptr == src) continue;
      std::memcpy(t.ptr, src, t.count * sizeof(float));
    }
    b.work.reset();
  }
}

void average_buffers(Communicator& comm, const std::vector<Buffer>& buffers, size_t bucket_bytes, SyncStats* stats) {
  for (auto& b : buffers) check_f32_cpu(b, "average_buffers");
  if (comm.size() == 1) return;
  const size_t cap = std::max<size_t>(1, bucket_bytes / sizeof(float));
  std::vector<float> flat;
  size_t i = 0;
  while (i < buffers.size()) {
    size_t j = i, total = 0;
    while (j < buffers.size() && (j == i || total + buffers[j].count <= cap)) total += buffers[j++].count;
    flat.resize(total);
    size_t off = 0;
    for (size_t k = i; k < j; ++k) {
      std::memcpy(flat.data() + off, buffers[k].ptr, buffers[k].count * sizeof(float));
      off += buffers[k].count;
    }
    auto t0 = Clock::now();
    comm.allreduce(Buffer::of(flat.data(), total), ReduceOp::Avg, CallOptions::wait_now());
    if (stats) {
      stats->wait_seconds += seconds_since(t0);
      stats->allreduces++;
      stats->bytes_on_wire += static_cast<int64_t>(total * sizeof(float));
    }
    off = 0;
    for (size_t k = i; k < j; ++k) {
      std::memcpy(buffers[k].ptr, flat.data() + off, buffers[k].count * sizeof(float));
      off += buffers[k].count;
    }
    i = j;
  }
}

void broadcast_buffers(Communicator& comm, const std::vector<Buffer>& buffers, int root, size_t bucket_bytes) {
  if (comm.size() == 1) return;
  const size_t cap = std::max<size_t>(1, bucket_bytes);
  std::vector<uint8_t> flat;
  size_t i = 0;
  while (i < buffers.size()) {
    size_t j = i, total = 0;
    while (j < buffers.size() && (j == i || total + buffers[j].bytes() <= cap)) total += buffers[j++].bytes();
    flat.resize(total);
    size_t off = 0;
    for (size_t k = i; k < j; ++k) {
      if (buffers[k].bytes()) std::memcpy(flat.data() + off, buffers[k].ptr, buffers[k].bytes());
      off += buffers[k].bytes();
    }
    if (total) comm.broadcast(Buffer(flat.data(), total, DType::U8), root)->wait();
    off = 0;
    for (size_t k = i; k < j; ++k) {
      if (buffers[k].bytes()) std::memcpy(buffers[k].ptr, flat.data() + off, buffers[k].bytes());
      off += buffers[k].bytes();
    }
    i = j;
  }
}

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// "name\tdim,dim\n" per tensor.
std::string layout_text(const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes) {
  std::string t;
  for (size_t i = 0; i < names.size(); ++i) {
    t += names[i] + "\t";
    for (size_t d = 0; d < shapes[i].size(); ++d) t += (d ? "," : "") + std::to_string(shapes[i][d]);
    t += "\n";
  }
  return t;
}

std::vector<std::pair<std::string, std::string>> parse_layout(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) {
    size_t tab = line.find('\t');
    std::string dims = tab == std::string::npos ? "" : line.substr(tab + 1), shape = "[";
    for (char ch : dims) shape += ch == ',' ? std::string(", ") : std::string(1, ch);
    out.emplace_back(line.substr(0, tab), shape + "]");
  }
  return out;
}

}  // namespace

void check_same_layout(Communicator& comm, const std::vector<std::string>& names,
                       const std::vector<std::vector<int64_t>>& shapes) {
  if (names.size() != shapes.size()) throw InvalidUsage("check_same_layout: names and shapes differ in length");
  if (comm.size() == 1) return;
  std::string mine = layout_text(names, shapes);
  int64_t len = comm.rank() == 0 ? static_cast<int64_t>(mine.size()) : 0;
  comm.broadcast(Buffer::of(&len, 1), 0)->wait();
  std::string theirs(static_cast<size_t>(len), '\0');
  if (comm.rank() == 0) theirs = mine;
  if (len > 0) comm.broadcast(Buffer(theirs.data(), theirs.size(), DType::U8), 0)->wait();
  auto ref = parse_layout(theirs);
  const int64_t none = std::numeric_limits<int64_t>::max();
  int64_t first = none;
  size_t common = std::min(ref.size(), names.size());
  for (size_t i = 0; i < common && first == none; ++i)
    if (ref[i].first != names[i] || ref[i].second != shape_str(shapes[i])) first = static_cast<int64_t>(i);
  if (first == none && ref.size() != names.size()) first = static_cast<int64_t>(common);
  int64_t global = first;
  comm.allreduce(Buffer::of(&global, 1), ReduceOp::Min, CallOptions::wait_now());
  if (global == none) return;
  size_t g = static_cast<size_t>(global);
  auto here = g < names.size() ? "'" + names[g] + "' " + shape_str(shapes[g])
                               : std::string("(none: only ") + std::to_string(names.size()) + " tensors)";
  auto there = g < ref.size() ? "'" + ref[g].first + "' " + ref[g].second
                              : std::string("(none: only ") + std::to_string(ref.size()) + " tensors)";
  std::ostringstream os;
  os << "model parameters differ between ranks: parameter #" << g << " is " << here << " on rank " << comm.rank()
     << " but " << there << " on rank 0";
  if (first != global) os << " (this rank matches rank 0 up to there; another rank differs)";
  os << "; every rank must build the same model from the same configuration";
  throw InvalidUsage(os.str());
}

}  // namespace dtrain
