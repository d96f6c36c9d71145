// planChunks: the send side's per-message chunk policy (contract and rules in
// bagua/net/chunk_policy.h).
#include "bagua/net/chunk_policy.h"

#include <algorithm>

namespace bagua::net {

namespace {

uint64_t ceilDiv(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

uint64_t clampChunk(uint64_t even, uint64_t floor, uint64_t cap) {
  floor = std::max<uint64_t>(floor, 1);
  return std::clamp(even, floor, std::max(cap, floor));
}

ChunkPlan finish(uint64_t size, uint64_t chunk, int streams, PlanReason reason) {
  ChunkPlan p;
  p.chunk = chunk;
  p.chunks = ceilDiv(size, chunk);
  p.wake = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(streams), p.chunks));
  p.reason = reason;
  return p;
}

}  // namespace

const char* planReasonName(PlanReason reason) {
  switch (reason) {
  case PlanReason::kInline:
    return "inline";
  case PlanReason::kFixed:
    return "fixed";
  case PlanReason::kUnmeasured:
    return "unmeasured";
  case PlanReason::kLone:
    return "lone";
  case PlanReason::kQueued:
    return "queued";
  case PlanReason::kUneven:
    return "uneven";
  }
  return "?";
}

ChunkPlan planChunks(const CommLoad& load, const ChunkRules& rules) {
  const uint64_t size = load.size;
  if (size == 0 || size <= rules.inlineBytes) {
    return ChunkPlan{};
  }
  const int streams = std::clamp(load.streams, 1, kMaxStreams);
  const auto n = static_cast<uint64_t>(streams);
  if (rules.roundRobin) {
    // Equal split, no upper clamp: chunk k to stream k mod N (NCCL Socket's rule).
    return finish(size, clampChunk(ceilDiv(size, n), rules.minChunk, rules.maxChunk), streams,
                  PlanReason::kFixed);
  }
  const bool queued = load.queuedBytes > 0;
  // The measured streams' rates, sorted (a stream that never sent has none yet).
  std::array<double, kMaxStreams> rates{};
  size_t m = 0;
  for (int i = 0; i < streams; ++i) {
    if (load.streamRates[static_cast<size_t>(i)] > 0) {
      rates[m++] = load.streamRates[static_cast<size_t>(i)];
    }
  }
  if (!rules.adaptive || load.wakeSeconds <= 0 || m == 0) {
    uint64_t floor = rules.minChunk;
    if (!rules.adaptive && !queued && rules.loneChunk > 0) {
      floor = std::min(floor, rules.loneChunk);
    }
    return finish(size, clampChunk(ceilDiv(size, n), floor, rules.maxChunk), streams,
                  rules.adaptive ? PlanReason::kUnmeasured : PlanReason::kFixed);
  }

  // Rule 3: the break-even chunk, from the median rate.
  std::sort(rates.begin(), rates.begin() + static_cast<std::ptrdiff_t>(m));
  const double median = m % 2 == 1 ? rates[m / 2] : (rates[m / 2 - 1] + rates[m / 2]) / 2;
  const double breakEven = load.wakeSeconds * median;
  // Never coarser than the minimum (a busy host's wake-ups are mostly waits for a core, not work:
  // larger chunks would not save what they cost in parallel copies), never below kAdaptiveFloor.
  const uint64_t top = std::min(rules.minChunk, rules.maxChunk);
  uint64_t floor = breakEven >= static_cast<double>(top)
                       ? top
                       : std::min(top, std::max(kAdaptiveFloor, static_cast<uint64_t>(breakEven)));
  if (queued) {
    floor = std::max(floor, rules.minChunk);
  }
  // Rule 4: cut for the streams that are free now.
  const uint64_t free =
      queued ? n : std::max<uint64_t>(1, n - std::min<uint64_t>(n, load.inFlight));
  uint64_t chunk = clampChunk(ceilDiv(size, free), floor, rules.maxChunk);
  PlanReason reason = queued ? PlanReason::kQueued : PlanReason::kLone;

  // Rule 5: a slow stream's chunk should not outlast the message on all the streams.
  if (m > 1 && rates[0] < kSlowStreamFraction * median) {
    double sum = 0;
    for (size_t i = 0; i < m; ++i) {
      sum += rates[i];
    }
    // Streams not measured yet count at the median.
    sum += static_cast<double>(n - m) * median;
    const auto share = static_cast<uint64_t>(static_cast<double>(size) * rates[0] / sum);
    const uint64_t capped = std::max(std::min(kAdaptiveFloor, rules.maxChunk), share);
    if (capped < chunk) {
      chunk = capped;
      reason = PlanReason::kUneven;
    }
  }
  ChunkPlan plan = finish(size, chunk, streams, reason);
  // Rule 7: the copy costs less than the wake-up it saves, and nothing of the comm's is still on
  // its way (else the socket is likely full and the caller's send only half done).
  plan.callerSends = !queued && load.inFlight == 0 && plan.chunks == 1 && size <= kCallerSendMax &&
                     static_cast<double>(size) < breakEven;
  return plan;
}

}  // namespace bagua::net
