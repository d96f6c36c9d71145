// A small bounded pool for the CPU kernels: `threads - 1` named workers ("bagua-optim-N") plus the
// calling thread split a job of `chunks` independent chunks; parallelFor returns when every chunk
// ran. Chunks are handed out by an atomic counter, so which thread runs a chunk varies but the
// result does not (the kernels are element-wise; reductions are per fixed block).
//
// Thread model: one parallelFor at a time (the optimizer's step, on the trainer's thread); the
// caller works too. Workers park on a condition variable between jobs and exit on their stop
// token. Lock: mu_ only (job hand-off and completion). The completion wait has a deadline
// (BAGUA_OPTIM_WAIT_TIMEOUT_MS): chunks are pure computation, so running past it means a bug or a
// starved machine, reported as DeadlineExceeded after the stragglers finish.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bagua/base/status.h"

namespace bagua::optim {

class ThreadPool {
 public:
  // threads >= 1 (1: everything runs on the caller).
  explicit ThreadPool(int threads, std::chrono::milliseconds timeout = std::chrono::seconds(120));
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(chunk) for chunk in [0, chunks). fn must not throw.
  template <class Fn>
  Status parallelFor(size_t chunks, Fn&& fn) {
    if (chunks == 0) {
      return Status::ok();
    }
    if (chunks == 1 || workers_.empty()) {
      for (size_t c = 0; c < chunks; ++c) {
        fn(c);
      }
      return Status::ok();
    }
    return run(chunks, &fn, [](void* f, size_t c) { (*static_cast<Fn*>(f))(c); });
  }

 private:
  using Trampoline = void (*)(void*, size_t);
  Status run(size_t chunks, void* fn, Trampoline call);
  void workerLoop(std::stop_token stop, int index);
  void drain();

  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable_any wake_;
  std::condition_variable_any done_;
  // The current job (written under mu_, read by workers after they see a new generation).
  uint64_t generation_ = 0;
  void* fn_ = nullptr;
  Trampoline call_ = nullptr;
  size_t chunks_ = 0;
  std::atomic<size_t> next_{0};
  std::atomic<size_t> finished_{0};
  int active_ = 0;  // workers inside drain(), under mu_
  std::vector<std::jthread> workers_;
};

}  // namespace bagua::optim
