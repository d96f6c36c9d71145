// The tuner: Autotuner's protocol between ranks (start data, knob check, throughput reports,
// decisions through the store), rank 0's optimiser and trial log, and the bucket partition it
// proposes. The setting text form is setting_codec.cc; the algorithm wrappers, tunable.cc.
#include "bagua/autotune/autotuner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <set>
#include <type_traits>

#include "bagua/autotune/knob_owners.h"
#include "bagua/autotune/params.h"
#include "bagua/base/logging.h"
#include "setting_codec.h"

namespace bagua::autotune {

using Clock = std::chrono::steady_clock;

namespace {

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

// ---- Layout -----------------------------------------------------------------------------------

std::vector<std::vector<int>> partitionBySize(const std::vector<core::TensorRef>& tensors,
                                              const std::vector<int>& order, uint64_t bucketBytes) {
  std::vector<std::vector<int>> out;
  std::vector<int> open;
  uint64_t bytes = 0;
  for (int pos : order) {
    const core::TensorRef& t = tensors[pos];
    if (!open.empty()) {
      const core::TensorRef& head = tensors[open.front()];
      if (head.dtype != t.dtype || !(head.device == t.device)) {
        out.push_back(std::move(open));
        open.clear();
        bytes = 0;
      }
    }
    open.push_back(pos);
    bytes += t.bytes();
    if (bytes >= bucketBytes) {
      out.push_back(std::move(open));
      open.clear();
      bytes = 0;
    }
  }
  if (!open.empty()) {
    out.push_back(std::move(open));
  }
  return out;
}

// ---- Autotuner --------------------------------------------------------------------------------

// The options in force: init() takes each from AutotuneOptions, else from autotuneParams(), so
// the catalogue is the one place a default is written.
struct Autotuner::Resolved {
  bool enabled{};
  int maxSamples{};
  double warmupS{};
  double confidenceS{};
  int checkInterval{};
  int initialSamples{};
  uint64_t seed{};
  std::string logFile;
  std::string saveFile;
  std::string loadFile;
  std::chrono::milliseconds wait{};
  bool paired{};
};

Autotuner::Autotuner(core::DistributedDataParallel& ddp, Tunable& algorithm,
                     AutotuneOptions options)
    : ddp_(ddp),
      algo_(algorithm),
      options_(std::move(options)),
      r_(std::make_unique<Resolved>()),
      ownerId_(KnobOwners::newOwnerId()) {}

Autotuner::~Autotuner() {
  releaseKnobs();
}

Result<std::unique_ptr<Autotuner>> Autotuner::create(core::DistributedDataParallel& ddp,
                                                     Tunable& algorithm, AutotuneOptions options) {
  std::unique_ptr<Autotuner> t(new Autotuner(ddp, algorithm, std::move(options)));
  BAGUA_RETURN_IF_ERROR(t->init());
  return t;
}

std::string Autotuner::key(const std::string& what) const {
  return "autotune/" + options_.model + "/" + what;
}

std::vector<std::string> Autotuner::knobNames() const {
  std::vector<std::string> out;
  for (const Knob& k : options_.knobs) {
    out.push_back(k.dimension.name);
  }
  return out;
}

namespace {

std::string joinNames(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += (i ? "," : "") + names[i];
  }
  return out;
}

std::string showNames(const std::string& joined) {
  std::string out = "[";
  for (char c : joined) {
    out += c == ',' ? std::string(", ") : std::string(1, c);
  }
  return out + "]";
}

constexpr const char* kKnobsPrefix = "knobs=";

}  // namespace

void Autotuner::claimKnobs() {
  std::vector<Knob> kept;
  for (Knob& k : options_.knobs) {
    std::optional<std::string> owner =
        KnobOwners::process().claim(k.resource, ownerId_, options_.model);
    if (owner) {
      BAGUA_LOG_INFO(kLogTune,
                     "autotune: knob %s dropped from model %s: model %s already tunes it (%s); "
                     "one tuner per shared knob in a process",
                     k.dimension.name.c_str(), options_.model.c_str(), owner->c_str(),
                     k.resource.c_str());
      continue;
    }
    kept.push_back(std::move(k));
  }
  options_.knobs = std::move(kept);
}

void Autotuner::releaseKnobs() {
  const std::vector<std::string> freed = KnobOwners::process().releaseAll(ownerId_);
  if (!freed.empty()) {
    BAGUA_LOG_INFO(kLogTune, "autotune: model %s gives back shared knob(s) %s",
                   options_.model.c_str(), showNames(joinNames(freed)).c_str());
  }
}

Status Autotuner::checkKnobsAgree(const std::string& rank0Names) {
  core::Store& store = *ddp_.group().store();
  const std::string mine = joinNames(knobNames());
  auto mismatch = [&](int rank, const std::string& theirs) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "autotune: model %s: rank %d tunes knobs %s but rank 0 tunes %s; every rank "
                       "must tune the same knobs (on one rank another tuner of the process may "
                       "own a shared knob: see the INFO lines 'knob ... dropped')",
                       options_.model.c_str(), rank, showNames(theirs).c_str(),
                       showNames(rank0Names).c_str());
  };
  if (rank_ != 0) {
    BAGUA_RETURN_IF_ERROR(
        store.set(key("knobs" + std::to_string(rank_)), core::toBytes(kKnobsPrefix + mine)));
    if (mine != rank0Names) {
      return mismatch(rank_, mine);
    }
    Result<core::Bytes> v = store.get(key("verdict"), r_->wait);
    if (!v.isOk()) {
      return v.takeStatus().withContext(
          strPrintf("autotune: model %s: waiting for rank 0's verdict on the knob lists",
                    options_.model.c_str()));
    }
    const std::string verdict = core::toString(*v);
    if (verdict != "ok") {
      return BAGUA_ERROR(kFailedPrecondition, "%s", verdict.c_str());
    }
    return Status::ok();
  }
  std::vector<std::string> keys;
  for (int r = 1; r < world_; ++r) {
    keys.push_back(key("knobs" + std::to_string(r)));
  }
  Status st = store.wait(keys, r_->wait);
  if (!st.isOk()) {
    return st.withContext(strPrintf("autotune: model %s: waiting for the other ranks' knob lists",
                                    options_.model.c_str()));
  }
  Status verdict = Status::ok();
  for (int r = 1; r < world_ && verdict.isOk(); ++r) {
    BAGUA_ASSIGN_OR_RETURN(core::Bytes b, store.get(keys[r - 1], r_->wait));
    std::string theirs = core::toString(b);
    if (theirs.rfind(kKnobsPrefix, 0) != 0) {
      return BAGUA_ERROR(kInternal, "autotune: model %s: rank %d sent a malformed knob list",
                         options_.model.c_str(), r);
    }
    theirs.erase(0, std::strlen(kKnobsPrefix));
    if (theirs != rank0Names) {
      verdict = mismatch(r, theirs);
    }
  }
  BAGUA_RETURN_IF_ERROR(
      store.set(key("verdict"), core::toBytes(verdict.isOk() ? "ok" : verdict.message())));
  return verdict;
}

Status Autotuner::resolveOptions() {
  Resolved& r = *r_;
  const AutotuneOptions& o = options_;
  if (o.model.empty() || o.model.find('/') != std::string::npos) {
    return BAGUA_ERROR(kInvalidArgument, "autotune: model name '%s' must be non-empty without '/'",
                       o.model.c_str());
  }
  if (o.enabled) {
    r.enabled = *o.enabled;
  } else {
    BAGUA_ASSIGN_OR_RETURN(int64_t level, autotuneParams().level.get());
    r.enabled = level >= 1;
  }
  auto pick = [](const auto& opt, auto& param, auto& dst) -> Status {
    if (opt) {
      dst = *opt;
      return Status::ok();
    }
    BAGUA_ASSIGN_OR_RETURN(auto v, param.get());
    dst = static_cast<std::remove_reference_t<decltype(dst)>>(v);
    return Status::ok();
  };
  BAGUA_RETURN_IF_ERROR(pick(o.maxSamples, autotuneParams().maxSamples, r.maxSamples));
  BAGUA_RETURN_IF_ERROR(pick(o.warmupTimeS, autotuneParams().warmupTimeS, r.warmupS));
  BAGUA_RETURN_IF_ERROR(
      pick(o.samplingConfidenceTimeS, autotuneParams().samplingConfidenceTimeS, r.confidenceS));
  BAGUA_RETURN_IF_ERROR(pick(o.checkInterval, autotuneParams().checkInterval, r.checkInterval));
  BAGUA_RETURN_IF_ERROR(pick(o.initialSamples, autotuneParams().initialSamples, r.initialSamples));
  BAGUA_RETURN_IF_ERROR(pick(o.seed, autotuneParams().seed, r.seed));
  BAGUA_RETURN_IF_ERROR(pick(o.logFile, autotuneParams().logFile, r.logFile));
  BAGUA_RETURN_IF_ERROR(pick(o.saveFile, autotuneParams().saveFile, r.saveFile));
  BAGUA_RETURN_IF_ERROR(pick(o.loadFile, autotuneParams().loadFile, r.loadFile));
  if (o.waitTimeout) {
    r.wait = *o.waitTimeout;
  } else {
    BAGUA_ASSIGN_OR_RETURN(double w, autotuneParams().serverWaitTimeS.get());
    r.wait = std::chrono::milliseconds(static_cast<int64_t>(w * 1000.0));
  }
  r.paired = o.pairedReference;
  if (r.maxSamples < 1 || r.checkInterval < 1 || r.warmupS < 0 || r.confidenceS < 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "autotune: max samples (%d) and check interval (%d) must be >= 1, times "
                       "(%g, %g) >= 0",
                       r.maxSamples, r.checkInterval, r.warmupS, r.confidenceS);
  }
  return Status::ok();
}

Result<std::string> Autotuner::exchangeStart(const SearchSpace& space) {
  Resolved& r = *r_;
  const AutotuneOptions& o = options_;
  // Rank 0 reads the saved setting (if any) and tells everyone where to start and which knobs it
  // tunes; the others check that they tune the same (checkKnobsAgree).
  core::Store& store = *ddp_.group().store();
  const std::string knobList = joinNames(knobNames());
  std::string start = "none\n";
  if (rank_ == 0) {
    if (!r.loadFile.empty()) {
      Result<Setting> s = loadSetting(r.loadFile);
      if (!s.isOk()) {
        return s.takeStatus();
      }
      // It must name exactly this model's tensors.
      std::multiset<std::string> have(tensorNames_.begin(), tensorNames_.end());
      std::multiset<std::string> got;
      for (const auto& b : s->buckets) {
        got.insert(b.begin(), b.end());
      }
      if (have != got) {
        return BAGUA_ERROR(kInvalidArgument,
                           "autotune: %s holds a layout of %zu tensors that does not match model "
                           "%s's %zu tensors (saved by another model?)",
                           r.loadFile.c_str(), got.size(), o.model.c_str(), have.size());
      }
      start = "load\n" + encodeSetting(*s);
      BAGUA_LOG_INFO(kLogTune, "autotune: model %s starts from %s (bucket %llu bytes, %zu buckets)",
                     o.model.c_str(), r.loadFile.c_str(),
                     static_cast<unsigned long long>(s->bucketBytes), s->buckets.size());
    }
    BAGUA_RETURN_IF_ERROR(
        store.set(key("start"), core::toBytes(kKnobsPrefix + knobList + "\n" + start)));
    OptimizerOptions bo;
    bo.seed = r.seed;
    bo.initialSamples = r.initialSamples;
    BAGUA_ASSIGN_OR_RETURN(BayesianOptimizer opt, BayesianOptimizer::create(space, bo));
    bo_ = std::make_unique<BayesianOptimizer>(std::move(opt));
  } else {
    BAGUA_ASSIGN_OR_RETURN(core::Bytes b, store.get(key("start"), r.wait));
    start = core::toString(b);
  }
  std::string rank0Knobs = knobList;
  if (rank_ != 0) {
    const size_t nl = start.find('\n');
    if (start.rfind(kKnobsPrefix, 0) != 0 || nl == std::string::npos) {
      return BAGUA_ERROR(kInternal, "autotune: model %s: malformed start data from rank 0",
                         o.model.c_str());
    }
    rank0Knobs = start.substr(std::strlen(kKnobsPrefix), nl - std::strlen(kKnobsPrefix));
    start.erase(0, nl + 1);
  }
  if (world_ > 1) {
    BAGUA_RETURN_IF_ERROR(checkKnobsAgree(rank0Knobs));
  }
  return start;
}

Status Autotuner::applyStart(const std::string& start, const SearchSpace& space) {
  const AutotuneOptions& o = options_;
  if (start.rfind("load\n", 0) == 0) {
    BAGUA_ASSIGN_OR_RETURN(Setting s, decodeSetting(start.substr(5), "rank 0's start"));
    BAGUA_RETURN_IF_ERROR(schedule(s));
    const int bi = 0;
    currentPoint_[bi] = std::clamp<int64_t>(static_cast<int64_t>(s.bucketBytes / 1024),
                                            space.dims()[0].lo, space.dims()[0].hi);
    for (size_t k = 0; k < o.knobs.size(); ++k) {
      auto it = s.knobs.find(o.knobs[k].dimension.name);
      if (it != s.knobs.end()) {
        currentPoint_[k + 1] =
            std::clamp(it->second, o.knobs[k].dimension.lo, o.knobs[k].dimension.hi);
      }
    }
  }
  return Status::ok();
}

Status Autotuner::init() {
  BAGUA_RETURN_IF_ERROR(resolveOptions());
  const Resolved& r = *r_;
  const AutotuneOptions& o = options_;
  rank_ = ddp_.group().rank();
  world_ = ddp_.group().size();
  for (const core::TensorRef& t : ddp_.tensors()) {
    if (t.name.find_first_of(",\n=") != std::string::npos) {
      return BAGUA_ERROR(kInvalidArgument,
                         "autotune: tensor name '%s' contains ',', '=' or a newline, which the "
                         "setting format cannot carry",
                         t.name.c_str());
    }
    tensorNames_.push_back(t.name);
  }
  current_.bucketBytes = static_cast<uint64_t>(ddp_.options().bucketCapMb * 1024.0 * 1024.0);
  current_.buckets = ddp_.bucketLayout();
  windowStart_ = Clock::now();
  startedAt_ = windowStart_;
  subStart_ = windowStart_;
  windowStartStep_ = ddp_.trainStep();

  if (!r.enabled && r.loadFile.empty()) {
    state_ = State::kDone;
    options_.knobs.clear();  // nothing is tuned, nothing claimed
    return Status::ok();
  }
  if (tensorNames_.empty()) {
    state_ = State::kSkipped;
    options_.knobs.clear();
    BAGUA_LOG_INFO(kLogTune,
                   "autotune: model %s: the algorithm communicates no gradient buckets "
                   "(decentralized, low-precision decentralized and async average weights "
                   "instead), so there is no bucket layout to tune; skipped",
                   o.model.c_str());
    return Status::ok();
  }

  // The search space: bucket size (KiB, log scale) and the extra knobs.
  uint64_t total = 0;
  for (const core::TensorRef& t : ddp_.tensors()) {
    total += t.bytes();
  }
  const int64_t loKib = std::max<int64_t>(1, static_cast<int64_t>(o.minBucketBytes / 1024));
  const uint64_t maxBytes = o.maxBucketBytes ? o.maxBucketBytes : total;
  const int64_t hiKib = std::max<int64_t>(loKib, static_cast<int64_t>((maxBytes + 1023) / 1024));
  for (const Knob& k : o.knobs) {
    if (!k.apply) {
      return BAGUA_ERROR(kInvalidArgument, "autotune: knob %s has no apply function",
                         k.dimension.name.c_str());
    }
    if (!k.dimension.contains(k.initial)) {
      return BAGUA_ERROR(kInvalidArgument, "autotune: knob %s starts at %lld outside [%lld, %lld]",
                         k.dimension.name.c_str(), static_cast<long long>(k.initial),
                         static_cast<long long>(k.dimension.lo),
                         static_cast<long long>(k.dimension.hi));
    }
  }
  // Only now, with the options known good: a knob another live tuner owns is dropped here.
  claimKnobs();
  std::vector<Dimension> dims = {Dimension::logInteger("bucket_kib", loKib, hiKib)};
  for (const Knob& k : o.knobs) {
    current_.knobs[k.dimension.name] = k.initial;
    dims.push_back(k.dimension);
  }
  BAGUA_ASSIGN_OR_RETURN(SearchSpace space, SearchSpace::create(std::move(dims)));
  currentPoint_.push_back(std::clamp<int64_t>(static_cast<int64_t>(current_.bucketBytes / 1024),
                                              space.dims()[0].lo, space.dims()[0].hi));
  for (const Knob& k : o.knobs) {
    currentPoint_.push_back(k.initial);
  }

  BAGUA_ASSIGN_OR_RETURN(std::string start, exchangeStart(space));
  BAGUA_RETURN_IF_ERROR(applyStart(start, space));
  if (!r.enabled) {
    state_ = State::kDone;  // the loaded setting is applied; nothing more to tune
    releaseKnobs();
    return Status::ok();
  }
  state_ = r.warmupS > 0 ? State::kWarmup : State::kMeasuring;
  BAGUA_LOG_INFO(kLogTune,
                 "autotune: model %s: %zu tensors (%llu bytes), bucket size searched in [%lld, "
                 "%lld] KiB, %zu extra knob(s), %d samples, warm-up %gs, window %gs",
                 o.model.c_str(), tensorNames_.size(), static_cast<unsigned long long>(total),
                 static_cast<long long>(loKib), static_cast<long long>(hiKib), o.knobs.size(),
                 r.maxSamples, r.warmupS, r.confidenceS);
  return Status::ok();
}

Status Autotuner::schedule(const Setting& s) {
  const int64_t at = ddp_.trainStep() + 1;
  BAGUA_RETURN_IF_ERROR(algo_.schedule(at, s.buckets));
  for (const Knob& k : options_.knobs) {
    auto it = s.knobs.find(k.dimension.name);
    if (it == s.knobs.end()) {
      continue;
    }
    auto cur = current_.knobs.find(k.dimension.name);
    if (cur == current_.knobs.end() || cur->second != it->second || switchSteps_.empty()) {
      Status st = k.apply(it->second);
      if (!st.isOk()) {
        return st.withContext("autotune: applying " + k.dimension.name);
      }
    }
  }
  current_ = s;
  // A knob this tuner dropped (another tuner owns it) is not part of its settings.
  std::erase_if(current_.knobs, [&](const auto& kv) {
    return std::none_of(options_.knobs.begin(), options_.knobs.end(),
                        [&](const Knob& k) { return k.dimension.name == kv.first; });
  });
  pendingSwitch_ = at;
  switchSteps_.push_back(at);
  return Status::ok();
}

Result<Setting> Autotuner::makeSetting(const Point& point) {
  Setting s;
  s.bucketBytes = static_cast<uint64_t>(point[0]) * 1024;
  const auto& tensors = ddp_.tensors();
  // Tensor order: mean gradient-ready time seen on rank 0 (earliest first).
  std::vector<int> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  if (readySamples_ > 0 && readySumNs_.size() == tensors.size()) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return readySumNs_[a] < readySumNs_[b]; });
  }
  for (const auto& b : partitionBySize(tensors, order, s.bucketBytes)) {
    s.buckets.emplace_back();
    for (int t : b) {
      s.buckets.back().push_back(tensors[t].name);
    }
  }
  for (size_t k = 0; k < options_.knobs.size(); ++k) {
    s.knobs[options_.knobs[k].dimension.name] = point[k + 1];
  }
  return s;
}

void Autotuner::logTrial(const Trial& t) {
  BAGUA_LOG_INFO(
      kLogTune,
      "autotune: model %s trial %d at iteration %lld: bucket %llu bytes (%d buckets)%s "
      "-> %.3f it/s over %.2fs",
      options_.model.c_str(), t.index, static_cast<long long>(t.trainStep),
      static_cast<unsigned long long>(t.setting.bucketBytes), t.bucketCount,
      [&] {
        std::string k;
        for (const auto& [n, v] : t.setting.knobs) {
          k += strPrintf(" %s=%lld", n.c_str(), static_cast<long long>(v));
        }
        return k;
      }()
          .c_str(),
      t.score, t.windowS);
  if (r_->logFile.empty()) {
    return;
  }
  std::ifstream probe(r_->logFile);
  const bool fresh = !probe.good() || probe.peek() == std::ifstream::traits_type::eof();
  probe.close();
  std::ofstream out(r_->logFile, std::ios::app);
  if (!out) {
    BAGUA_LOG_WARN(kLogTune, "autotune: cannot append to the trial log %s", r_->logFile.c_str());
    return;
  }
  if (fresh) {
    out << "model,trial,train_iter,bucket_bytes,buckets";
    for (const Knob& k : options_.knobs) {
      out << "," << k.dimension.name;
    }
    out << ",score_iters_per_s,window_s\n";
  }
  out << options_.model << "," << t.index << "," << t.trainStep << "," << t.setting.bucketBytes
      << "," << t.bucketCount;
  for (const Knob& k : options_.knobs) {
    auto it = t.setting.knobs.find(k.dimension.name);
    out << "," << (it == t.setting.knobs.end() ? 0 : it->second);
  }
  out << strPrintf(",%.6f,%.4f\n", t.score, t.windowS);
}

Status Autotuner::decide(int64_t step, const std::vector<WindowReport>& reports,
                         std::string* decision) {
  *decision = "keep\n";
  if (state_ == State::kWarmup) {
    if (secondsSince(startedAt_) >= r_->warmupS) {
      state_ = State::kMeasuring;
      *decision = "restart\n";
    }
    return Status::ok();
  }
  if (state_ != State::kMeasuring) {
    return Status::ok();
  }
  double score = 0;
  for (const WindowReport& w : reports) {
    if (w.iters < 1 || w.secs <= 0 || w.secs < r_->confidenceS) {
      return Status::ok();  // this window is not long enough yet
    }
    score += w.medianRate > 0 ? w.medianRate : static_cast<double>(w.iters) / w.secs;
  }
  score /= static_cast<double>(reports.size());
  Setting measured = current_;
  double windowS = reports[0].secs;
  if (r_->paired && !trials_.empty()) {
    if (!inReference_) {
      // The candidate's window is done: measure the reference (the best setting so far) right
      // after it, so that load drift shared by both windows cancels in their ratio.
      candidateRate_ = score;
      candidateWindowS_ = windowS;
      candidate_ = current_;
      inReference_ = true;
      *decision = "switch\n" + encodeSetting(reference_);
      return Status::ok();
    }
    inReference_ = false;
    measured = candidate_;
    windowS = candidateWindowS_;
    score = candidateRate_ / score * referenceScore_;
  }
  Trial t;
  t.index = static_cast<int>(trials_.size());
  t.trainStep = step;
  t.setting = measured;
  t.setting.score = score;
  t.score = score;
  t.windowS = windowS;
  t.bucketCount = static_cast<int>(measured.buckets.size());
  trials_.push_back(t);
  logTrial(t);
  BAGUA_RETURN_IF_ERROR(bo_->tell(currentPoint_, score));
  // The reference for the next candidate: the best estimate so far (highest posterior mean) at
  // its posterior mean, not the luckiest window, so one noisy ratio does not inflate every later
  // score through the chain. Observation i is trial i.
  if (std::optional<BayesianOptimizer::Best> b = bo_->bestEstimate();
      b && b->index < trials_.size()) {
    reference_ = trials_[b->index].setting;
    referenceScore_ = b->mean;
  }
  if (static_cast<int>(trials_.size()) >= r_->maxSamples) {
    // The best setting: highest posterior mean among the sampled points, as a fresh layout in the
    // learned order; the measured trial with the same point supplies the score for the file.
    const Point best = *bo_->best();
    BAGUA_ASSIGN_OR_RETURN(Setting s, makeSetting(best));
    double sum = 0;
    int n = 0;
    const auto& obs = bo_->observations();
    for (const Observation& ob : obs) {
      if (ob.point == best) {
        sum += ob.score;
        ++n;
      }
    }
    s.score = n ? sum / n : 0.0;
    currentPoint_ = best;
    state_ = State::kDone;
    *decision = "final\n" + encodeSetting(s);
    BAGUA_LOG_INFO(kLogTune,
                   "autotune: model %s done after %zu trials: bucket %llu bytes, %zu buckets, "
                   "%.3f it/s measured",
                   options_.model.c_str(), trials_.size(),
                   static_cast<unsigned long long>(s.bucketBytes), s.buckets.size(), s.score);
    if (!r_->saveFile.empty()) {
      Status st = saveSetting(r_->saveFile, options_.model, s);
      if (!st.isOk()) {
        BAGUA_LOG_WARN(kLogTune, "autotune: %s", st.toString().c_str());
      }
    }
    return Status::ok();
  }
  BAGUA_ASSIGN_OR_RETURN(Point next, bo_->ask());
  BAGUA_ASSIGN_OR_RETURN(Setting s, makeSetting(next));
  currentPoint_ = next;
  *decision = "switch\n" + encodeSetting(s);
  return Status::ok();
}

Status Autotuner::applyDecision(const std::string& decision) {
  const size_t nl = decision.find('\n');
  const std::string kind = decision.substr(0, nl);
  if (kind == "keep") {
    return Status::ok();
  }
  if (kind == "restart") {
    state_ = State::kMeasuring;
    windowStart_ = Clock::now();
    windowIters_ = 0;
    subRates_.clear();
    subStart_ = windowStart_;
    subStartIters_ = 0;
    return Status::ok();
  }
  if (kind != "switch" && kind != "final") {
    return BAGUA_ERROR(kInternal, "autotune: unknown decision '%s'", kind.c_str());
  }
  BAGUA_ASSIGN_OR_RETURN(Setting s, decodeSetting(decision.substr(nl + 1), "decision"));
  BAGUA_RETURN_IF_ERROR(schedule(s));
  state_ = kind == "final" ? State::kDone : State::kMeasuring;
  if (state_ == State::kDone) {
    releaseKnobs();  // the final values stay in force; a later tuner may claim the knobs
  }
  return Status::ok();
}

Status Autotuner::check() {
  core::Store& store = *ddp_.group().store();
  const int64_t c = checks_++;
  const int64_t step = ddp_.trainStep();
  const auto now = Clock::now();
  double secs = 0;
  double rate = 0;
  if (pendingSwitch_ < 0) {
    secs = std::chrono::duration<double>(now - windowStart_).count();
    const double subSecs = std::chrono::duration<double>(now - subStart_).count();
    if (windowIters_ > subStartIters_ && subSecs > 0) {
      subRates_.push_back(static_cast<double>(windowIters_ - subStartIters_) / subSecs);
    }
    if (!subRates_.empty()) {
      std::vector<double> sorted = subRates_;
      std::sort(sorted.begin(), sorted.end());
      const size_t n = sorted.size();
      rate = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    }
  }
  subStart_ = now;
  subStartIters_ = windowIters_;
  const std::string mine =
      strPrintf("%lld %.9f %.9f", static_cast<long long>(windowIters_), secs, rate);
  const std::string prefix = strPrintf("c%lld/", static_cast<long long>(c));
  std::string decision;
  if (rank_ == 0) {
    std::vector<WindowReport> reports(world_);
    reports[0] = {windowIters_, secs, rate};
    std::vector<std::string> keys;
    for (int r = 1; r < world_; ++r) {
      keys.push_back(key(prefix + "rep" + std::to_string(r)));
    }
    if (!keys.empty()) {
      Status s = store.wait(keys, r_->wait);
      if (!s.isOk()) {
        return s.withContext(
            strPrintf("autotune: model %s, iteration %lld: waiting for the other "
                      "ranks' throughput reports",
                      options_.model.c_str(), static_cast<long long>(step)));
      }
    }
    for (int r = 1; r < world_; ++r) {
      BAGUA_ASSIGN_OR_RETURN(core::Bytes b, store.get(keys[r - 1], r_->wait));
      long long it = 0;
      double sec = 0;
      double med = 0;
      if (std::sscanf(core::toString(b).c_str(), "%lld %lf %lf", &it, &sec, &med) != 3) {
        return BAGUA_ERROR(kInternal, "autotune: rank %d sent a malformed report", r);
      }
      reports[r] = {it, sec, med};
    }
    BAGUA_RETURN_IF_ERROR(decide(step, reports, &decision));
    BAGUA_RETURN_IF_ERROR(store.set(key(prefix + "dec"), core::toBytes(decision)));
    if (state_ == State::kDone) {
      // decide() moved to kDone; applyDecision below sets it again.
      state_ = State::kMeasuring;
    }
  } else {
    BAGUA_RETURN_IF_ERROR(
        store.set(key(prefix + "rep" + std::to_string(rank_)), core::toBytes(mine)));
    Result<core::Bytes> b = store.get(key(prefix + "dec"), r_->wait);
    if (!b.isOk()) {
      return b.takeStatus().withContext(
          strPrintf("autotune: model %s, iteration %lld: waiting for rank 0's decision",
                    options_.model.c_str(), static_cast<long long>(step)));
    }
    decision = core::toString(*b);
  }
  return applyDecision(decision);
}

Status Autotuner::onIterationEnd() {
  if (state_ == State::kDone || state_ == State::kSkipped) {
    return Status::ok();
  }
  const auto t0 = Clock::now();
  if (ddp_.tensors().size() != tensorNames_.size()) {
    // The algorithm rebuilt its tensors (e.g. async averaging after its warm-up): every rank
    // sees this at the same iteration.
    state_ = State::kSkipped;
    BAGUA_LOG_INFO(kLogTune,
                   "autotune: model %s: the algorithm now communicates %zu tensors instead of %zu; "
                   "tuning stopped",
                   options_.model.c_str(), ddp_.tensors().size(), tensorNames_.size());
    releaseKnobs();
    return Status::ok();
  }
  ++iterations_;
  const int64_t step = ddp_.trainStep();
  if (pendingSwitch_ >= 0 && step >= pendingSwitch_) {
    // The first iteration on the new layout (re-bucketing included) is not measured.
    pendingSwitch_ = -1;
    windowStart_ = t0;
    windowStartStep_ = step;
    windowIters_ = 0;
    subRates_.clear();
    subStart_ = t0;
    subStartIters_ = 0;
  } else {
    ++windowIters_;
  }
  if (rank_ == 0) {
    const std::vector<int64_t>& ready = algo_.readyTimesNs();
    if (ready.size() == tensorNames_.size()) {
      readySumNs_.resize(ready.size(), 0.0);
      for (size_t i = 0; i < ready.size(); ++i) {
        readySumNs_[i] += static_cast<double>(ready[i]);
      }
      ++readySamples_;
    }
  }
  Status s;
  if (iterations_ % r_->checkInterval == 0) {
    s = check();
  }
  overheadS_ += secondsSince(t0);
  return s;
}

}  // namespace bagua::autotune
