#include "work.h"

#include <utility>

namespace dtrain::python {

namespace {
// The tensors of works that failed: a transport whose calls cannot be
// interrupted (Gloo's) may still write them until its own timeout, so they
// stay alive for the rest of the (failing) process.
void retire(std::function<void()> keep) {
  static std::mutex mu;
  static auto* graveyard = new std::vector<std::function<void()>>();
  std::lock_guard<std::mutex> g(mu);
  graveyard->push_back(std::move(keep));
}
}  // namespace

DtrainWork::DtrainWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                       std::vector<std::shared_ptr<dtrain::Work>> works, std::function<void()> copy_out)
    : c10d::Work(rank, type), outputs_(std::move(outputs)), works_(std::move(works)), copy_out_(std::move(copy_out)) {
  std::vector<c10::Device> devices;
  for (const auto& t : outputs_)
    if (t.is_cuda()) devices.push_back(t.device());
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
}

DtrainWork::~DtrainWork() = default;

void DtrainWork::complete() {
  std::exception_ptr err;
  for (const auto& w : works_) {
    try {
      w->wait();
    } catch (...) {
      if (!err) err = std::current_exception();
    }
  }
  std::lock_guard<std::mutex> g(complete_mu_);
  if (done_) return;
  done_ = true;
  if (!err && copy_out_) {
    try {
      copy_out_();
    } catch (...) {
      err = std::current_exception();
    }
  }
  if (err && copy_out_) retire(std::move(copy_out_));
  copy_out_ = nullptr;
  finish(err);
  if (err)
    future_->setError(err);
  else
    future_->markCompleted(c10::IValue(outputs_));
}

bool DtrainWork::wait(std::chrono::milliseconds timeout) {
  if (timeout != kNoTimeout) {
    for (const auto& w : works_) {
      try {
        w->wait(timeout);
      } catch (...) {
        // complete() records the error
      }
    }
  }
  complete();
  std::lock_guard<std::mutex> g(mutex_);
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

void DtrainWork::abort() {
  for (const auto& w : works_) w->abort();
}

std::vector<at::Tensor> DtrainWork::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> DtrainWork::getFuture() { return future_; }

ProgressQueue::ProgressQueue() : thread_([this] { loop(); }) {}

ProgressQueue::~ProgressQueue() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressQueue::push(c10::intrusive_ptr<DtrainWork> work) {
  {
    std::lock_guard<std::mutex> g(mu_);
    queue_.push_back(std::move(work));
  }
  cv_.notify_one();
}

bool ProgressQueue::empty() {
  std::lock_guard<std::mutex> g(mu_);
  return queue_.empty();
}

void ProgressQueue::drain() {
  std::unique_lock<std::mutex> g(mu_);
  cv_.wait(g, [&] { return queue_.empty(); });
}

void ProgressQueue::loop() {
  for (;;) {
    c10::intrusive_ptr<DtrainWork> work;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      work = queue_.front();
    }
    try {
      work->complete();
    } catch (const std::exception& e) {
      // A future's callback threw: it is the callback's error, not the op's.
      TORCH_WARN("dtrain: a callback of a completed op raised: ", e.what());
    }
    std::lock_guard<std::mutex> g(mu_);
    queue_.pop_front();
    if (queue_.empty()) cv_.notify_all();
  }
}

}  // namespace dtrain::python
