#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "bagua/algorithms/algorithms.h"
#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "support.h"

namespace bagua::algo {

namespace {

// The weight lock: a flag under a mutex with deadline waits. (std::timed_mutex would do, but its
// try_lock_until goes through pthread_mutex_clocklock, which ThreadSanitizer does not see, so
// every unlock was reported as an unlock of an unlocked mutex.)
class WeightLock {
 public:
  bool lockUntil(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return !held_; })) {
      return false;
    }
    held_ = true;
    return true;
  }
  void unlock() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_ = false;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
};

// Scoped holder for the averaging thread.
class WeightGuard {
 public:
  WeightGuard(WeightLock& lock, bool held) : lock_(lock), held_(held) {}
  ~WeightGuard() {
    if (held_) {
      lock_.unlock();
    }
  }
  WeightGuard(const WeightGuard&) = delete;
  WeightGuard& operator=(const WeightGuard&) = delete;
  bool held() const { return held_; }

 private:
  WeightLock& lock_;
  bool held_;
};

}  // namespace

class AsyncImpl final : public core::AlgorithmImpl {
 public:
  AsyncImpl(AsyncModelAverage* owner, bool mainStage, core::ProcessGroup& mainGroup,
            std::unique_ptr<core::ProcessGroup> threadGroup)
      : owner_(owner),
        mainStage_(mainStage),
        intervalMs_(owner->syncIntervalMs_),
        mainGroup_(mainGroup),
        threadGroup_(std::move(threadGroup)) {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    owner_->live_ = this;
  }

  ~AsyncImpl() override {
    {
      std::lock_guard<std::mutex> lock(owner_->mu_);
      if (owner_->live_ == this) {
        owner_->live_ = nullptr;
      }
    }
    if (locked_) {
      weightMu_.unlock();
      locked_ = false;
    }
    if (loop_.joinable()) {
      // Shutdown without abort(): leave at the next round boundary; if a peer keeps a round
      // blocked, abort our own group so the collective fails at once instead of at its timeout.
      loop_.request_stop();
      wakeCv_.notify_all();
      if (!waitLoopDone(std::chrono::milliseconds(intervalMs_) + std::chrono::seconds(2))) {
        BAGUA_LOG_WARN(kLogAlgo,
                       "async: averaging thread still in a round at shutdown (call abort() on "
                       "every rank before tearing down); aborting its communicator");
        threadGroup_->abort("async model average shutting down without abort()");
      }
      loop_.join();
    }
  }

  bool needReset(core::DistributedDataParallel& ddp) override {
    if (!mainStage_ && ddp.trainStep() > owner_->warmupSteps_) {
      owner_->mainStage_ = true;
      return true;
    }
    return false;
  }

  std::vector<core::TensorRef> initTensors(core::DistributedDataParallel& ddp) override {
    if (!mainStage_) {
      return core::AlgorithmImpl::initTensors(ddp);
    }
    return {};  // the weights are averaged by the background thread
  }

  Status runBucket(core::Bucket& b, core::ProcessGroup& /*group*/) override {
    if (mainStage_) {
      return Status::ok();
    }
    // Warm-up: full-precision gradient all-reduce on the algorithm's own group.
    return threadGroup_->global()
        .allReduce(b.flat, b.flat, b.numel, b.dtype, core::ReduceOp::kAvg)
        ->wait(threadGroup_->options().collectiveTimeout);
  }

  Status onForwardPre(core::DistributedDataParallel& ddp) override {
    if (!mainStage_) {
      return Status::ok();
    }
    BAGUA_RETURN_IF_ERROR(loopStatus());
    if (!built_) {
      BAGUA_ASSIGN_OR_RETURN(view_, detail::makeWeightView(ddp, "async", /*allowDevice=*/true));
      params_ = &ddp.parameters();
      trainerStream_ = ddp.options().cudaStream;
      // On the weights' side: host memory, or the weights' CUDA device (NCCL needs device
      // memory, also for the 1-byte abort flag).
      BAGUA_RETURN_IF_ERROR(temp_.ensure(view_.exec, view_.numel * sizeof(float)));
      BAGUA_RETURN_IF_ERROR(reduced_.ensure(view_.exec, view_.numel * sizeof(float)));
      BAGUA_RETURN_IF_ERROR(flag_.ensure(view_.exec, sizeof(uint32_t)));
      built_ = true;
    }
    if (state_ == State::kNew && intervalMs_ > 0) {
      startLoop();
    }
    if (locked_) {
      return Status::ok();  // a forward without a step in between (gradient accumulation)
    }
    // Forward, backward and the optimizer step run under the weight lock; the averaging
    // thread reads and updates the weights between iterations. (In Bagua the optimizer step is
    // outside the lock but ordered after the averaging kernel by the CUDA compute stream; on
    // the CPU the lock gives that ordering.) Let a waiting averaging thread go first, so the
    // trainer re-locking at once cannot starve it.
    const auto deadline = std::chrono::steady_clock::now() + lockTimeout();
    while (loopWantsLock_.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    if (!weightMu_.lockUntil(deadline)) {
      return BAGUA_ERROR(kDeadlineExceeded,
                         "async: the averaging thread held the weights for more than %lld ms",
                         static_cast<long long>(lockTimeout().count()));
    }
    locked_ = true;
    return Status::ok();
  }

  Status onPostBackward(core::DistributedDataParallel& /*ddp*/) override { return loopStatus(); }

  Status onPostOptimizerStep(core::DistributedDataParallel& /*ddp*/) override {
    if (locked_) {
      // CUDA weights: the trainer's kernels (the optimizer step) must be done before the
      // averaging thread, on its own stream, reads the weights.
      const Status s = detail::waitForStream(view_.exec, trainerStream_, lockTimeout());
      locked_ = false;
      weightMu_.unlock();
      BAGUA_RETURN_IF_ERROR(s);
    }
    return loopStatus();
  }

  Status abort() {
    if (state_ != State::kStarted) {
      return Status::ok();  // never started, or already stopped: a no-op as in Bagua
    }
    const auto timeout = mainGroup_.options().collectiveTimeout;
    // After the barrier every rank sets its flag; the MIN negotiation then stops every rank
    // in the same round.
    BAGUA_RETURN_IF_ERROR(mainGroup_.global().barrier()->wait(timeout));
    {
      std::lock_guard<std::mutex> lock(loopMu_);  // no lost wake-up of the interval sleep
      aborted_.store(true, std::memory_order_release);
    }
    wakeCv_.notify_all();
    const bool done =
        waitLoopDone(timeout + std::chrono::milliseconds(intervalMs_) + std::chrono::seconds(5));
    if (!done) {
      threadGroup_->abort("async abort(): the averaging round did not finish");
    }
    loop_.join();
    state_ = State::kStopped;
    if (!done) {
      return BAGUA_ERROR(kDeadlineExceeded,
                         "async abort(): the averaging thread did not stop in time; its "
                         "communicator was aborted");
    }
    return loopStatus();
  }

  Status resume() {
    if (state_ == State::kStarted) {
      return Status::ok();
    }
    BAGUA_RETURN_IF_ERROR(
        mainGroup_.global().barrier()->wait(mainGroup_.options().collectiveTimeout));
    aborted_.store(false, std::memory_order_release);
    if (mainStage_ && built_ && intervalMs_ > 0) {
      startLoop();
    } else {
      state_ = State::kNew;  // starts at the first forward of the main stage
    }
    return Status::ok();
  }

  int64_t rounds() const { return rounds_.load(std::memory_order_acquire); }

 private:
  enum class State { kNew, kStarted, kStopped };

  std::chrono::milliseconds lockTimeout() const {
    return threadGroup_->options().collectiveTimeout + std::chrono::seconds(5);
  }

  // Averaging thread: announces itself so the trainer's next forward waits for it.
  bool lockWeights() {
    loopWantsLock_.store(true, std::memory_order_release);
    const bool held = weightMu_.lockUntil(std::chrono::steady_clock::now() + lockTimeout());
    loopWantsLock_.store(false, std::memory_order_release);
    return held;
  }

  Status loopStatus() {
    std::lock_guard<std::mutex> lock(loopMu_);
    return loopError_;
  }

  void startLoop() {
    {
      std::lock_guard<std::mutex> lock(loopMu_);
      loopDone_ = false;
    }
    loop_ = std::jthread([this](std::stop_token st) { loop(st); });
    state_ = State::kStarted;
  }

  bool waitLoopDone(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(loopMu_);
    return doneCv_.wait_for(lock, timeout, [&] { return loopDone_; });
  }

  void loop(std::stop_token stop) {
    setThreadName("bagua-async");
    Status s = runRounds(stop);
    {
      std::lock_guard<std::mutex> lock(loopMu_);
      if (!s.isOk() && loopError_.isOk()) {
        loopError_ = s.withContext("async model average");
      }
      loopDone_ = true;
    }
    doneCv_.notify_all();
  }

  Status runRounds(std::stop_token stop) {
    core::Communicator& comm = threadGroup_->global();
    const auto timeout = threadGroup_->options().collectiveTimeout;
    const float n = static_cast<float>(comm.size());
    // Host weights: plain loops. CUDA weights: this thread's own stream (cudaStreamPerThread),
    // synced before each collective reads a buffer and before the weight lock is released, so
    // the trainer never sees a half-applied round.
    const detail::Exec& x = view_.exec;
    while (!stop.stop_requested()) {
      // 1. Abort negotiation: everyone stops in the round where every flag is set.
      uint8_t flag = aborted_.load(std::memory_order_acquire) ? 1 : 0;
      BAGUA_RETURN_IF_ERROR(detail::copyFromHost(x, flag_.u8(), &flag, 1));
      BAGUA_RETURN_IF_ERROR(
          comm.allReduce(flag_.u8(), flag_.u8(), 1, core::DataType::kU8, core::ReduceOp::kMin)
              ->wait(timeout));
      BAGUA_RETURN_IF_ERROR(detail::copyToHost(x, &flag, flag_.u8(), 1));
      if (flag != 0) {
        return Status::ok();
      }
      // 2. Snapshot the weights between two training iterations' forward+backward.
      {
        WeightGuard guard(weightMu_, lockWeights());
        if (!guard.held()) {
          return BAGUA_ERROR(kDeadlineExceeded, "the trainer held the weights too long");
        }
        BAGUA_RETURN_IF_ERROR(detail::gatherWeights(*params_, view_, temp_.f32()));
        BAGUA_RETURN_IF_ERROR(detail::sync(x, timeout));
      }
      // 3. Sum while training goes on.
      BAGUA_RETURN_IF_ERROR(comm.allReduce(temp_.f32(), reduced_.f32(), view_.numel,
                                           core::DataType::kF32, core::ReduceOp::kSum)
                                ->wait(timeout));
      // 4. w += mean - snapshot: local updates made meanwhile are kept.
      {
        WeightGuard guard(weightMu_, lockWeights());
        if (!guard.held()) {
          return BAGUA_ERROR(kDeadlineExceeded, "the trainer held the weights too long");
        }
        for (size_t k = 0; k < view_.params.size(); ++k) {
          core::Parameter& p = (*params_)[view_.params[k]];
          BAGUA_RETURN_IF_ERROR(detail::addMeanMinusSnapshot(
              x, static_cast<float*>(p.data), reduced_.f32() + view_.offsets[k],
              temp_.f32() + view_.offsets[k], n, p.numel));
        }
        BAGUA_RETURN_IF_ERROR(detail::sync(x, timeout));
      }
      rounds_.fetch_add(1, std::memory_order_acq_rel);
      std::unique_lock<std::mutex> lock(loopMu_);
      wakeCv_.wait_for(lock, stop, std::chrono::milliseconds(intervalMs_),
                       [&] { return aborted_.load(std::memory_order_acquire); });
    }
    return Status::ok();
  }

  AsyncModelAverage* owner_;
  bool mainStage_;
  int intervalMs_;
  core::ProcessGroup& mainGroup_;
  std::unique_ptr<core::ProcessGroup> threadGroup_;

  // Trainer thread.
  State state_ = State::kNew;
  bool built_ = false;
  bool locked_ = false;
  detail::WeightView view_;
  std::vector<core::Parameter>* params_ = nullptr;
  void* trainerStream_ = nullptr;  // DdpOptions::cudaStream

  // Averaging thread (temp_, reduced_, flag_; allocated by the trainer before the thread
  // starts), weights under weightMu_.
  WeightLock weightMu_;
  detail::Buffer temp_;
  detail::Buffer reduced_;
  detail::Buffer flag_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> loopWantsLock_{false};
  std::atomic<int64_t> rounds_{0};

  // Lock order: weightMu_ and loopMu_ are never held together.
  std::mutex loopMu_;
  std::condition_variable_any wakeCv_;
  std::condition_variable_any doneCv_;
  bool loopDone_ = true;
  Status loopError_;
  std::jthread loop_;
};

AsyncModelAverage::~AsyncModelAverage() = default;

Status AsyncModelAverage::abort() {
  std::lock_guard<std::mutex> lock(mu_);
  if (live_ == nullptr) {
    return Status::ok();
  }
  return live_->abort();
}

Status AsyncModelAverage::resume() {
  std::lock_guard<std::mutex> lock(mu_);
  if (live_ == nullptr) {
    return Status::ok();
  }
  return live_->resume();
}

int64_t AsyncModelAverage::rounds() {
  std::lock_guard<std::mutex> lock(mu_);
  return live_ == nullptr ? 0 : live_->rounds();
}

Result<std::unique_ptr<core::AlgorithmImpl>> AsyncModelAverage::reify(core::ProcessGroup& group) {
  if (syncIntervalMs_ < 0 || warmupSteps_ < 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "async: sync_interval_ms=%d and warmup_steps=%d must be >= 0",
                       syncIntervalMs_, warmupSteps_);
  }
  if (warmupSteps_ == 0) {
    mainStage_ = true;
  }
  // The averaging thread talks on its own group, so it never interleaves with the reducer's
  // collectives on the training group (Bagua's fix #298).
  BAGUA_ASSIGN_OR_RETURN(auto threadGroup, detail::threadGroup(group, "async", false));
  return std::unique_ptr<core::AlgorithmImpl>(
      new AsyncImpl(this, mainStage_, group, std::move(threadGroup)));
}

}  // namespace bagua::algo
