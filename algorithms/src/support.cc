#include "support.h"

#include <algorithm>
#include <cstring>

#include "bagua/base/thread.h"

namespace bagua::algo::detail {

Result<WeightView> makeWeightView(core::DistributedDataParallel& ddp,
                                  const std::vector<int>& params, const char* algorithm,
                                  bool allowDevice) {
  WeightView v;
  auto& ps = ddp.parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    const int i = params[k];
    const core::Parameter& p = ps[i];
    const bool onDevice = p.device.type != core::DeviceType::kCpu;
    if (p.dtype != core::DataType::kF32 || (onDevice && !allowDevice)) {
      return BAGUA_ERROR(kFailedPrecondition,
                         "%s: parameter '%s' is %s on %s; this algorithm averages f32 %s weights "
                         "only",
                         algorithm, p.name.c_str(), core::dataTypeName(p.dtype),
                         core::deviceTypeName(p.device.type), allowDevice ? "CPU or CUDA" : "CPU");
    }
    BAGUA_ASSIGN_OR_RETURN(Exec e, execFor(p.device, algorithm));
    if (k > 0 && (e.device != v.exec.device || e.deviceIndex != v.exec.deviceIndex)) {
      return BAGUA_ERROR(kFailedPrecondition,
                         "%s: parameter '%s' is on %s:%d, the others on %s:%d; the weights must "
                         "live on one device",
                         algorithm, p.name.c_str(), core::deviceTypeName(p.device.type),
                         p.device.index, v.exec.device ? "cuda" : "cpu", v.exec.deviceIndex);
    }
    v.exec = e;
    v.params.push_back(i);
    v.offsets.push_back(v.numel);
    v.numel += p.numel;
  }
  return v;
}

Result<WeightView> makeWeightView(core::DistributedDataParallel& ddp, const char* algorithm,
                                  bool allowDevice) {
  std::vector<int> params;
  auto& ps = ddp.parameters();
  for (int i = static_cast<int>(ps.size()) - 1; i >= 0; --i) {
    if (ps[i].requiresGrad && !ddp.isIgnored(ps[i].name) && ps[i].numel > 0) {
      params.push_back(i);
    }
  }
  return makeWeightView(ddp, params, algorithm, allowDevice);
}

Status gatherWeights(const std::vector<core::Parameter>& ps, const WeightView& view, float* out) {
  for (size_t k = 0; k < view.params.size(); ++k) {
    const core::Parameter& p = ps[view.params[k]];
    BAGUA_RETURN_IF_ERROR(
        copyBytes(view.exec, out + view.offsets[k], p.data, p.numel * sizeof(float)));
  }
  return Status::ok();
}

Status scatterWeights(std::vector<core::Parameter>& ps, const WeightView& view, const float* in) {
  for (size_t k = 0; k < view.params.size(); ++k) {
    core::Parameter& p = ps[view.params[k]];
    BAGUA_RETURN_IF_ERROR(
        copyBytes(view.exec, p.data, in + view.offsets[k], p.numel * sizeof(float)));
  }
  return Status::ok();
}

Worker::Worker(std::string name)
    : name_(std::move(name)), thread_([this](std::stop_token st) { loop(st); }) {}

Worker::~Worker() {
  thread_.request_stop();
  cv_.notify_all();
}

Status Worker::start(std::function<Status()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_ || running_) {
      return BAGUA_ERROR(kFailedPrecondition, "%s: the previous job has not finished",
                         name_.c_str());
    }
    job_ = std::move(job);
    pending_ = true;
    result_ = Status::ok();
  }
  cv_.notify_all();
  return Status::ok();
}

Status Worker::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !pending_ && !running_; })) {
    return BAGUA_ERROR(kDeadlineExceeded, "%s: job still running after %lld ms", name_.c_str(),
                       static_cast<long long>(timeout.count()));
  }
  return result_;
}

bool Worker::busy() {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_ || running_;
}

void Worker::loop(std::stop_token stop) {
  setThreadName(name_);
  while (true) {
    std::function<Status()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, stop, std::chrono::milliseconds(200), [&] { return pending_; });
      if (!pending_) {
        if (stop.stop_requested()) {
          return;
        }
        continue;
      }
      job = std::move(job_);
      pending_ = false;
      running_ = true;
    }
    Status s = job();
    {
      std::lock_guard<std::mutex> lock(mu_);
      result_ = std::move(s);
      running_ = false;
    }
    cv_.notify_all();
  }
}

Result<std::unique_ptr<core::ProcessGroup>> threadGroup(core::ProcessGroup& group,
                                                        const char* purpose, bool hierarchical) {
  // Its name must be new to the store and equal across ranks: the k-th such group of `purpose`
  // on a training group, counted in the group's store (every rank adds 1, so the k-th round
  // draws k*size+1 .. (k+1)*size; rounds cannot overlap, the wrap's broadcast lies between
  // them). Not counted per algorithm object: a front end may make a new one for every reducer it
  // builds (the Python one does, at rebuilds and model switches), and a count in the object then
  // repeats a name whose rendezvous keys are already taken.
  BAGUA_ASSIGN_OR_RETURN(
      int64_t drawn,
      group.store()->add(strPrintf("%s/%s/reified", group.options().name.c_str(), purpose), 1));
  const int64_t n = (drawn - 1) / std::max(1, group.size());
  core::ProcessGroupOptions o = group.options();
  o.name = strPrintf("%s/%s/%lld", o.name.c_str(), purpose, static_cast<long long>(n));
  o.hierarchical = hierarchical;
  return core::ProcessGroup::create(group.store(), o);
}

}  // namespace bagua::algo::detail
