// HostCommunicator's queue and worker: operations are enqueued by any thread and run in issue
// order by the one worker thread; the Work handed back completes when its operation ran. The
// collectives themselves are in host_collectives.cc, live tuning in host_tuning.cc.
#include "backend/host/host_communicator.h"

#include <algorithm>
#include <condition_variable>

#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "bagua/core/params.h"

namespace bagua::core {

namespace {

class DoneWork final : public Work {
 public:
  explicit DoneWork(Status s) : status_(std::move(s)) {}
  bool test() override { return true; }
  Status wait(std::chrono::milliseconds) override { return status_; }
  Status status() override { return status_; }

 private:
  Status status_;
};

}  // namespace

WorkPtr completedWork(Status status) {
  return std::make_shared<DoneWork>(std::move(status));
}

namespace host {

using Clock = std::chrono::steady_clock;

Result<HostOptions> hostOptionsFromParams(std::chrono::milliseconds timeout, int ranksPerHost) {
  HostOptions o;
  if (timeout.count() <= 0) {
    BAGUA_ASSIGN_OR_RETURN(int64_t t, coreParams().collectiveTimeoutMs.get());
    timeout = std::chrono::milliseconds(t);
  }
  o.timeout = timeout;
  Result<std::string> algo = coreParams().hostAlgorithm.get();
  if (!algo.isOk()) {
    return algo.status();
  }
  o.algo = *algo == "ring"   ? HostOptions::Algo::kRing
           : *algo == "tree" ? HostOptions::Algo::kTree
                             : HostOptions::Algo::kAuto;
  BAGUA_ASSIGN_OR_RETURN(uint64_t tree, coreParams().hostTreeMaxBytes.get());
  o.treeMaxBytes = tree;
  BAGUA_ASSIGN_OR_RETURN(uint64_t seg, coreParams().hostSegmentBytes.get());
  o.segmentBytes = seg;
  BAGUA_ASSIGN_OR_RETURN(int64_t threads, coreParams().hostReduceThreads.get());
  if (threads == 0) {
    // Cores are shared by the ranks of a host: helpers beyond a rank's share only add
    // context switches.
    const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
    threads = std::clamp<int64_t>(cores / std::max(1, ranksPerHost), 1, 4);
  }
  o.reduceThreads = static_cast<int>(threads);
  return o;
}

class HostCommunicator::HostWork final : public Work {
 public:
  bool test() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  Status wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
      return BAGUA_ERROR(kDeadlineExceeded, "%s still running after waiting %lld ms", name_.c_str(),
                         static_cast<long long>(timeout.count()));
    }
    return status_;
  }
  Status status() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      return BAGUA_ERROR(kFailedPrecondition, "%s has not finished", name_.c_str());
    }
    return status_;
  }
  void complete(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = std::move(s);
      done_ = true;
    }
    cv_.notify_all();
  }
  explicit HostWork(std::string name) : name_(std::move(name)) {}

 private:
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

HostCommunicator::HostCommunicator(std::unique_ptr<Transport> transport, const HostOptions& options)
    : transport_(std::move(transport)), options_(options), reducer_(options.reduceThreads) {
  options_.segmentBytes = std::max<size_t>(options_.segmentBytes, 4096);
  segmentNow_.store(options_.segmentBytes, std::memory_order_relaxed);
  worker_ = std::jthread([this](std::stop_token st) { workerLoop(st); });
}

HostCommunicator::~HostCommunicator() {
  // First: its "bye" tells the peers this rank leaves in order, before our sockets close.
  if (monitor_) {
    monitor_->stop();
  }
  // An operation still running (a peer that never joins) would otherwise hold the join up to
  // the collective timeout. Data already handed to the transport still reaches the peers.
  transport_->abort("communicator destroyed");
  worker_.request_stop();
  queueCv_.notify_all();
  if (worker_.joinable()) {
    worker_.join();
  }
  // Anything still queued fails rather than leaving waiters hanging.
  std::lock_guard<std::mutex> lock(queueMu_);
  for (auto& item : queue_) {
    item.work->complete(BAGUA_ERROR(kAborted, "%s: communicator destroyed", item.name.c_str()));
  }
  queue_.clear();
}

WorkPtr HostCommunicator::enqueue(std::string name, std::function<Status(Deadline)> run) {
  auto work = std::make_shared<HostWork>(name);
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    queue_.push_back({std::move(name), std::move(run), work});
  }
  queueCv_.notify_one();
  return work;
}

void HostCommunicator::workerLoop(std::stop_token stop) {
  setThreadName("bagua-host-comm");
  while (true) {
    Item item;
    Status broken;
    {
      std::unique_lock<std::mutex> lock(queueMu_);
      queueCv_.wait_for(lock, stop, std::chrono::milliseconds(200),
                        [&] { return !queue_.empty(); });
      if (queue_.empty()) {
        if (stop.stop_requested()) {
          return;
        }
        continue;
      }
      item = std::move(queue_.front());
      queue_.pop_front();
      broken = broken_;
    }
    if (!broken.isOk()) {
      item.work->complete(BAGUA_ERROR(kFailedPrecondition,
                                      "rank %d: %s not run: the communicator failed earlier: %s",
                                      rank(), item.name.c_str(), broken.message().c_str()));
      continue;
    }
    Status s = item.run(Clock::now() + options_.timeout);
    operations_.fetch_add(1, std::memory_order_relaxed);
    if (!s.isOk() && monitor_) {
      // A survivor that declared a peer on another host lost aborts, and we may see its sockets
      // close just before its notice arrives: report the lost peer, not the messenger.
      std::string lost = monitor_->waitLost(std::chrono::milliseconds(250));
      if (!lost.empty() && s.message().find(lost) == std::string::npos) {
        s = BAGUA_ERROR(kUnavailable, "%s (the transport reported: %s)", lost.c_str(),
                        s.message().c_str());
      }
    }
    if (!s.isOk()) {
      s.withContext(strPrintf("rank %d: %s", rank(), item.name.c_str()));
      BAGUA_LOG_WARN(kLogCore, "host communicator failed: %s", s.toString().c_str());
      std::lock_guard<std::mutex> lock(queueMu_);
      if (broken_.isOk()) {
        broken_ = s;
      }
    }
    item.work->complete(std::move(s));
  }
}

void HostCommunicator::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    if (broken_.isOk()) {
      broken_ = BAGUA_ERROR(kAborted, "aborted: %s", why.c_str());
    }
  }
  transport_->abort(why);
  queueCv_.notify_all();
}

Status HostCommunicator::startPeerMonitor(Store& store, const PeerMonitorOptions& options) {
  BAGUA_ASSIGN_OR_RETURN(monitor_,
                         PeerMonitor::start(store, rank(), size(), options,
                                            [this](const std::string& why) { abort(why); }));
  return Status::ok();
}

CommStats HostCommunicator::stats() const {
  CommStats s;
  s.bytesSent = transport_->bytesSent();
  s.bytesReceived = transport_->bytesReceived();
  s.operations = operations_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace host

}  // namespace bagua::core
