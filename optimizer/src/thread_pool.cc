#include "bagua/optimizer/thread_pool.h"

#include <string>

#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "bagua/optimizer/params.h"

namespace bagua::optim {

ThreadPool::ThreadPool(int threads, std::chrono::milliseconds timeout) : timeout_(timeout) {
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this, i](std::stop_token stop) { workerLoop(stop, i); });
  }
}

ThreadPool::~ThreadPool() {
  for (auto& w : workers_) {
    w.request_stop();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_.notify_all();
  }
  workers_.clear();  // joins
}

void ThreadPool::drain() {
  for (;;) {
    const size_t c = next_.fetch_add(1, std::memory_order_relaxed);
    if (c >= chunks_) {
      return;
    }
    call_(fn_, c);
    if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks_) {
      std::lock_guard<std::mutex> lock(mu_);
      done_.notify_all();
    }
  }
}

void ThreadPool::workerLoop(std::stop_token stop, int index) {
  setThreadName("bagua-optim-" + std::to_string(index));
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Parks until a new job or stop; the stop token bounds this wait.
      if (!wake_.wait(lock, stop, [&] { return generation_ != seen; })) {
        return;
      }
      seen = generation_;
      ++active_;
    }
    drain();
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_ == 0) {
      done_.notify_all();
    }
  }
}

Status ThreadPool::run(size_t chunks, void* fn, Trampoline call) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    // A worker that woke late for the previous job may still be leaving drain(): let it go before
    // the counters are reset (it holds no chunk, so this is short).
    if (!done_.wait_for(lock, timeout_, [&] { return active_ == 0; })) {
      return BAGUA_ERROR(kDeadlineExceeded, "optimizer thread pool: workers did not go idle");
    }
    fn_ = fn;
    call_ = call;
    chunks_ = chunks;
    next_.store(0, std::memory_order_relaxed);
    finished_.store(0, std::memory_order_relaxed);
    ++generation_;
  }
  wake_.notify_all();
  drain();
  std::unique_lock<std::mutex> lock(mu_);
  // Done when every chunk ran and no worker is still inside drain() (so the next job's counters
  // cannot be raced by a worker of this one).
  auto idle = [&] { return finished_.load(std::memory_order_acquire) == chunks_ && active_ == 0; };
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  const bool ok = done_.wait_until(lock, deadline, idle);
  if (!ok) {
    // Chunks still reference the caller's data: wait for them before reporting.
    while (!done_.wait_for(lock, std::chrono::seconds(1), idle)) {
      BAGUA_LOG_ERROR(kLogOptim, "optimizer thread pool: %zu of %zu chunks still running",
                      chunks_ - finished_.load(std::memory_order_acquire), chunks_);
    }
    return BAGUA_ERROR(kDeadlineExceeded,
                       "optimizer thread pool: %zu chunks took longer than %lld ms "
                       "(BAGUA_OPTIM_WAIT_TIMEOUT_MS)",
                       chunks, static_cast<long long>(timeout_.count()));
  }
  return Status::ok();
}

}  // namespace bagua::optim
