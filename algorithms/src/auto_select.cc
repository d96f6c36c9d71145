#include "bagua/algorithms/auto_select.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "bagua/algorithms/compression.h"
#include "bagua/base/logging.h"
#include "bagua/core/ddp.h"
#include "vec_ops.h"

namespace bagua::algo {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

double median(std::vector<double> v) {
  if (v.empty()) {
    return 0;
  }
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

bool contains(const std::vector<std::string>& names, const std::string& n) {
  return std::find(names.begin(), names.end(), n) != names.end();
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) {
    out += (out.empty() ? "" : ", ") + n;
  }
  return out;
}

std::string argsText(const AlgorithmArgs& args) {
  std::string out;
  for (const auto& [k, v] : args) {
    out += (out.empty() ? "" : ", ") + k + "=" + v;
  }
  return out;
}

// PowerSGD's payload of one tensor in elements. Tensors are seen as near-square matrices (the
// reducer knows element counts, not shapes): side sqrt(n), factors of 2 sqrt(n) r elements,
// compressed only where that saves at least half (torch's min_compression_rate 2).
double lowRankElements(size_t numel, int rank) {
  const double side = std::sqrt(static_cast<double>(numel));
  const double factors = 2.0 * side * rank;
  return factors * 2.0 < static_cast<double>(numel) ? factors : static_cast<double>(numel);
}

double ms(double s) {
  return s * 1e3;
}

// The figures one rank measured, as text for the store (hex floats: exact).
// busy: the bucket thread's collective seconds a timed step; spread: the slowest timed step over
// the fastest.
struct Figures {
  double compute = 0, allReduceStep = 0, latency = 0, bandwidth = 0, codec = 0, busy = 0,
         spread = 1;
};

std::string encode(const Figures& f) {
  char buf[384];
  std::snprintf(buf, sizeof(buf), "%a %a %a %a %a %a %a", f.compute, f.allReduceStep, f.latency,
                f.bandwidth, f.codec, f.busy, f.spread);
  return buf;
}

Result<Figures> decode(const std::string& s) {
  Figures f;
  char* p = const_cast<char*>(s.c_str());
  double* out[] = {&f.compute, &f.allReduceStep, &f.latency, &f.bandwidth,
                   &f.codec,   &f.busy,          &f.spread};
  for (double* o : out) {
    char* end = nullptr;
    *o = std::strtod(p, &end);
    if (end == p) {
      return BAGUA_ERROR(kInternal, "auto: damaged figures in the store: '%s'", s.c_str());
    }
    p = end;
  }
  return f;
}

// Every rank publishes its figures through the group's store under "bagua-auto/<group>/<key>";
// rank 0 combines them (the slowest rank's times, the slowest link, the slowest codec, the widest
// spread) and publishes that; every rank returns the combined figures, so every rank then runs
// the same rule on the same numbers. Each wait: the collective timeout, at least 1 s.
Result<Figures> exchange(core::ProcessGroup& group, const std::string& key, const Figures& mine) {
  std::shared_ptr<core::Store> store = group.store();
  if (!store) {
    return BAGUA_ERROR(kFailedPrecondition, "the process group has no store");
  }
  const int rank = group.rank();
  const auto wait = std::max(group.options().collectiveTimeout, std::chrono::milliseconds(1000));
  const std::string prefix = "bagua-auto/" + group.options().name + "/" + key;
  BAGUA_RETURN_IF_ERROR(
      store->set(prefix + "rank" + std::to_string(rank), core::toBytes(encode(mine))));
  if (rank != 0) {
    BAGUA_ASSIGN_OR_RETURN(core::Bytes got, store->get(prefix + "combined", wait));
    return decode(core::toString(got));
  }
  Figures f = mine;
  for (int r = 1; r < group.size(); ++r) {
    BAGUA_ASSIGN_OR_RETURN(core::Bytes got, store->get(prefix + "rank" + std::to_string(r), wait));
    BAGUA_ASSIGN_OR_RETURN(Figures o, decode(core::toString(got)));
    f.compute = std::max(f.compute, o.compute);
    f.allReduceStep = std::max(f.allReduceStep, o.allReduceStep);
    f.latency = std::max(f.latency, o.latency);
    f.bandwidth = std::min(f.bandwidth, o.bandwidth);
    f.codec = std::min(f.codec, o.codec);
    f.busy = std::max(f.busy, o.busy);
    f.spread = std::max(f.spread, o.spread);
  }
  BAGUA_RETURN_IF_ERROR(store->set(prefix + "combined", core::toBytes(encode(f))));
  return f;
}

AutoInputs withFigures(AutoInputs in, const Figures& f) {
  in.computeSeconds = f.compute;
  in.allReduceStepSeconds = f.allReduceStep;
  in.link = {f.latency, f.bandwidth};
  in.codecBytesPerSecond = f.codec;
  return in;
}

// The algorithms' hierarchical mode where the group spans several nodes of several ranks.
bool isHierarchical(core::ProcessGroup& group) {
  return group.intraNode() != nullptr && group.numNodes() > 1 && group.localSize() > 1;
}

AlgorithmArgs flatOrHierarchical(core::ProcessGroup& group) {
  return {{"hierarchical", isHierarchical(group) ? "true" : "false"}};
}

}  // namespace

const std::vector<std::string>& autoCandidateNames() {
  static const std::vector<std::string> names = {"gradient_allreduce", "bytegrad", "powersgd"};
  return names;
}

Result<LinkModel> fitLink(const std::vector<LinkSample>& samples) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const LinkSample& s : samples) {
    if (s.bytes > 0 && s.seconds > 0) {
      n += 1;
      sx += s.bytes;
      sy += s.seconds;
      sxx += s.bytes * s.bytes;
      sxy += s.bytes * s.seconds;
    }
  }
  if (n == 0) {
    return BAGUA_ERROR(kInvalidArgument, "auto: no timed all-reduce to fit the link to");
  }
  const double var = sxx / n - (sx / n) * (sx / n);
  if (n >= 2 && var > 1e-12 * (sxx / n)) {
    const double slope = (sxy / n - (sx / n) * (sy / n)) / var;
    const double latency = sy / n - slope * sx / n;
    if (slope > 0 && latency >= 0) {
      return LinkModel{latency, 1.0 / slope};
    }
  }
  // Through the origin: every second is bandwidth.
  return LinkModel{0.0, sxx / sxy};
}

namespace {

// Every candidate's predicted step: its collectives' latency and bytes over the fitted link,
// its codec time, less what the backward pass hides (`hidden` seconds); in order of exactness,
// gradient all-reduce first.
std::vector<AutoCandidate> predictCandidates(const AutoInputs& in, double gradBytes,
                                             double hidden) {
  const double eb = static_cast<double>(in.elementBytes);
  const double alpha = in.link.latencySeconds;
  const double beta = in.link.bytesPerSecond;
  const double nb = static_cast<double>(in.buckets.size());
  const double compute = in.computeSeconds;
  const std::string hier = in.hierarchical ? "true" : "false";

  std::vector<AutoCandidate> cands;
  auto add = [&](std::string label, std::string algorithm, AlgorithmArgs args, double wire,
                 double collectivesPerBucket, double codecSeconds, double stepsFactor) {
    AutoCandidate c;
    c.label = std::move(label);
    c.algorithm = std::move(algorithm);
    c.args = std::move(args);
    c.wireBytes = wire;
    c.workSeconds = nb * collectivesPerBucket * alpha + wire / beta + codecSeconds;
    c.exposedSeconds = std::max(0.0, c.workSeconds - hidden);
    c.stepSeconds = compute + c.exposedSeconds;
    c.stepsFactor = stepsFactor;
    c.score = stepsFactor * c.stepSeconds;
    c.registered = in.registered.empty() || contains(in.registered, c.algorithm);
    cands.push_back(std::move(c));
  };
  add("gradient_allreduce", "gradient_allreduce", {{"hierarchical", hier}}, gradBytes, 1, 0, 1.0);
  const double codec = 2.0 * gradBytes / in.codecBytesPerSecond;
  if (in.allF32) {
    // Scatter-reduce and all-gather of a quarter of the bytes: two collectives per bucket.
    add("bytegrad", "bytegrad", {{"hierarchical", hier}}, gradBytes / 4, 2, codec,
        kAutoStepsFactorByteGrad);
  }
  // Rank 16 with 8-bit factors (quantize_factors): about rank 4's bytes for a quarter of the
  // approximation error. The tensors it leaves uncompressed go in full precision in a collective
  // of their own, P and Q each through ByteGrad's two: five collectives per bucket. Its
  // orthogonalisation, quadratic in the rank, is not in the prediction (hence no higher rank).
  {
    double wire = 0;
    for (const auto& b : in.buckets) {
      for (size_t n : b) {
        const double e = lowRankElements(n, kAutoQuantizedRank);
        wire += e < static_cast<double>(n) ? e : e * eb;
      }
    }
    add("powersgd rank 16, 8-bit factors", "powersgd",
        {{"rank", std::to_string(kAutoQuantizedRank)}, {"quantize_factors", "true"}}, wire, 5,
        codec, kAutoStepsFactorPowerSgdRank16Q8);
  }
  for (int rank : {4, 1}) {
    double elems = 0;
    for (const auto& b : in.buckets) {
      for (size_t n : b) {
        elems += lowRankElements(n, rank);
      }
    }
    // P with the uncompressed tensors, then Q: two dependent collectives per bucket; the
    // factor products and the error feedback pass over the gradient about as often as the
    // codec does.
    add("powersgd rank " + std::to_string(rank), "powersgd", {{"rank", std::to_string(rank)}},
        elems * eb, 2, codec,
        rank == 4 ? kAutoStepsFactorPowerSgdRank4 : kAutoStepsFactorPowerSgdRank1);
  }

  return cands;
}

}  // namespace

Result<AutoDecision> chooseAlgorithm(const AutoInputs& in) {
  if (in.buckets.empty()) {
    return BAGUA_ERROR(kInvalidArgument, "auto: no gradient bucket to decide for");
  }
  if (!(in.computeSeconds > 0) || !(in.allReduceStepSeconds > 0) || !(in.link.bytesPerSecond > 0) ||
      !(in.link.latencySeconds >= 0) || !(in.codecBytesPerSecond > 0) || in.worldSize < 1) {
    return BAGUA_ERROR(kInvalidArgument,
                       "auto: measurements out of range (compute %g s, all-reduce step %g s, "
                       "latency %g s, bandwidth %g B/s, codec %g B/s, %d ranks)",
                       in.computeSeconds, in.allReduceStepSeconds, in.link.latencySeconds,
                       in.link.bytesPerSecond, in.codecBytesPerSecond, in.worldSize);
  }
  const double eb = static_cast<double>(in.elementBytes);
  const double alpha = in.link.latencySeconds;
  const double beta = in.link.bytesPerSecond;
  double gradBytes = 0;
  for (const auto& b : in.buckets) {
    for (size_t n : b) {
      gradBytes += static_cast<double>(n) * eb;
    }
  }
  const double nb = static_cast<double>(in.buckets.size());
  const double compute = in.computeSeconds;
  // Gradient all-reduce's work and how much of it the measured step showed to be hidden.
  const double allReduceWork = nb * alpha + gradBytes / beta;
  const double exposedAllReduce = std::max(0.0, in.allReduceStepSeconds - compute);
  // All-reduce fully hidden: the window is at least its work; taken as the larger of that and
  // kAutoHiddenShare of the compute-only step, at most the whole step.
  const double hidden =
      exposedAllReduce > 0 ? std::clamp(allReduceWork - exposedAllReduce, 0.0, compute)
                           : std::min(std::max(allReduceWork, kAutoHiddenShare * compute), compute);
  std::vector<AutoCandidate> cands = predictCandidates(in, gradBytes, hidden);
  const AutoCandidate& allReduce = cands.front();
  const AutoCandidate* best = &allReduce;
  std::vector<std::string> skipped;
  for (const AutoCandidate& c : cands) {
    if (!c.registered) {
      if (!contains(skipped, c.algorithm)) {
        skipped.push_back(c.algorithm);
      }
      continue;
    }
    if (c.score < best->score) {
      best = &c;
    }
  }
  // The best unregistered candidate, if it would have won: said in the reason.
  const AutoCandidate* wouldWin = nullptr;
  for (const AutoCandidate& c : cands) {
    if (!c.registered && c.score < best->score && (!wouldWin || c.score < wouldWin->score)) {
      wouldWin = &c;
    }
  }

  const double fraction = exposedAllReduce / in.allReduceStepSeconds;
  std::string why = strPrintf(
      "gradient_allreduce: %.1f ms a step, %.0f%% of it exposed communication (compute %.1f ms; "
      "%.2f MB of gradients in %zu bucket(s); all-reduce %.3g GB/s + %.3f ms a collective)",
      ms(in.allReduceStepSeconds), 100 * fraction, ms(compute), gradBytes / 1e6, in.buckets.size(),
      beta / 1e9, ms(alpha));
  const AutoCandidate* pick = &allReduce;
  if (best != &allReduce) {
    const double ratio = best->score / allReduce.score;
    if (ratio < 1.0 - kAutoMinGain) {
      // The most exact candidate within the minimum gain of the best (candidates are in
      // order of exactness): a less exact one must earn its loss of accuracy per step.
      for (const AutoCandidate& c : cands) {
        if (c.registered && &c != &allReduce && best->score >= (1.0 - kAutoMinGain) * c.score) {
          pick = &c;
          break;
        }
      }
      why += strPrintf(
          "; %s: predicted %.1f ms a step x %.2f steps = %.2f of gradient_allreduce's "
          "time to accuracy",
          pick->label.c_str(), ms(pick->stepSeconds), pick->stepsFactor,
          pick->score / allReduce.score);
      if (pick != best) {
        why += strPrintf(
            "; %s, predicted at %.2f of its time (needs < %.2f), does not replace the more "
            "exact %s",
            best->label.c_str(), best->score / pick->score, 1.0 - kAutoMinGain,
            pick->label.c_str());
      }
    } else {
      why += strPrintf(
          "; best other, %s, predicted at %.2f of its time to accuracy (needs < %.2f): "
          "exact all-reduce kept",
          best->label.c_str(), ratio, 1.0 - kAutoMinGain);
    }
  } else {
    why += "; no other candidate predicted faster";
  }
  if (wouldWin != nullptr) {
    why += strPrintf(
        "; %s (predicted %.2f of gradient_allreduce's time) is not registered in this "
        "build: fell back to %s",
        wouldWin->label.c_str(), wouldWin->score / allReduce.score, pick->label.c_str());
  } else if (!skipped.empty()) {
    why += "; not registered in this build: " + joined(skipped);
  }
  AutoDecision d;
  d.algorithm = pick->algorithm;
  d.args = pick->args;
  d.reason = "chose " + pick->label + " (" + argsText(pick->args) + "): " + why;
  d.candidates = std::move(cands);
  return d;
}

Result<std::optional<AutoDecision>> chooseEarly(const AutoInputs& in, double busySeconds) {
  const double step = in.allReduceStepSeconds;
  if (!(step > 0) || !(busySeconds >= 0)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "auto: measurements out of range (all-reduce step %g s, busy %g s)", step,
                       busySeconds);
  }
  // No compute can hide more than the collectives took, and none is negative.
  const double lo = std::max(step - busySeconds, kAutoEarlyComputeFloor * step);
  const double hi = step;
  std::optional<AutoDecision> mid;
  std::string first;
  for (int i = 0; i < kAutoEarlyPoints; ++i) {
    AutoInputs at = in;
    at.computeSeconds = lo + (hi - lo) * i / (kAutoEarlyPoints - 1);
    BAGUA_ASSIGN_OR_RETURN(AutoDecision d, chooseAlgorithm(at));
    const std::string key = d.algorithm + "(" + argsText(d.args) + ")";
    if (i == 0) {
      first = key;
    } else if (key != first) {
      return std::optional<AutoDecision>();
    }
    if (i == kAutoEarlyPoints / 2) {
      mid = std::move(d);
    }
  }
  mid->reason += strPrintf(
      "; the same choice for any compute time from %.1f to %.1f ms (all-reduce busy %.1f ms a "
      "step): no compute-only step needed",
      ms(lo), ms(hi), ms(busySeconds));
  return mid;
}

// ---- The probing implementation -----------------------------------------------------------------

class AutoProbeImpl final : public core::AlgorithmImpl {
 public:
  AutoProbeImpl(AutoSelect* owner, int probeSteps, bool hierarchical, int64_t seq)
      : owner_(owner),
        seq_(seq),
        probe_(probeSteps),
        localTarget_(std::max(1, probeSteps / 2)),
        hierarchical_(hierarchical) {}

  // Called at every prepareForward, before the forward pre-hook: the step boundary. Every rank
  // takes the same path (the early check's outcome comes from the same combined figures).
  bool needReset(core::DistributedDataParallel& ddp) override {
    const Clock::time_point now = Clock::now();
    if (step_ > 0) {
      const double d = seconds(now - last_);
      if (phase_ == kTimed) {
        timed_.push_back(d);
      } else if (phase_ == kLocal) {
        localSteps_.push_back(d);
      }
    }
    last_ = now;
    if (decided_) {
      return false;
    }
    ++step_;  // the step about to run
    const int done = step_ - 1;
    if (phase_ == kWarm && step_ > kWarmSteps) {
      phase_ = kTimed;
    } else if (phase_ == kTimed) {
      const int timed = static_cast<int>(timed_.size());
      if (!checked_ && timed >= std::min(kEarlySteps, probe_)) {
        checked_ = true;
        const AutoSelect::Early e =
            owner_->checkEarly(ddp, inputs(ddp), busyPerStep(), spread(), seq_, done);
        if (e == AutoSelect::Early::kDecided) {
          return finish();
        }
        if (e == AutoSelect::Early::kSettled) {
          localTarget_ = 1;
          phase_ = kLocal;
        }
      }
      if (timed >= probe_) {
        phase_ = kLocal;
      }
    } else if (phase_ == kLocal && static_cast<int>(localSteps_.size()) >= localTarget_) {
      owner_->decide(ddp, inputs(ddp), seq_, done);
      return finish();
    }
    bucketPhase_.store(phase_, std::memory_order_release);
    return false;
  }

  Status runBucket(core::Bucket& b, core::ProcessGroup& g) override {
    const int p = bucketPhase_.load(std::memory_order_acquire);
    const auto timeout = g.options().collectiveTimeout;
    if (p == kLocal) {
      // The compute-only steps: no communication, and a zero gradient on every rank, so the
      // ranks (weights and optimizer state alike) stay identical.
      BAGUA_ASSIGN_OR_RETURN(detail::Exec exec, detail::execFor(b.device, "auto"));
      BAGUA_RETURN_IF_ERROR(detail::zeroBytes(exec, b.flat, b.bytes()));
      return detail::sync(exec, timeout);
    }
    const Clock::time_point t0 = Clock::now();
    BAGUA_RETURN_IF_ERROR(core::allReduceBucket(b, g, hierarchical_, /*average=*/true));
    const double t = seconds(Clock::now() - t0);
    if (p == kTimed) {
      std::lock_guard<std::mutex> lock(mu_);
      samples_.push_back({static_cast<double>(b.bytes()), t});
    } else if (b.dtype == core::DataType::kF32 && b.bytes() > codecBytes_) {
      // Warm-up steps: the codec's rate on the largest bucket, where the gradients live.
      BAGUA_RETURN_IF_ERROR(timeCodec(b, timeout));
    }
    return Status::ok();
  }

 private:
  enum Phase : int { kWarm = 0, kTimed = 1, kLocal = 2 };
  static constexpr int kWarmSteps = 2;
  // Timed steps before the early check (fewer where probe_steps is smaller).
  static constexpr int kEarlySteps = 2;

  bool finish() {
    decided_ = true;
    return true;  // the reducer resets: broadcast, then AutoSelect::reify gives the choice
  }

  // The bucket thread's collective seconds per timed step.
  double busyPerStep() {
    std::lock_guard<std::mutex> lock(mu_);
    double total = 0;
    for (const LinkSample& x : samples_) {
      total += x.seconds;
    }
    return timed_.empty() ? 0 : total / static_cast<double>(timed_.size());
  }

  double spread() const {
    const auto [lo, hi] = std::minmax_element(timed_.begin(), timed_.end());
    return timed_.empty() || !(*lo > 0) ? 1.0 : *hi / *lo;
  }

  // MinMaxUInt8 compress + decompress of the bucket into scratch memory on its device (the
  // gradients are left alone), timed to the end of the device work: bytes per second.
  Status timeCodec(core::Bucket& b, std::chrono::milliseconds timeout) {
    BAGUA_ASSIGN_OR_RETURN(detail::Exec exec, detail::execFor(b.device, "auto"));
    const size_t packed = minMaxCompressedBytes(b.numel, 1);
    detail::Buffer dst, back, workspace;
    BAGUA_RETURN_IF_ERROR(dst.ensure(exec, packed));
    BAGUA_RETURN_IF_ERROR(back.ensure(exec, b.bytes()));
    BAGUA_RETURN_IF_ERROR(detail::sync(exec, timeout));
    const Clock::time_point t0 = Clock::now();
    BAGUA_RETURN_IF_ERROR(detail::compress(exec, static_cast<const float*>(b.flat), b.numel, 1,
                                           dst.u8(), packed, workspace));
    BAGUA_RETURN_IF_ERROR(detail::decompress(exec, dst.u8(), packed, b.numel, 1, back.f32()));
    BAGUA_RETURN_IF_ERROR(detail::sync(exec, timeout));
    const double t = seconds(Clock::now() - t0);
    std::lock_guard<std::mutex> lock(mu_);
    codecBytes_ = b.bytes();
    codecRate_ = t > 0 ? static_cast<double>(b.bytes()) / t : 0;
    return Status::ok();
  }

  AutoInputs inputs(core::DistributedDataParallel& ddp) {
    AutoInputs in;
    in.worldSize = ddp.group().size();
    in.hierarchical = hierarchical_;
    bool onHost = true;
    for (const core::Bucket& b : ddp.buckets()) {
      std::vector<size_t> elems;
      for (int t : b.tensors) {
        elems.push_back(ddp.tensors()[t].numel);
      }
      in.buckets.push_back(std::move(elems));
      in.allF32 = in.allF32 && b.dtype == core::DataType::kF32;
      onHost = onHost && b.device.type == core::DeviceType::kCpu;
      in.elementBytes = core::dataTypeSize(b.dtype);
    }
    in.computeSeconds = median(localSteps_);
    in.allReduceStepSeconds = median(timed_);
    std::lock_guard<std::mutex> lock(mu_);
    Result<LinkModel> link = fitLink(samples_);
    in.link = link.isOk() ? *link : LinkModel{};
    // Not measured (no f32 bucket): the device figure, or 2 GB/s for one host core.
    in.codecBytesPerSecond = codecRate_ > 0 ? codecRate_
                             : onHost       ? 2e9
                                            : kAutoDeviceCodecBytesPerSecond;
    in.registered = algorithmNames();
    return in;
  }

  AutoSelect* owner_;  // the Algorithm outlives its implementations (the reducer holds both)
  const int64_t seq_;  // this probe's number among the group's, the same on every rank
  const int probe_;
  int localTarget_;
  const bool hierarchical_;
  // Trainer thread.
  int step_ = 0;
  Phase phase_ = kWarm;
  bool checked_ = false;
  bool decided_ = false;
  Clock::time_point last_;
  std::vector<double> timed_;
  std::vector<double> localSteps_;
  // The phase the bucket thread sees (set at the step boundary).
  std::atomic<int> bucketPhase_{kWarm};
  // samples_, codec*_: the bucket thread writes, the trainer thread reads between steps.
  std::mutex mu_;
  std::vector<LinkSample> samples_;
  size_t codecBytes_ = 0;
  double codecRate_ = 0;
};

// ---- AutoSelect ---------------------------------------------------------------------------------

Result<std::shared_ptr<AutoSelect>> AutoSelect::create(const std::string& pin,
                                                       const std::string& pinSource, int probeSteps,
                                                       int startIter) {
  if (!pin.empty() && !contains(autoCandidateNames(), pin)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "auto: %s='%s' is not an algorithm auto can pin (one of: %s); unset it to "
                       "let auto choose",
                       pinSource.c_str(), pin.c_str(), joined(autoCandidateNames()).c_str());
  }
  if (!pin.empty() && !contains(algorithmNames(), pin)) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "auto: %s='%s' is not registered in this build (registered: %s)",
                       pinSource.c_str(), pin.c_str(), joined(algorithmNames()).c_str());
  }
  if (probeSteps < 1) {
    return BAGUA_ERROR(kInvalidArgument, "auto: probe_steps=%d must be >= 1", probeSteps);
  }
  if (startIter < -1) {
    return BAGUA_ERROR(kInvalidArgument, "auto: start_iter=%d must be >= 0", startIter);
  }
  std::shared_ptr<AutoSelect> a(new AutoSelect(pin, probeSteps, startIter));
  if (!pin.empty()) {
    a->decision_.algorithm = pin;
    a->decision_.reason = "pinned to " + pin + " by " + pinSource;
  }
  return a;
}

Result<std::unique_ptr<core::AlgorithmImpl>> AutoSelect::reify(core::ProcessGroup& group) {
  std::shared_ptr<core::Algorithm> chosen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pending_.isOk()) {
      return pending_;
    }
    if (!chosen_ && !pin_.empty()) {
      // Pinned: the algorithm's defaults, but flat unless the group spans several nodes.
      decision_.args =
          withStart(pin_, pin_ == "powersgd" ? AlgorithmArgs{} : flatOrHierarchical(group), 0);
      BAGUA_ASSIGN_OR_RETURN(chosen_, createAlgorithm(pin_, decision_.args));
      if (group.rank() == 0) {
        BAGUA_LOG_INFO(kLogAlgo, "auto: %s", decision_.reason.c_str());
      }
    }
    if (!chosen_ && group.size() == 1) {
      decision_.algorithm = "gradient_allreduce";
      decision_.args = flatOrHierarchical(group);
      decision_.reason = "chose gradient_allreduce: one rank, nothing to communicate";
      BAGUA_ASSIGN_OR_RETURN(chosen_, createAlgorithm(decision_.algorithm, decision_.args));
    }
    chosen = chosen_;
  }
  if (chosen) {
    return chosen->reify(group);
  }
  // Every rank reifies its probes in the same order (wraps, rebuilds), so each rank's own
  // counter in the store numbers a probe alike on every rank: the key of its exchange.
  std::shared_ptr<core::Store> store = group.store();
  if (!store) {
    return BAGUA_ERROR(kFailedPrecondition, "auto: the process group has no store");
  }
  BAGUA_ASSIGN_OR_RETURN(
      int64_t seq,
      store->add(
          strPrintf("bagua-auto/%s/probes/rank%d", group.options().name.c_str(), group.rank()), 1));
  return std::unique_ptr<core::AlgorithmImpl>(
      std::make_unique<AutoProbeImpl>(this, probeSteps_, isHierarchical(group), seq));
}

AutoDecision AutoSelect::decision() const {
  std::lock_guard<std::mutex> lock(mu_);
  return decision_;
}

void AutoSelect::fail(Status s) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_ = std::move(s.withContext("auto: deciding"));
}

AutoSelect::Early AutoSelect::checkEarly(core::DistributedDataParallel& ddp, const AutoInputs& mine,
                                         double busySeconds, double spread, int64_t seq,
                                         int stepsSoFar) {
  core::ProcessGroup& group = ddp.group();
  Figures f{0,
            mine.allReduceStepSeconds,
            mine.link.latencySeconds,
            mine.link.bytesPerSecond,
            mine.codecBytesPerSecond,
            busySeconds,
            spread};
  Result<Figures> combined =
      exchange(group, strPrintf("%lld/early/", static_cast<long long>(seq)), f);
  if (!combined.isOk()) {
    fail(combined.takeStatus());
    return Early::kDecided;
  }
  Result<std::optional<AutoDecision>> d = chooseEarly(withFigures(mine, *combined), combined->busy);
  if (!d.isOk()) {
    fail(d.takeStatus());
    return Early::kDecided;
  }
  if (d->has_value()) {
    AutoDecision decided = std::move(**d);
    decided.probeSteps = stepsSoFar;
    adopt(std::move(decided), mine.hierarchical, group.rank());
    return Early::kDecided;
  }
  return combined->spread <= kAutoStableSpread ? Early::kSettled : Early::kGoOn;
}

void AutoSelect::decide(core::DistributedDataParallel& ddp, const AutoInputs& mine, int64_t seq,
                        int stepsSoFar) {
  core::ProcessGroup& group = ddp.group();
  Figures f{mine.computeSeconds, mine.allReduceStepSeconds, mine.link.latencySeconds,
            mine.link.bytesPerSecond, mine.codecBytesPerSecond};
  Result<Figures> combined = exchange(group, strPrintf("%lld/", static_cast<long long>(seq)), f);
  if (!combined.isOk()) {
    fail(combined.takeStatus());
    return;
  }
  Result<AutoDecision> d = chooseAlgorithm(withFigures(mine, *combined));
  if (!d.isOk()) {
    fail(d.takeStatus());
    return;
  }
  d->probeSteps = stepsSoFar;
  adopt(std::move(*d), mine.hierarchical, group.rank());
}

AlgorithmArgs AutoSelect::withStart(const std::string& algorithm, AlgorithmArgs args,
                                    int stepsRun) const {
  if (algorithm == "powersgd" && startIter_ >= 0) {
    args["start_iter"] = std::to_string(std::max(0, startIter_ - stepsRun));
  }
  return args;
}

void AutoSelect::adopt(AutoDecision d, bool hierarchical, int rank) {
  d.args = withStart(d.algorithm, std::move(d.args), d.probeSteps);
  Result<std::shared_ptr<core::Algorithm>> algo = createAlgorithm(d.algorithm, d.args);
  if (!algo.isOk()) {
    // A registered algorithm that refuses the rule's settings: exact all-reduce instead.
    d.reason += strPrintf("; %s refused its settings (%s): gradient_allreduce instead",
                          d.algorithm.c_str(), algo.status().toString().c_str());
    d.algorithm = "gradient_allreduce";
    d.args = {{"hierarchical", hierarchical ? "true" : "false"}};
    algo = createAlgorithm(d.algorithm, d.args);
    if (!algo.isOk()) {
      fail(algo.takeStatus());
      return;
    }
  }
  d.reason += strPrintf(" [decided after %d probe steps]", d.probeSteps);
  if (rank == 0) {
    BAGUA_LOG_INFO(kLogAlgo, "auto: %s", d.reason.c_str());
  } else {
    BAGUA_LOG_DEBUG(kLogAlgo, "auto: %s", d.reason.c_str());
  }
  std::lock_guard<std::mutex> lock(mu_);
  chosen_ = *algo;
  decision_ = std::move(d);
}

}  // namespace bagua::algo
