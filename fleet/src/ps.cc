#include "dtrain/fleet/ps.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "dtrain/error.h"
#include "dtrain/sdk/random.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/store.h"
#include "dtrain/work.h"
#include "fleet_state.h"

namespace dtrain::fleet {

namespace {

ps::PsJob& ps_job(const char* what) {
  auto& s = detail::state(what);
  if (!s.ps)
    throw InvalidUsage(std::string("dtrain::fleet::") + what +
                       " needs a parameter-server job, but this one is collective: call init(false) (Paddle's "
                       "fleet.init(is_collective=False)) in a job with servers");
  return *s.ps;
}

ps::PsWorker& worker(const char* what) {
  auto& j = ps_job(what);
  if (!j.worker)
    throw InvalidUsage(std::string("dtrain::fleet::") + what + " is a worker call, but this process is server " +
                       std::to_string(j.role.server_index));
  return *j.worker;
}

std::vector<uint64_t> to_keys(const ::torch::Tensor& ids) {
  if (ids.is_floating_point() || ids.is_complex())
    throw InvalidUsage("dtrain::fleet::SparseEmbedding: ids must be an integer tensor, got " +
                       std::string(::torch::toString(ids.scalar_type())));
  auto c = ids.to(::torch::kLong).contiguous().cpu();
  std::vector<uint64_t> keys(static_cast<size_t>(c.numel()));
  if (!keys.empty()) std::memcpy(keys.data(), c.data_ptr<int64_t>(), keys.size() * sizeof(uint64_t));
  return keys;
}

// The distinct keys of a list in order of first appearance: list[i] == keys[at[i]].
struct Distinct {
  std::vector<uint64_t> keys;
  std::vector<uint32_t> at;
};

Distinct distinct(const std::vector<uint64_t>& keys) {
  Distinct d;
  d.at.resize(keys.size());
  size_t cap = 16;
  while (cap < 2 * keys.size()) cap *= 2;
  std::vector<uint32_t> slot(cap, 0);  // position in d.keys + 1
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t j = static_cast<size_t>(sdk::mix64(keys[i])) & (cap - 1);; j = (j + 1) & (cap - 1)) {
      if (slot[j] == 0) {
        d.keys.push_back(keys[i]);
        slot[j] = static_cast<uint32_t>(d.keys.size());
      } else if (d.keys[slot[j] - 1] != keys[i]) {
        continue;
      }
      d.at[i] = slot[j] - 1;
      break;
    }
  }
  return d;
}

// Rows of the distinct keys [U, dim] -> rows of every key [at.size(), dim].
::torch::Tensor expand_rows(const ::torch::Tensor& distinct_rows, const std::vector<uint32_t>& at) {
  const int64_t dim = distinct_rows.size(1);
  if (distinct_rows.size(0) == static_cast<int64_t>(at.size())) return distinct_rows;
  auto rows = ::torch::empty({static_cast<int64_t>(at.size()), dim}, ::torch::kFloat);
  const float* from = distinct_rows.data_ptr<float>();
  float* to = rows.data_ptr<float>();
  const size_t row = static_cast<size_t>(dim);
  for (size_t i = 0; i < at.size(); ++i) std::memcpy(to + i * row, from + at[i] * row, row * sizeof(float));
  return rows;
}

// One push's keys, gradient rows and show/click (empty: show 1, click 0 per key).
struct PushedRows {
  std::vector<uint64_t> keys;
  std::vector<float> grads, show_click;
};

// Repeated keys merged as the servers would merge them (rows summed in order
// of appearance, shows and clicks summed), so each key travels once.
void merge_repeats(PushedRows& p, int64_t dim) {
  Distinct d = distinct(p.keys);
  if (d.keys.size() == p.keys.size()) return;
  const size_t row = static_cast<size_t>(dim), u = d.keys.size();
  std::vector<float> grads(u * row), show_click(2 * u);
  std::vector<bool> seen(u, false);
  for (size_t i = 0; i < p.keys.size(); ++i) {
    const size_t k = d.at[i];
    const float* g = p.grads.data() + i * row;
    float* to = grads.data() + k * row;
    const float sh = p.show_click.empty() ? 1.0f : p.show_click[2 * i];
    const float cl = p.show_click.empty() ? 0.0f : p.show_click[2 * i + 1];
    if (!seen[k]) {
      seen[k] = true;
      std::memcpy(to, g, row * sizeof(float));
      show_click[2 * k] = sh;
      show_click[2 * k + 1] = cl;
      continue;
    }
    for (size_t j = 0; j < row; ++j) to[j] += g[j];
    show_click[2 * k] += sh;
    show_click[2 * k + 1] += cl;
  }
  p.keys = std::move(d.keys);
  p.grads = std::move(grads);
  p.show_click = std::move(show_click);
}

Buffer float_buffer(const ::torch::Tensor& t) {
  return Buffer::of(t.data_ptr<float>(), static_cast<size_t>(t.numel()));
}

std::string table_name(const std::string& prefix, const std::string& param) {
  std::string out = prefix + "." + param;
  for (char& ch : out)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '.' && ch != '-') ch = '_';
  return out;
}

void wait_all(std::vector<std::shared_ptr<Work>>& works) {
  for (auto& w : works) w->wait();
  works.clear();
}

// The pushes and pulls a module may leave in flight: async with a_sync_configs.send_queue_size > 0.
size_t overlap_queue(const ps::PsWorker& w) {
  const auto& m = w.mode();
  return m.mode == ps::Mode::Async ? static_cast<size_t>(m.send_queue_size) : 0;
}

std::shared_ptr<detail::InFlight> register_in_flight(const char* what) {
  auto f = std::make_shared<detail::InFlight>();
  detail::state(what).in_flight.push_back(f);
  return f;
}

}  // namespace

namespace detail {

InFlight::~InFlight() {
  for (auto& op : ops_) {
    try {
      op.first->wait();
    } catch (const std::exception&) {
    }
  }
}

void InFlight::add(std::shared_ptr<Work> work, std::shared_ptr<void> keep) {
  ops_.emplace_back(std::move(work), std::move(keep));
}

void InFlight::wait_until(size_t n) {
  while (ops_.size() > n) {
    auto op = std::move(ops_.front());
    ops_.pop_front();
    op.first->wait();
  }
}

void flush_in_flight(FleetState& s) {
  auto& v = s.in_flight;
  v.erase(std::remove_if(v.begin(), v.end(), [](const std::weak_ptr<InFlight>& w) { return w.expired(); }), v.end());
  for (auto& w : v)
    if (auto f = w.lock()) f->wait_until(0);
}

}  // namespace detail

void init_standalone(std::shared_ptr<const Config> config, int send_queue_size) {
  if (!config) throw InvalidUsage("dtrain::fleet::init_standalone: no config");
  auto s = std::make_unique<detail::FleetState>();
  s->config = config;
  s->strategy = StrategyOptions::from_config(*config);
  std::vector<std::string> dirs;
  if (config->has("plugins.path")) dirs = config->get_string_list("plugins.path");
  auto backend = PluginRegistry(dirs).load(config->get_string("ps.backend"));
  CommOptions co;
  co.store = std::make_shared<MemoryStore>();
  co.num_servers = 1;
  co.num_workers = 1;
  co.name = "standalone";
  co.role = Role::Server;
  s->local_server = ps::start_server(backend, co);
  co.role = Role::Worker;
  auto job = std::make_unique<ps::PsJob>();
  job->backend = backend;
  job->store = co.store;
  job->worker = ps::connect_worker(backend, co, ps::ModeOptions{ps::Mode::Async, 0, send_queue_size});
  s->job.role = job->role;
  s->job.store = job->store;
  s->ps = std::move(job);
  detail::install(std::move(s));
}

bool is_server() {
  auto& s = detail::state("is_server");
  return s.ps && s.ps->server;
}
bool is_worker() { return !is_server(); }
int server_index() { return ps_job("server_index").role.server_index; }
int server_num() {
  auto& j = ps_job("server_num");
  return j.worker ? j.worker->num_servers() : static_cast<int>(j.role.server_endpoints.size());
}

void init_server() {
  auto& j = ps_job("init_server");
  if (!j.server) throw InvalidUsage("dtrain::fleet::init_server called on worker " + std::to_string(j.role.rank));
}

void run_server() {
  auto& j = ps_job("run_server");
  if (!j.server) throw InvalidUsage("dtrain::fleet::run_server called on worker " + std::to_string(j.role.rank));
  j.server->serve();
}

void init_worker() { worker("init_worker"); }
void stop_worker() {
  auto& w = worker("stop_worker");
  detail::flush_in_flight(detail::state("stop_worker"));
  w.finish();
}

void save_persistables(const std::string& dir, ps::SaveMode mode, ps::SaveFormat format) {
  auto& s = detail::state("save_persistables");
  worker("save_persistables");
  detail::flush_in_flight(s);
  std::vector<std::shared_ptr<Work>> works;
  for (auto& t : s.sparse_tables) works.push_back(t.save(dir, mode, format));
  for (auto& t : s.dense_tables) works.push_back(t.save(dir, mode, format));
  wait_all(works);
}

void load_persistables(const std::string& dir) {
  auto& s = detail::state("load_persistables");
  worker("load_persistables");
  std::vector<std::shared_ptr<Work>> works;
  for (auto& t : s.sparse_tables) works.push_back(t.load(dir));
  for (auto& t : s.dense_tables) works.push_back(t.load(dir));
  wait_all(works);
}

ps::PsWorker& ps_worker() { return worker("ps_worker"); }
std::shared_ptr<Store> ps_store() { return ps_job("ps_store").store; }
const ps::ModeOptions& ps_mode() { return worker("ps_mode").mode(); }

ps::TableConfig sparse_table_config(const std::string& name) {
  auto& s = detail::state("sparse_table_config");
  ps_job("sparse_table_config");
  return ps::TableConfig::from_config(*s.config, name);
}

SparseEmbeddingImpl::SparseEmbeddingImpl(const ps::TableConfig& config) {
  auto& w = worker("SparseEmbedding");
  table_ = w.sparse_table(config);
  detail::state("SparseEmbedding").sparse_tables.push_back(table_);
  dim_ = static_cast<int64_t>(config.dim);
  if (w.mode().mode == ps::Mode::Geo)
    geo_ = std::make_unique<ps::GeoSparseTable>(table_, w.num_workers(), w.mode().geo_k_steps);
  queue_ = overlap_queue(w);
  pushes_ = register_in_flight("SparseEmbedding");
}

SparseEmbeddingImpl::~SparseEmbeddingImpl() {
  try {
    drop_prefetch();
  } catch (const std::exception&) {
  }
}

void SparseEmbeddingImpl::drop_prefetch() {
  if (!prefetch_) return;
  auto p = std::move(prefetch_);
  p->work->wait();
}

void SparseEmbeddingImpl::prefetch(const ::torch::Tensor& ids) {
  if (queue_ == 0) return;
  drop_prefetch();
  auto p = std::make_unique<Prefetch>();
  p->keys = to_keys(ids);
  Distinct d = distinct(p->keys);
  p->distinct = std::move(d.keys);
  p->at = std::move(d.at);
  p->rows = ::torch::empty({static_cast<int64_t>(p->distinct.size()), dim_}, ::torch::kFloat);
  p->work = table_.pull(p->distinct.data(), p->distinct.size(), float_buffer(p->rows));
  prefetch_ = std::move(p);
}

::torch::Tensor SparseEmbeddingImpl::forward(const ::torch::Tensor& ids, const ::torch::Tensor& show_click) {
  auto keys = to_keys(ids);
  const auto n = static_cast<int64_t>(keys.size());
  // Each distinct key is pulled once; Criteo-like batches repeat most keys
  // (a batch of 512 x 26 slots has ~3,600 distinct).
  ::torch::Tensor rows;
  if (prefetch_ && prefetch_->keys == keys) {
    auto p = std::move(prefetch_);
    p->work->wait();
    rows = expand_rows(p->rows, p->at);
  } else {
    drop_prefetch();
    Distinct d = distinct(keys);
    auto got = ::torch::empty({static_cast<int64_t>(d.keys.size()), dim_}, ::torch::kFloat);
    if (geo_)
      geo_->lookup(d.keys.data(), d.keys.size(), got.data_ptr<float>());
    else
      table_.pull(d.keys.data(), d.keys.size(), float_buffer(got))->wait();
    rows = expand_rows(got, d.at);
  }
  auto shape = ids.sizes().vec();
  shape.push_back(dim_);
  if (!::torch::GradMode::is_enabled()) return rows.view(shape);
  rows.requires_grad_(true);
  ::torch::Tensor sc;
  if (show_click.defined()) {
    sc = show_click.to(::torch::kFloat).contiguous().cpu();
    if (sc.numel() != 2 * n)
      throw InvalidUsage("dtrain::fleet::SparseEmbedding '" + table_.name() + "': show_click has " +
                         std::to_string(sc.numel()) + " values for " + std::to_string(n) + " ids (needs 2 per id)");
  }
  lookups_.push_back({std::move(keys), rows, sc});
  return rows.view(shape);
}

void SparseEmbeddingImpl::push_gradients() {
  auto pushed = std::make_shared<PushedRows>();
  auto& keys = pushed->keys;
  auto& grads = pushed->grads;
  auto& show_click = pushed->show_click;
  bool any_show_click = false;
  for (auto& l : lookups_) any_show_click |= l.show_click.defined();
  for (auto& l : lookups_) {
    const size_t n = l.keys.size();
    keys.insert(keys.end(), l.keys.begin(), l.keys.end());
    const size_t at = grads.size();
    grads.resize(at + n * dim_, 0.0f);
    if (l.rows.grad().defined()) {
      auto g = l.rows.grad().contiguous();
      std::memcpy(grads.data() + at, g.data_ptr<float>(), n * dim_ * sizeof(float));
    }
    if (any_show_click) {
      if (l.show_click.defined()) {
        const float* p = l.show_click.data_ptr<float>();
        show_click.insert(show_click.end(), p, p + 2 * n);
      } else {
        for (size_t i = 0; i < n; ++i) show_click.insert(show_click.end(), {1.0f, 0.0f});
      }
    }
  }
  lookups_.clear();
  merge_repeats(*pushed, dim_);
  if (geo_) {
    geo_->apply(keys.data(), keys.size(), grads.data());
    geo_->step();
    return;
  }
  // One push per step even when empty: in sync mode a worker's n-th push is its step n.
  if (queue_ > 0) pushes_->wait_until(queue_ - 1);
  auto work = table_.push(keys.data(), keys.size(), Buffer::of(grads.data(), grads.size()),
                          show_click.empty() ? nullptr : show_click.data());
  if (queue_ == 0)
    work->wait();
  else
    pushes_->add(std::move(work), std::move(pushed));
}

void SparseEmbeddingImpl::flush() { pushes_->wait_until(0); }

void SparseEmbeddingImpl::clear() { lookups_.clear(); }

DenseParameters::DenseParameters(std::shared_ptr<::torch::nn::Module> model, const ps::TableConfig& config,
                                 const std::string& prefix)
    : model_(std::move(model)), lr_(config.learning_rate) {
  auto& w = worker("DenseParameters");
  for (auto& item : model_->named_parameters()) {
    auto& t = item.value();
    if (t.scalar_type() != ::torch::kFloat || !t.device().is_cpu() || !t.is_contiguous())
      throw InvalidUsage("dtrain::fleet::DenseParameters: parameter '" + item.key() +
                         "' must be a contiguous float32 CPU tensor");
    ps::TableConfig c = config;
    c.kind = ps::TableKind::Dense;
    c.name = table_name(prefix, item.key());
    c.dim = static_cast<uint64_t>(t.numel());
    if (t.dim() >= 2) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(t.numel() / t.size(0)));
      c.initializer = ps::Initializer::Uniform;
      c.init_a = -bound;
      c.init_b = bound;
    } else {
      // A constant local init (BatchNorm's 1 and 0) is kept; a random one
      // (a Linear's bias) differs between workers and starts at 0.
      c.initializer = ps::Initializer::Constant;
      const std::string& key = item.key();
      const bool bias = key.size() >= 4 && key.compare(key.size() - 4, 4, "bias") == 0;
      const bool constant = !bias && t.numel() > 0 && (t == t.flatten()[0]).all().item<bool>();
      c.init_a = constant ? t.flatten()[0].item<double>() : 0.0;
      c.init_b = 0.0;
    }
    Param p{t, w.dense_table(c), nullptr};
    detail::state("DenseParameters").dense_tables.push_back(p.table);
    if (w.mode().mode == ps::Mode::Geo)
      p.geo = std::make_unique<ps::GeoDenseTable>(p.table, w.num_workers(), w.mode().geo_k_steps);
    count_ += c.dim;
    params_.push_back(std::move(p));
  }
  overlap_ = overlap_queue(w) > 0;
  ops_ = register_in_flight("DenseParameters");
  pull();
}

void DenseParameters::pull() {
  ::torch::NoGradGuard no_grad;
  ops_->wait_until(0);
  staged_pending_ = false;
  std::vector<std::shared_ptr<Work>> works;
  for (auto& p : params_) {
    if (p.geo) {
      std::memcpy(p.tensor.data_ptr<float>(), p.geo->values(), p.tensor.numel() * sizeof(float));
      continue;
    }
    works.push_back(p.table.pull(float_buffer(p.tensor)));
  }
  wait_all(works);
}

void DenseParameters::load(const std::string& dir) {
  std::vector<std::shared_ptr<Work>> works;
  for (auto& p : params_) works.push_back(p.table.load(dir));
  wait_all(works);
  pull();
}

void DenseParameters::flush() {
  ops_->wait_until(0);
  copy_in_staged();
}

void DenseParameters::copy_in_staged() {
  if (!staged_pending_) return;
  ::torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].tensor.copy_(staged_[i]);
  staged_pending_ = false;
}

void DenseParameters::step() {
  ::torch::NoGradGuard no_grad;
  std::vector<::torch::Tensor> grads;
  for (auto& p : params_) {
    auto g = p.tensor.grad();
    // Overlapped, the push reads the gradients after zero_grad() cleared them: it gets its own copy.
    grads.push_back(g.defined() ? (overlap_ ? g.contiguous().clone() : g.contiguous()) : ::torch::zeros_like(p.tensor));
  }
  if (overlap_) {
    flush();
    if (staged_.empty())
      for (auto& p : params_) staged_.push_back(::torch::empty_like(p.tensor));
    auto keep = std::make_shared<std::vector<::torch::Tensor>>(grads);
    keep->insert(keep->end(), staged_.begin(), staged_.end());
    for (size_t i = 0; i < params_.size(); ++i) {
      ops_->add(params_[i].table.push(float_buffer(grads[i])), keep);
      ops_->add(params_[i].table.pull(float_buffer(staged_[i])), keep);
    }
    staged_pending_ = true;
    return;
  }
  std::vector<std::shared_ptr<Work>> works;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    if (p.geo) {
      float* v = p.geo->values();
      const float* g = grads[i].data_ptr<float>();
      const float lr = static_cast<float>(lr_);
      for (int64_t k = 0; k < p.tensor.numel(); ++k) v[k] -= lr * g[k];
      p.geo->step();
      continue;
    }
    works.push_back(p.table.push(float_buffer(grads[i])));
  }
  wait_all(works);
  pull();
}

PsOptimizer::PsOptimizer(std::vector<SparseEmbedding> embeddings, std::shared_ptr<::torch::nn::Module> model,
                         std::shared_ptr<DenseParameters> dense)
    : embeddings_(std::move(embeddings)), model_(std::move(model)), dense_(std::move(dense)) {}

void PsOptimizer::step() {
  for (auto& e : embeddings_) e->push_gradients();
  if (dense_) dense_->step();
  ++steps_;
}

void PsOptimizer::flush() {
  for (auto& e : embeddings_) e->flush();
  if (dense_) dense_->flush();
}

void PsOptimizer::zero_grad() {
  if (model_) model_->zero_grad();
}

std::shared_ptr<PsOptimizer> ps_optimizer(std::vector<SparseEmbedding> embeddings,
                                          std::shared_ptr<::torch::nn::Module> model, const std::string& dense_table) {
  auto& s = detail::state("ps_optimizer");
  worker("ps_optimizer");
  ps::TableConfig c;
  const std::string key = "ps.tables." + dense_table;
  if (s.config->has(key)) {
    // The template's dim is each parameter's size: it need not be given.
    Config cfg = *s.config;
    if (!cfg.has(key + ".dim")) cfg.set_literal(key + ".dim", "1");
    c = ps::TableConfig::from_config(cfg, dense_table);
  }
  c.kind = ps::TableKind::Dense;
  std::shared_ptr<DenseParameters> dense;
  if (model) dense = std::make_shared<DenseParameters>(model, c, dense_table);
  return std::make_shared<PsOptimizer>(std::move(embeddings), std::move(model), std::move(dense));
}

}  // namespace dtrain::fleet
