// The reducer's bucket thread ("bagua-bucket", commLoop) and the trainer's side of the hand-over:
// ready buckets queued in order, each run through the algorithm (runBucket) or started as one
// collective (launchBucket) and finished in the order started; the waits for them.
#include <deque>
#include <tuple>

#include "bagua/base/thread.h"
#include "bagua/core/ddp.h"
#include "ddp_internal.h"
#include "device_stager.h"

namespace bagua::core {

using ddp_detail::Clock;
using ddp_detail::nsSince;

Status DistributedDataParallel::launchReadyBuckets() {
  // Device buckets: mark "all gradients copied" on the trainer's stream before handing them over.
  for (size_t bi = nextBucket_; bi < buckets_.size() && pendingInBucket_[bi] == 0; ++bi) {
    BAGUA_RETURN_IF_ERROR(stager_->markReady(buckets_[bi]));
  }
  bool any = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = Clock::now();
    while (nextBucket_ < buckets_.size() && pendingInBucket_[nextBucket_] == 0) {
      queue_.emplace_back(static_cast<int>(nextBucket_), now);
      ++launched_;
      ++nextBucket_;
      any = true;
    }
  }
  if (any) {
    cv_.notify_all();  // after unlocking: the bucket thread takes the lock at once
  }
  return Status::ok();
}

void DistributedDataParallel::finishBucket(int bi, Status s, Clock::time_point queuedAt,
                                           Clock::time_point started, Clock::time_point ready,
                                           bool deviceOrdered) {
  if (!s.isOk()) {
    s.withContext(strPrintf("bucket %d (%zu x %s)", bi, buckets_[bi].numel,
                            dataTypeName(buckets_[bi].dtype)));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.isOk() && commError_.isOk()) {
      commError_ = s;
    }
    ++completed_;
    if (!deviceOrdered) {
      ++enqueued_;  // a device-ordered bucket counted when its collective was enqueued
      reduced_[bi] = 1;
    }
    ++stats_.buckets;
    stats_.bucketQueueNs +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(started - queuedAt).count();
    stats_.bucketWaitNs +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(ready - started).count();
    stats_.bucketRunNs += nsSince(ready);
  }
  doneCv_.notify_all();
}

void DistributedDataParallel::commLoop(std::stop_token stop) {
  setThreadName("bagua-bucket");
  // Buckets whose collective was started with launchBucket and has not finished, oldest first
  // (they finish in that order).
  struct InFlight {
    int bucket;
    WorkPtr work;
    Clock::time_point queuedAt, started, ready;
    bool deviceOrdered;
  };
  std::deque<InFlight> inflight;
  while (true) {
    int bi = -1;
    Clock::time_point queuedAt;
    const bool hostInFlight =
        !inflight.empty() && buckets_[inflight.front().bucket].device.type == DeviceType::kCpu;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Device collectives in flight: look at the oldest every 100 us unless a new bucket comes
      // first (new buckets start at once: their collectives queue on the stream behind it).
      // Host ones: no cv wait here, the thread blocks on the oldest below.
      if (!hostInFlight) {
        const auto poll =
            inflight.empty() ? std::chrono::microseconds(200000) : std::chrono::microseconds(100);
        cv_.wait_for(lock, stop, poll, [&] { return !queue_.empty(); });
      }
      if (!queue_.empty()) {
        std::tie(bi, queuedAt) = queue_.front();
        queue_.pop_front();
      } else if (inflight.empty() && stop.stop_requested()) {
        return;
      }
    }
    if (bi < 0 && hostInFlight) {
      // The host backend's worker runs one collective at a time, so a bucket queued meanwhile
      // would only start after the oldest anyway: sleep on the oldest (in slices, to see the
      // deadline and stop) instead of polling, which cost ~4-5 ms of CPU per step on 2 cores
      // (bench/ddp, ResNet at 10 Gbit/s). A slice that ends early is looked at below.
      (void)inflight.front().work->wait(std::chrono::milliseconds(20));
    }
    // Finished collectives, oldest first; one past its deadline fails the iteration (it keeps
    // running: the communicator's own timeout or abort ends it).
    while (!inflight.empty()) {
      InFlight& f = inflight.front();
      Status done;
      if (f.work->test()) {
        done = f.work->status();
      } else if (Clock::now() - f.started > timeout_) {
        done = BAGUA_ERROR(kDeadlineExceeded, "the collective did not finish within %lld ms",
                           static_cast<long long>(timeout_.count()));
      } else if (stop.stop_requested() && bi < 0) {
        // Shutting down with work in flight (an abandoned iteration): wait, bounded.
        done = f.work->wait(timeout_);
      } else {
        break;
      }
      finishBucket(f.bucket, done, f.queuedAt, f.started, f.ready, f.deviceOrdered);
      inflight.pop_front();
    }
    if (bi < 0) {
      continue;
    }
    Status s;
    const Clock::time_point started = Clock::now();
    Clock::time_point ready = started;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = commError_;
    }
    // A device bucket that may be launched as one collective: its communicator's stream waits
    // for the copies (device order, no host wait); a host wait only if the algorithm then runs
    // it through runBucket after all (its device work is on another stream).
    Bucket& bucket = buckets_[bi];
    bool deviceOrdered = false;
    if (s.isOk() && bucket.device.type != DeviceType::kCpu) {
      s = stager_->orderCommAfterCopies(bucket, group_.global());
      deviceOrdered = s.isOk();
    }
    if (s.isOk() && !deviceOrdered) {
      s = stager_->waitReady(bucket, Clock::now() + timeout_);
      ready = Clock::now();
    }
    if (s.isOk()) {
      Result<WorkPtr> w = impl_->launchBucket(bucket, group_);
      if (!w.isOk()) {
        s = w.status();
      } else if (*w) {
        inflight.push_back({bi, *w, queuedAt, started, ready, deviceOrdered});
        if (deviceOrdered) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            ++enqueued_;
            ++deviceOrderedThisIteration_;
            reduced_[bi] = 1;
          }
          doneCv_.notify_all();
        }
        continue;  // finished later, in order
      } else {
        if (deviceOrdered) {
          s = stager_->waitReady(bucket, Clock::now() + timeout_);
          ready = Clock::now();
        }
        if (s.isOk()) {
          s = impl_->runBucket(bucket, group_);
        }
      }
    }
    finishBucket(bi, s, queuedAt, started, ready, /*deviceOrdered=*/false);
  }
}

Status DistributedDataParallel::waitForBuckets() {
  bool deviceOrder = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    BAGUA_RETURN_IF_ERROR(waitUntilAll(lock, enqueued_));
    deviceOrder = !buckets_.empty() && deviceOrderedThisIteration_ == buckets_.size();
    deviceOrderedThisIteration_ = 0;
  }
  // Every bucket's collective is enqueued in device order: the trainer's stream waits for the
  // last one, nobody waits on the host. Otherwise wait here for all of them to finish.
  return deviceOrder ? stager_->orderTrainerAfter(group_.global()) : drainBuckets();
}

Status DistributedDataParallel::drainBuckets() {
  std::unique_lock<std::mutex> lock(mu_);
  return waitUntilAll(lock, completed_);
}

Status DistributedDataParallel::waitUntilAll(std::unique_lock<std::mutex>& lock,
                                             const size_t& counted) {
  const auto deadline = Clock::now() + timeout_ + std::chrono::seconds(5);
  if (!doneCv_.wait_until(lock, deadline, [&] { return counted == launched_; })) {
    return BAGUA_ERROR(kDeadlineExceeded,
                       "rank %d: bucket communication did not finish within %lld ms (%zu of %zu "
                       "buckets done)",
                       group_.rank(), static_cast<long long>(timeout_.count()), counted, launched_);
  }
  return commError_;
}

}  // namespace bagua::core
