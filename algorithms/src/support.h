// Helpers shared by the weight-based algorithms (decentralized, low-precision decentralized,
// async): a flat view of the model's weights, a one-job background worker and the process group
// such a worker talks on. Private.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/ddp.h"
#include "bagua/core/process_group.h"
#include "vec_ops.h"

namespace bagua::algo::detail {

// The communicated weights: parameters that require grad and are not ignored, in reverse
// registration order (Bagua's tensor order), as one flat float32 vector on the weights' side
// (host, or the one CUDA device they all live on).
struct WeightView {
  std::vector<int> params;
  std::vector<size_t> offsets;
  size_t numel = 0;
  Exec exec;
};

// FailedPrecondition naming the parameter when one is not f32, or lives on a CUDA device while
// !allowDevice (or on another device than the others, or the build has no CUDA kernels).
Result<WeightView> makeWeightView(core::DistributedDataParallel& ddp, const char* algorithm,
                                  bool allowDevice = false);
// The same, for a subset of parameter indices (in the given order).
Result<WeightView> makeWeightView(core::DistributedDataParallel& ddp,
                                  const std::vector<int>& params, const char* algorithm,
                                  bool allowDevice = false);
// Copies between the parameters and a flat buffer on the view's side (device: enqueued on this
// thread's stream; sync before a collective reads the buffer).
[[nodiscard]] Status gatherWeights(const std::vector<core::Parameter>& params,
                                   const WeightView& view, float* out);
[[nodiscard]] Status scatterWeights(std::vector<core::Parameter>& params, const WeightView& view,
                                    const float* in);

// A process group of its own for an algorithm's background thread, over the same ranks and store
// as `group`: collectives issued from two threads on one communicator run in whichever order the
// threads reach it, which may differ between ranks and pair the operations wrongly (Bagua's fix
// #298; the trainer's own collectives, a SyncBatchNorm's for example, run on `group` meanwhile).
// Collective: every rank calls it at the same point. `purpose` names it ("async", ...).
Result<std::unique_ptr<core::ProcessGroup>> threadGroup(core::ProcessGroup& group,
                                                        const char* purpose, bool hierarchical);

// One named thread running one job at a time; start() hands it a job, wait() collects its
// status within a deadline. Destruction requests stop and joins (a running job must itself be
// bounded: every collective in it waits with the collective timeout).
class Worker {
 public:
  explicit Worker(std::string name);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // FailedPrecondition if a job is still pending or running.
  Status start(std::function<Status()> job);
  // The job's status; DeadlineExceeded if it did not finish within `timeout` (it keeps running).
  Status wait(std::chrono::milliseconds timeout);
  bool busy();

 private:
  void loop(std::stop_token stop);

  std::string name_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::function<Status()> job_;
  bool pending_ = false;
  bool running_ = false;
  Status result_;
  std::jthread thread_;  // last: started after the state above exists, joined first
};

}  // namespace bagua::algo::detail
