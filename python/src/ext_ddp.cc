// The reducer (core::DistributedDataParallel) over torch tensors' memory, the algorithms of
// algorithms/ by name, and QAdamOptimizer.
//
// CUDA parameters go to the same reducer on an NCCL group: it copies gradients into device
// buckets on the trainer's stream (cuda_stream, torch's current stream at wrap time), and its
// collectives wait for those copies with events.
//
// Parameters cross as (name, data_ptr, grad_ptr, numel, dtype, device_type, device_index,
// requires_grad). Python owns every byte: the reducer runs in copy mode (a ready gradient is
// copied into the bucket at markGradReady, the result copied back at finishBackward), and
// Python refreshes the gradient pointer before each markGradReady because autograd may
// reallocate param.grad (zero_grad(set_to_none=True)). `grad_homes` (one address per parameter,
// 0 for none) are do_flatten's laid-out gradients, which Python keeps alive as long as the
// reducer: buckets whose homes lie back to back run in place there (Parameter::gradHome), and a
// gradient autograd wrote at its home is then neither copied in nor out.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "bagua/algorithms/algorithms.h"
#include "bagua/algorithms/auto_select.h"
#include "bagua/algorithms/qadam.h"
#include "bagua/autotune/autotuner.h"
#include "bagua/autotune/params.h"
#include "bagua/core/ddp.h"
#include "ext.h"

namespace bagua::py {

namespace {

using core::Parameter;

using ParamSpec = std::tuple<std::string, uintptr_t, uintptr_t, size_t, int, int, int, bool>;

std::vector<Parameter> toParams(const std::vector<ParamSpec>& specs) {
  std::vector<Parameter> out;
  out.reserve(specs.size());
  for (const auto& [name, data, grad, numel, dtype, devType, devIndex, requiresGrad] : specs) {
    if (dtype < 0 || dtype >= core::kNumDataTypes) {
      throw pyb::value_error(name + ": bad dtype code " + std::to_string(dtype));
    }
    Parameter p;
    p.name = name;
    p.data = reinterpret_cast<void*>(data);
    p.grad = reinterpret_cast<void*>(grad);
    p.numel = numel;
    p.dtype = static_cast<core::DataType>(dtype);
    p.device.type = devType == 0 ? core::DeviceType::kCpu : core::DeviceType::kCuda;
    p.device.index = devIndex;
    p.requiresGrad = requiresGrad;
    out.push_back(std::move(p));
  }
  return out;
}

// QAdamOptimizer over the torch parameters' memory (its own parameter list, refreshed before
// each step).
class PyQAdam {
 public:
  PyQAdam(const std::vector<ParamSpec>& specs, float lr, int warmupSteps, float beta1, float beta2,
          float eps, float weightDecay, bool holdZeroVariance)
      : params_(toParams(specs)) {
    algo::QAdamOptions o;
    o.lr = lr;
    o.warmupSteps = warmupSteps;
    o.beta1 = beta1;
    o.beta2 = beta2;
    o.eps = eps;
    o.weightDecay = weightDecay;
    o.holdZeroVariance = holdZeroVariance;
    opt_ = take(algo::QAdamOptimizer::create(params_, o));
  }
  void setPointers(const std::vector<std::pair<uintptr_t, uintptr_t>>& ptrs) {
    if (ptrs.size() != params_.size()) {
      throw pyb::value_error("QAdamOptimizer: pointer list has the wrong length");
    }
    for (size_t i = 0; i < ptrs.size(); ++i) {
      params_[i].data = reinterpret_cast<void*>(ptrs[i].first);
      params_[i].grad = reinterpret_cast<void*>(ptrs[i].second);
    }
  }
  void step() {
    Status s;
    {
      pyb::gil_scoped_release nogil;
      s = opt_->step();
    }
    check(s);
  }
  int64_t stepCount() const { return opt_->stepCount(); }
  bool holdZeroVariance() const { return opt_->options().holdZeroVariance; }
  // m (second = false) or v of parameter i as host bytes. The state lives where the parameter
  // does (device memory for a CUDA parameter), so it goes through readState / writeState, which
  // copy from or to either side and wait for the copy; the GIL is released while they wait.
  pyb::bytes state(int i, bool second) {
    if (i < 0 || i >= static_cast<int>(params_.size())) {
      throw pyb::index_error("QAdamOptimizer: parameter index out of range");
    }
    std::vector<float> host(params_[static_cast<size_t>(i)].numel);
    Status s;
    {
      pyb::gil_scoped_release nogil;
      s = opt_->readState(i, second, host.data());
    }
    check(s);
    return pyb::bytes(reinterpret_cast<const char*>(host.data()), host.size() * sizeof(float));
  }
  void setState(int i, bool second, const pyb::bytes& b) {
    if (i < 0 || i >= static_cast<int>(params_.size())) {
      throw pyb::index_error("QAdamOptimizer: parameter index out of range");
    }
    const std::string bytes = b;
    const size_t numel = params_[static_cast<size_t>(i)].numel;
    if (bytes.size() != numel * sizeof(float)) {
      throw pyb::value_error("QAdamOptimizer: state of " + std::to_string(bytes.size()) +
                             " bytes for a parameter of " + std::to_string(numel) +
                             " float32 elements");
    }
    std::vector<float> host(numel);  // float-aligned copy of the Python bytes
    if (!bytes.empty()) {
      std::memcpy(host.data(), bytes.data(), bytes.size());
    }
    Status s;
    {
      pyb::gil_scoped_release nogil;
      s = opt_->writeState(i, second, host.data());
    }
    check(s);
  }
  // Where m (second = false) or v of parameter i lives (host or device memory, float32, numel
  // elements; owned by this optimizer): Python aliases it as the torch optimizer's state.
  uintptr_t statePtr(int i, bool second) {
    if (i < 0 || i >= static_cast<int>(params_.size())) {
      throw pyb::index_error("QAdamOptimizer: parameter index out of range");
    }
    return reinterpret_cast<uintptr_t>(second ? opt_->expAvgSq(i) : opt_->expAvg(i));
  }
  algo::QAdamOptimizer* get() { return opt_.get(); }

 private:
  std::vector<Parameter> params_;
  std::unique_ptr<algo::QAdamOptimizer> opt_;
};

// Lets the reducer broadcast QAdam's state without stepping it (Python steps the optimizer).
class StateOnlyOptimizer final : public core::Optimizer {
 public:
  explicit StateOnlyOptimizer(core::Optimizer* inner) : inner_(inner) {}
  Status step() override { return Status::ok(); }
  void zeroGrad() override {}
  std::vector<Parameter> stateTensors() override { return inner_->stateTensors(); }

 private:
  core::Optimizer* inner_;
};

pyb::dict decisionDict(const algo::AutoDecision& d) {
  pyb::dict out;
  out["algorithm"] = d.algorithm;
  out["args"] = d.args;
  out["reason"] = d.reason;
  out["probe_steps"] = d.probeSteps;
  pyb::list cands;
  for (const algo::AutoCandidate& c : d.candidates) {
    pyb::dict x;
    x["label"] = c.label;
    x["algorithm"] = c.algorithm;
    x["args"] = c.args;
    x["wire_bytes"] = c.wireBytes;
    x["work_s"] = c.workSeconds;
    x["exposed_s"] = c.exposedSeconds;
    x["step_s"] = c.stepSeconds;
    x["steps_factor"] = c.stepsFactor;
    x["score"] = c.score;
    x["registered"] = c.registered;
    cands.append(x);
  }
  out["candidates"] = cands;
  return out;
}

// algorithm="auto"'s rule on figures given by the caller (tests, what-if tables).
pyb::dict autoChoose(int worldSize, const std::vector<std::vector<size_t>>& buckets,
                     double computeS, double allReduceStepS, double latencyS, double bandwidth,
                     double codec, const std::vector<std::string>& registered, bool hierarchical,
                     size_t elementBytes, bool allF32) {
  algo::AutoInputs in;
  in.worldSize = worldSize;
  in.buckets = buckets;
  in.computeSeconds = computeS;
  in.allReduceStepSeconds = allReduceStepS;
  in.link = {latencyS, bandwidth};
  in.codecBytesPerSecond = codec;
  in.registered = registered;
  in.hierarchical = hierarchical;
  in.elementBytes = elementBytes;
  in.allF32 = allF32;
  return decisionDict(take(algo::chooseAlgorithm(in)));
}

class PyAlgorithm {
 public:
  PyAlgorithm(const std::string& name, const std::map<std::string, std::string>& args,
              PyQAdam* qadam)
      : algo_(take(algo::createAlgorithm(name, args, qadam ? qadam->get() : nullptr))) {}
  std::string name() const { return algo_->name(); }
  std::shared_ptr<core::Algorithm> get() { return algo_; }

  void abort() {
    auto* a = async("abort");
    Status s;
    {
      pyb::gil_scoped_release nogil;
      s = a->abort();
    }
    check(s);
  }
  void resume() {
    auto* a = async("resume");
    Status s;
    {
      pyb::gil_scoped_release nogil;
      s = a->resume();
    }
    check(s);
  }
  int64_t rounds() { return async("rounds")->rounds(); }
  // PowerSgd::snapshot() as a dict (tests, debugging): steps, compressing, elements_per_step,
  // uncompressed_elements, tensors: {name: {rows, cols, rank, error, q}}.
  pyb::dict powerSgdSnapshot() {
    auto* p = dynamic_cast<algo::PowerSgd*>(algo_.get());
    if (p == nullptr) {
      throw std::runtime_error("snapshot(): only powersgd has this state");
    }
    auto s = take(p->snapshot());
    pyb::dict d;
    d["steps"] = s.steps;
    d["compressing"] = s.compressing;
    d["elements_per_step"] = s.elementsPerStep;
    d["uncompressed_elements"] = s.uncompressedElements;
    pyb::dict tensors;
    for (const auto& [name, t] : s.tensors) {
      pyb::dict e;
      e["rows"] = t.rows;
      e["cols"] = t.cols;
      e["rank"] = t.rank;
      e["error"] = t.error;
      e["q"] = t.q;
      tensors[pyb::str(name)] = e;
    }
    d["tensors"] = tensors;
    return d;
  }
  // algorithm="auto": its choice (algorithm "" before it is made).
  pyb::dict decision() {
    auto* a = dynamic_cast<algo::AutoSelect*>(algo_.get());
    if (a == nullptr) {
      throw std::runtime_error("decision(): only the auto algorithm decides");
    }
    return decisionDict(a->decision());
  }
  pyb::dict replicas() {
    auto* lp = dynamic_cast<algo::LowPrecisionDecentralized*>(algo_.get());
    if (lp == nullptr) {
      throw std::runtime_error("replicas(): only low_precision_decentralized has replicas");
    }
    auto r = take(lp->replicas());
    pyb::dict d;
    d["self"] = r.self;
    d["left"] = r.left;
    d["right"] = r.right;
    return d;
  }

 private:
  algo::AsyncModelAverage* async(const char* what) {
    auto* a = dynamic_cast<algo::AsyncModelAverage*>(algo_.get());
    if (a == nullptr) {
      throw std::runtime_error(std::string(what) + "(): only the async algorithm has it");
    }
    return a;
  }
  std::shared_ptr<core::Algorithm> algo_;
};

// Whether this wrap is autotuned: `request` 1 / 0 forces it, -1 follows BAGUA_AUTOTUNE (>= 1).
// Only the all-reduce family is wrapped (the tuner re-reifies the algorithm at each layout
// switch; QAdam's stage and the weight-averaging algorithms keep state or have no gradient
// buckets: Bagua tunes none of them either).
bool autotuneThisWrap(int request, const std::string& algorithm) {
  bool on = request > 0;
  if (request < 0) {
    Result<int64_t> level = autotune::autotuneParams().level.get();
    if (!level.isOk()) {
      throw pyb::value_error(level.status().toString());
    }
    on = *level >= 1;
  }
  return on && (algorithm == "gradient_allreduce" || algorithm == "bytegrad");
}

// An algorithm whose buckets all go through runBucket: launchBucket declined, so the reducer
// runs each bucket's collective to completion, waited for on the host, before the next
// (EngineOptions(launch_without_waiting=False): the comparison point bench/ddp's
// gradient_allreduce_sync measures what launching without waiting gains against).
class RunEveryBucket final : public core::Algorithm {
 public:
  explicit RunEveryBucket(std::shared_ptr<core::Algorithm> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  Result<std::unique_ptr<core::AlgorithmImpl>> reify(core::ProcessGroup& group) override {
    BAGUA_ASSIGN_OR_RETURN(std::unique_ptr<core::AlgorithmImpl> impl, inner_->reify(group));
    return std::unique_ptr<core::AlgorithmImpl>(new Impl(std::move(impl)));
  }

 private:
  using Ddp = core::DistributedDataParallel;
  class Impl final : public core::AlgorithmImpl {
   public:
    explicit Impl(std::unique_ptr<core::AlgorithmImpl> inner) : in_(std::move(inner)) {}
    bool needReset(Ddp& d) override { return in_->needReset(d); }
    std::vector<core::TensorRef> initTensors(Ddp& d) override { return in_->initTensors(d); }
    std::vector<std::vector<int>> tensorsToBuckets(const std::vector<core::TensorRef>& t,
                                                   const core::BucketOptions& o) override {
      return in_->tensorsToBuckets(t, o);
    }
    Status initOperations(core::Bucket& b) override { return in_->initOperations(b); }
    Status runBucket(core::Bucket& b, core::ProcessGroup& g) override {
      return in_->runBucket(b, g);
    }
    bool reducedBucketIsFinal() const override { return in_->reducedBucketIsFinal(); }
    Status onForwardPre(Ddp& d) override { return in_->onForwardPre(d); }
    Status onBackwardReady(Ddp& d, int t) override { return in_->onBackwardReady(d, t); }
    Status onPostBackward(Ddp& d) override { return in_->onPostBackward(d); }
    Status onPostOptimizerStep(Ddp& d) override { return in_->onPostOptimizerStep(d); }
    Result<std::vector<uint8_t>> saveState(Ddp& d) override { return in_->saveState(d); }
    Status restoreState(Ddp& d, std::span<const uint8_t> s) override {
      return in_->restoreState(d, s);
    }

   private:
    std::unique_ptr<core::AlgorithmImpl> in_;
  };
  std::shared_ptr<core::Algorithm> inner_;
};

class PyReducer {
 public:
  PyReducer(pyb::object group, const std::vector<ParamSpec>& params,
            const std::vector<ParamSpec>& buffers, PyAlgorithm& algorithm, PyQAdam* qadam,
            double bucketCapMb, bool findUnused, bool broadcastBuffers, bool rebuildBuckets,
            const std::vector<std::string>& ignore, int64_t firstBucketBytes, uintptr_t cudaStream,
            int autotuneRequest, const std::string& autotuneModel, bool launchWithoutWaiting,
            const std::vector<uintptr_t>& gradHomes, const std::vector<std::vector<size_t>>& shapes)
      : group_(std::move(group)), params_(toParams(params)), buffers_(toParams(buffers)) {
    if (!shapes.empty() && shapes.size() != params_.size()) {
      throw pyb::value_error("Reducer: " + std::to_string(shapes.size()) + " shapes for " +
                             std::to_string(params_.size()) + " parameters");
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      params_[i].shape = shapes[i];  // the tensors' dims, for powersgd's matrices
    }
    if (!gradHomes.empty() && gradHomes.size() != params_.size()) {
      throw pyb::value_error("Reducer: " + std::to_string(gradHomes.size()) +
                             " gradient homes for " + std::to_string(params_.size()) +
                             " parameters");
    }
    for (size_t i = 0; i < gradHomes.size(); ++i) {
      params_[i].gradHome = reinterpret_cast<void*>(gradHomes[i]);
    }
    core::ProcessGroup& pg = groupOf(group_);
    core::DdpOptions o;
    o.bucketCapMb = bucketCapMb;
    if (firstBucketBytes > 0) {
      o.firstBucketBytes = static_cast<size_t>(firstBucketBytes);
    }
    o.gradientAsBucketView = false;  // Python owns the gradients; see the file comment
    o.findUnusedParameters = findUnused;
    o.broadcastBuffers = broadcastBuffers;
    o.rebuildBuckets = rebuildBuckets;
    o.paramsToIgnore = ignore;
    o.cudaStream = reinterpret_cast<CUstream_st*>(cudaStream);
    std::vector<core::Optimizer*> opts;
    if (qadam != nullptr) {
      stateOnly_ = std::make_unique<StateOnlyOptimizer>(qadam->get());
      opts.push_back(stateOnly_.get());
    }
    std::shared_ptr<core::Algorithm> algo = algorithm.get();
    std::shared_ptr<autotune::Tunable> tunable;
    if (autotuneThisWrap(autotuneRequest, algorithm.name())) {
      // BAGUA_AUTOTUNE: the bucket layout (size and order) tuned while training, as Bagua's
      // autotune service does; the with_bagua bucket size is the starting point.
      tunable = std::make_shared<autotune::Tunable>(algo);
      algo = tunable;
    }
    if (!launchWithoutWaiting) {
      algo = std::make_shared<RunEveryBucket>(algo);
    }
    Result<std::unique_ptr<core::DistributedDataParallel>> r =
        BAGUA_ERROR(kInternal, "not created");
    {
      pyb::gil_scoped_release nogil;
      r = core::withBagua(params_, buffers_, opts, algo, pg, o);
    }
    ddp_ = take(std::move(r));
    if (tunable) {
      autotune::AutotuneOptions ao;
      ao.model = autotuneModel.empty() ? "with_bagua" : autotuneModel;
      ao.enabled = true;
      Result<std::unique_ptr<autotune::Autotuner>> t = BAGUA_ERROR(kInternal, "not created");
      {
        pyb::gil_scoped_release nogil;
        t = autotune::Autotuner::create(*ddp_, *tunable, ao);
      }
      tuner_ = take(std::move(t));
    }
  }
  ~PyReducer() {
    pyb::gil_scoped_release nogil;
    noSync_.reset();
    tuner_.reset();
    ddp_.reset();
  }
  PyReducer(const PyReducer&) = delete;
  PyReducer& operator=(const PyReducer&) = delete;

  void setGrad(int i, uintptr_t grad) {
    if (i < 0 || i >= static_cast<int>(params_.size())) {
      throw pyb::index_error("set_grad: parameter index out of range");
    }
    params_[i].grad = reinterpret_cast<void*>(grad);
  }
  // Every parameter's gradient pointer at once (one call per step instead of one per tensor).
  void setGrads(const std::vector<uintptr_t>& grads) {
    if (grads.size() != params_.size()) {
      throw pyb::value_error("set_grads: " + std::to_string(grads.size()) + " pointers for " +
                             std::to_string(params_.size()) + " parameters");
    }
    for (size_t i = 0; i < grads.size(); ++i) {
      params_[i].grad = reinterpret_cast<void*>(grads[i]);
    }
  }
  // The autograd hook's one call: the gradient's current pointer, then markGradReady.
  void markReady(int i, uintptr_t grad) {
    setGrad(i, grad);
    markGradReady(i);
  }
  template <typename F>
  void run(F&& f) {
    Status s;
    {
      pyb::gil_scoped_release nogil;
      s = f();
    }
    check(s);
  }
  void prepareForward() {
    run([&] { return ddp_->prepareForward(); });
  }
  void markGradReady(int i) {
    run([&] { return ddp_->markGradReady(i); });
  }
  void finishBackward() {
    run([&] { return ddp_->finishBackward(); });
  }
  void step() {
    run([&] {
      BAGUA_RETURN_IF_ERROR(ddp_->step());
      return tuner_ ? tuner_->onIterationEnd() : Status::ok();
    });
  }
  // The tuner's state for tests and logs: (tuning, skipped, switch steps, current bucket bytes);
  // None without autotuning.
  pyb::object autotuneState() const {
    if (!tuner_) {
      return pyb::none();
    }
    return pyb::make_tuple(tuner_->tuning(), tuner_->skipped(), tuner_->switchSteps(),
                           tuner_->current().bucketBytes);
  }
  void setNoSync(bool on) {
    if (on && !noSync_) {
      noSync_ = std::make_unique<core::DistributedDataParallel::NoSyncGuard>(ddp_.get());
    } else if (!on) {
      noSync_.reset();
    }
  }
  // Indices of the parameters whose gradients the reducer communicates.
  std::vector<int> communicated() const {
    std::vector<int> out;
    for (const auto& t : ddp_->tensors()) {
      out.push_back(t.paramIndex);
    }
    return out;
  }
  core::DistributedDataParallel& ddp() { return *ddp_; }

 private:
  pyb::object group_;  // keeps the process group alive
  std::vector<Parameter> params_;
  std::vector<Parameter> buffers_;
  std::unique_ptr<StateOnlyOptimizer> stateOnly_;
  std::unique_ptr<core::DistributedDataParallel> ddp_;
  std::unique_ptr<autotune::Autotuner> tuner_;  // BAGUA_AUTOTUNE only; destroyed before ddp_
  std::unique_ptr<core::DistributedDataParallel::NoSyncGuard> noSync_;
};

using ReducerClass = pyb::class_<PyReducer>;

// QAdamOptimizer, Algorithm, algorithm_names and auto_choose.
void bindOptimizerAndAlgorithms(pyb::module_& m) {
  pyb::class_<PyQAdam>(m, "QAdamOptimizer")
      .def(pyb::init<const std::vector<ParamSpec>&, float, int, float, float, float, float, bool>(),
           pyb::arg("params"), pyb::arg("lr"), pyb::arg("warmup_steps"), pyb::arg("beta1"),
           pyb::arg("beta2"), pyb::arg("eps"), pyb::arg("weight_decay"),
           pyb::arg("hold_zero_variance") = true)
      .def("set_pointers", &PyQAdam::setPointers)
      .def("step", &PyQAdam::step)
      .def_property_readonly("step_count", &PyQAdam::stepCount)
      .def_property_readonly("hold_zero_variance", &PyQAdam::holdZeroVariance)
      .def("state", &PyQAdam::state, pyb::arg("index"), pyb::arg("second"))
      .def("state_ptr", &PyQAdam::statePtr, pyb::arg("index"), pyb::arg("second"))
      .def("set_state", &PyQAdam::setState, pyb::arg("index"), pyb::arg("second"),
           pyb::arg("data"));

  pyb::class_<PyAlgorithm>(m, "Algorithm")
      .def(pyb::init<const std::string&, const std::map<std::string, std::string>&, PyQAdam*>(),
           pyb::arg("name"), pyb::arg("args"), pyb::arg("qadam") = nullptr, pyb::keep_alive<1, 4>())
      .def_property_readonly("name", &PyAlgorithm::name)
      .def("abort", &PyAlgorithm::abort)
      .def("resume", &PyAlgorithm::resume)
      .def("rounds", &PyAlgorithm::rounds)
      .def("replicas", &PyAlgorithm::replicas)
      .def("powersgd_snapshot", &PyAlgorithm::powerSgdSnapshot)
      .def("decision", &PyAlgorithm::decision);
  m.def("algorithm_names", [] { return algo::algorithmNames(); });
  m.def("auto_choose", &autoChoose, pyb::arg("world_size"), pyb::arg("buckets"),
        pyb::arg("compute_s"), pyb::arg("allreduce_step_s"), pyb::arg("latency_s"),
        pyb::arg("bandwidth"), pyb::arg("codec") = algo::kAutoDeviceCodecBytesPerSecond,
        pyb::arg("registered") = std::vector<std::string>{}, pyb::arg("hierarchical") = false,
        pyb::arg("element_bytes") = 4, pyb::arg("all_f32") = true);
}

// The Reducer class: its constructor and the calls of each training step.
ReducerClass bindReducerTraining(pyb::module_& m) {
  ReducerClass reducer(m, "Reducer");
  reducer
      .def(
          pyb::init<pyb::object, const std::vector<ParamSpec>&, const std::vector<ParamSpec>&,
                    PyAlgorithm&, PyQAdam*, double, bool, bool, bool,
                    const std::vector<std::string>&, int64_t, uintptr_t, int, const std::string&,
                    bool, const std::vector<uintptr_t>&, const std::vector<std::vector<size_t>>&>(),
          pyb::arg("group"), pyb::arg("params"), pyb::arg("buffers"), pyb::arg("algorithm"),
          pyb::arg("qadam"), pyb::arg("bucket_cap_mb"), pyb::arg("find_unused_parameters"),
          pyb::arg("broadcast_buffers"), pyb::arg("rebuild_buckets"), pyb::arg("ignore"),
          pyb::arg("first_bucket_bytes") = 0, pyb::arg("cuda_stream") = 0,
          pyb::arg("autotune") = -1, pyb::arg("autotune_model") = "",
          pyb::arg("launch_without_waiting") = true,
          pyb::arg("grad_homes") = std::vector<uintptr_t>{},
          pyb::arg("shapes") = std::vector<std::vector<size_t>>{}, pyb::keep_alive<1, 5>(),
          pyb::keep_alive<1, 6>())
      .def("set_grad", &PyReducer::setGrad)
      .def("set_grads", &PyReducer::setGrads)
      .def("mark_ready", &PyReducer::markReady)
      .def("prepare_forward", &PyReducer::prepareForward)
      .def("mark_grad_ready", &PyReducer::markGradReady)
      .def("finish_backward", &PyReducer::finishBackward)
      .def("step", &PyReducer::step)
      .def("set_no_sync", &PyReducer::setNoSync)
      .def("communicated", &PyReducer::communicated);
  return reducer;
}

// Reducer's bucket layout, exact-resume schedule, gradient homes and layout counters.
void bindReducerLayoutAndSchedule(ReducerClass& reducer) {
  reducer.def("bucket_layout", [](PyReducer& r) { return r.ddp().bucketLayout(); })
      .def_property_readonly("train_step", [](PyReducer& r) { return r.ddp().trainStep(); })
      // Exact resume: the step counter and the algorithm's state, as bytes.
      .def("save_schedule",
           [](PyReducer& r) {
             std::vector<uint8_t> b = take(r.ddp().saveSchedule());
             return pyb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
           })
      .def(
          "restore_schedule",
          [](PyReducer& r, const pyb::bytes& state, bool counterOnly) {
            std::string_view v = state;
            check(r.ddp().restoreSchedule(
                std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size()),
                counterOnly));
          },
          pyb::arg("state"), pyb::arg("counter_only") = false)
      .def("set_grad_homes",
           [](PyReducer& r, const std::vector<uintptr_t>& homes) {
             std::vector<void*> h;
             for (uintptr_t a : homes) {
               h.push_back(reinterpret_cast<void*>(a));
             }
             Status s;
             {
               pyb::gil_scoped_release nogil;
               s = r.ddp().setGradHomes(h);
             }
             check(s);
           })
      .def_property_readonly("layout_generation",
                             [](PyReducer& r) { return r.ddp().layoutGeneration(); })
      .def_property_readonly("buckets_in_place",
                             [](PyReducer& r) {
                               int n = 0;
                               for (const core::Bucket& b : r.ddp().buckets()) {
                                 n += b.inPlace ? 1 : 0;
                               }
                               return n;
                             })
      .def_property_readonly("buckets_rebuilt",
                             [](PyReducer& r) { return r.ddp().bucketsRebuilt(); });
}

// Reducer's autotune state and statistics.
void bindReducerStats(ReducerClass& reducer) {
  reducer.def_property_readonly("autotune_state", &PyReducer::autotuneState)
      .def("stats",
           [](PyReducer& r) {
             const core::DdpStats st = r.ddp().stats();
             pyb::dict d;
             d["iterations"] = st.iterations;
             d["mark_ns"] = st.markNs;
             d["finish_wait_ns"] = st.finishWaitNs;
             d["copy_out_ns"] = st.copyOutNs;
             d["buckets"] = st.buckets;
             d["bucket_wait_ns"] = st.bucketWaitNs;
             d["bucket_run_ns"] = st.bucketRunNs;
             d["bucket_queue_ns"] = st.bucketQueueNs;
             d["step_ns"] = st.stepNs;
             d["buckets_stepped"] = st.bucketsStepped;
             return d;
           })
      .def("reset_stats", [](PyReducer& r) { r.ddp().resetStats(); });
}

// Reducer's calls for stepping inside the backward pass (core/include/bagua/core/ddp.h).
void bindReducerStepInBackward(ReducerClass& reducer) {
  reducer.def("buckets_reduced", [](PyReducer& r) { return r.ddp().bucketsReduced(); })
      .def("wait_bucket_reduced",
           [](PyReducer& r, int bucket) {
             r.run([&] { return r.ddp().waitBucketReduced(bucket); });
           })
      .def("mark_unused_ready",
           [](PyReducer& r) { r.run([&] { return r.ddp().markUnusedReady(); }); })
      .def("copy_bucket_out_on",
           [](PyReducer& r, int bucket, uintptr_t stream) {
             r.run([&] {
               return r.ddp().copyBucketOutOn(bucket, reinterpret_cast<CUstream_st*>(stream));
             });
           })
      .def("order_after_reduction",
           [](PyReducer& r, uintptr_t stream) {
             r.run([&] {
               return r.ddp().orderAfterReduction(reinterpret_cast<CUstream_st*>(stream));
             });
           })
      .def("bucket_in_place",
           [](PyReducer& r, int bucket) {
             const auto& b = r.ddp().buckets();
             if (bucket < 0 || bucket >= static_cast<int>(b.size())) {
               throw pyb::index_error("bucket_in_place: bucket index out of range");
             }
             return b[static_cast<size_t>(bucket)].inPlace;
           })
      .def("bucket_params", [](PyReducer& r) {
        // Per bucket, the indices (into the parameter list) of its tensors, in bucket order.
        core::DistributedDataParallel& d = r.ddp();
        std::vector<std::vector<int>> out;
        for (const core::Bucket& b : d.buckets()) {
          out.emplace_back();
          for (int t : b.tensors) {
            out.back().push_back(d.tensors()[static_cast<size_t>(t)].paramIndex);
          }
        }
        return out;
      });
}

}  // namespace

core::DistributedDataParallel& reducerOf(const pyb::object& reducer) {
  if (!pyb::isinstance<PyReducer>(reducer)) {
    throw pyb::type_error("expected a _bagua_ext.Reducer");
  }
  return reducer.cast<PyReducer&>().ddp();
}

void bindDdp(pyb::module_& m) {
  bindOptimizerAndAlgorithms(m);
  ReducerClass reducer = bindReducerTraining(m);
  bindReducerLayoutAndSchedule(reducer);
  bindReducerStats(reducer);
  bindReducerStepInBackward(reducer);
}

}  // namespace bagua::py
