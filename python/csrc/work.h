#pragma once
// The c10d Work of dtrain's backend and the thread that completes it.
//
// A DtrainWork is one c10d op over the core's Works of it; the tensors the
// core reads and writes stay alive in it until the op has completed (and,
// after a failure, for the rest of the process: see work.cc). Thread-safe:
// the progress thread, waiters and abort() may reach it at once.

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "c10d_compat.h"
#include "dtrain/work.h"

namespace dtrain::python {

// One c10d op over the core's Works of it (several for ops built from
// send/recv). complete() waits for all of them, then runs the copy-out and
// finishes the work and its future once, on whichever thread gets there
// first; no lock is held while it waits, so wait(timeout) and abort() reach
// the core's Works at any time.
class DtrainWork : public c10d::Work {
 public:
  DtrainWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
             std::vector<std::shared_ptr<dtrain::Work>> works, std::function<void()> copy_out);
  ~DtrainWork() override;
  // A non-default timeout shortens the op's deadline (the core's watchdog
  // then fails it, naming the ranks it waited for, and poisons the group).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void abort() override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  void complete();

 private:
  const std::vector<at::Tensor> outputs_;
  const std::vector<std::shared_ptr<dtrain::Work>> works_;
  std::mutex complete_mu_;
  bool done_ = false;
  // Holds the tensors the core reads and writes (staging, flat buffers).
  std::function<void()> copy_out_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Completes works in the order they were queued, on its own thread.
class ProgressQueue {
 public:
  ProgressQueue();
  ~ProgressQueue();  // completes what is queued, then joins
  void push(c10::intrusive_ptr<DtrainWork> work);
  bool empty();
  // Blocks until every queued work has completed (and its callbacks ran).
  void drain();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<DtrainWork>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dtrain::python
