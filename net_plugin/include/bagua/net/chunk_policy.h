// The send side's per-message chunk policy: whether a message travels inline on the control
// stream, how large its chunks are and how many parked data streams it wakes, chosen from what the
// comm sees when the message is posted. A pure function of its inputs (no clock, no state, no
// allocation): SendComm gathers the inputs in isend and applies the plan; SendComm::lastPlan()
// returns both, so that a caller (and the engine's tests) can see why a message was cut as it was.
//
// Why per message: one static rule cannot fit both a lone 1 MiB all-reduce on a host with idle
// cores (it wants every stream at once: small chunks, many wake-ups in parallel) and a queue of
// 256 MiB ones on a host whose cores are busy (every chunk costs a helper-thread hop on each side,
// so it wants no more chunks than it must). What tells them apart is measured: how long a parked
// data thread takes to start a chunk after the message is posted (its wake-up), how fast each
// stream moves a chunk, and whether earlier messages still wait for a stream.
//
// The adaptive rule (ChunkRules::adaptive):
//  1. size <= inlineBytes: inline (no data stream, no helper thread).
//  2. Nothing measured yet (no stream's rate, or no wake-up): the fixed rule below with minChunk,
//     so a fresh comm starts where the static default did. A stream gets a rate once it has sent
//     a few chunks; streams without one are left out of the median and of rule 5.
//  3. breakEven = wake-up time x the measured streams' median rate: the bytes a stream moves in
//     the time one wake-up costs. A chunk much smaller than that spends more on the hop than on
//     the bytes. Floor = breakEven clamped to [kAdaptiveFloor, minChunk]: finer than the minimum
//     where wake-ups are short (idle cores: a lone message spreads over every stream at once),
//     never coarser (on a busy host a wake-up is mostly a wait for a core, not work, and larger
//     chunks cost the copies that ran in parallel). A message queued behind unclaimed bytes
//     (queuedBytes > 0: every stream already has work waiting) keeps minChunk: splitting it finer
//     cannot make it start earlier, it only adds hops.
//  4. The message is cut for the streams free now: free = max(1, streams - inFlight) when nothing
//     is queued (each message in flight may hold a stream), else every active stream:
//     chunk = clamp(ceil(size / free), floor, maxChunk).
//  5. Uneven streams (the slowest below kSlowStreamFraction of the median): a chunk on the slowest
//     stream should take no longer than the message takes on all of them, so the chunk is capped
//     at size x slowest / sum of rates (unmeasured streams at the median; not below
//     kAdaptiveFloor): fast streams take more chunks.
//  6. Wake min(streams, chunks) parked streams: no more than the message has chunks.
//  7. A message with nothing queued and nothing else in flight, cut into one chunk that is
//     smaller than breakEven and at most kCallerSendMax, is written by the caller's isend itself
//     on a parked stream (callerSends: copying it costs the caller less than the wake-up it
//     saves; the socket takes what it can without blocking and that stream's thread sends the
//     rest). With messages in flight the sockets are likely full: the stream's thread sends it.
//     When no stream is parked and free, isend wakes one.
// The fixed rule (!adaptive, or any knob that pins a floor: see EngineOptions): chunk =
// clamp(ceil(size / streams), floor, maxChunk) with floor = loneChunk for a message with nothing
// queued before it when 0 < loneChunk < minChunk, else minChunk. Round-robin: an equal split over
// every established stream up to maxChunk (the engine passes the wire's 1 GiB limit there: the
// comparison baseline's rule has no upper clamp of its own).
//
// Thread safety: planChunks is pure; the structs are plain values.
#pragma once

#include <array>
#include <cstdint>

#include "bagua/net/params.h"  // kMaxStreams

namespace bagua::net {

// The adaptive floor never goes below this: a chunk's 32-byte header stays under 0.05% of it, and
// its two system calls and one hop per side are spread over at least 64 KiB.
inline constexpr uint64_t kAdaptiveFloor = 64 * 1024;
// Rule 7's bound: the caller is NCCL's one proxy thread for every channel of the rank, so what it
// copies itself holds the other connections up; a chunk up to this size costs it about as much as
// the wake-up it saves on a loaded host (25-50 us at 5-10 GB/s).
inline constexpr uint64_t kCallerSendMax = 256 * 1024;
// A stream counts as slow (rule 5) below this fraction of the median rate.
inline constexpr double kSlowStreamFraction = 0.25;

// The comm's settings that bound the plan (EngineOptions resolved with the live settings).
struct ChunkRules {
  bool adaptive = false;
  bool roundRobin = false;  // equal split over every stream (Schedule::kRoundRobin)
  uint64_t inlineBytes = 0;
  uint64_t minChunk = 1;   // fixed: the floor; adaptive: the floor of a queued message
  uint64_t loneChunk = 0;  // fixed: the floor of a message with nothing queued, if below minChunk
  uint64_t maxChunk = 1;

  bool operator==(const ChunkRules&) const = default;
};

// What the comm sees when a message is posted.
struct CommLoad {
  uint64_t size = 0;         // the message, bytes
  uint64_t queuedBytes = 0;  // bytes of earlier messages that no data stream has claimed yet
  uint64_t inFlight = 0;     // earlier messages posted and not yet complete
  int streams = 1;           // active data streams (1..kMaxStreams)
  // Measured payload rate of each active stream while it sends a chunk (bytes/s, a moving
  // average); 0: not measured yet. Entries [streams, kMaxStreams) are ignored.
  std::array<double, kMaxStreams> streamRates{};
  // Measured time from a message's post to a parked data thread starting its first chunk
  // (seconds, a moving average); 0: not measured yet.
  double wakeSeconds = 0;

  bool operator==(const CommLoad&) const = default;
};

// Which rule decided the plan (for logs and tests).
enum class PlanReason {
  kInline,      // rule 1
  kFixed,       // the fixed rule (or round-robin)
  kUnmeasured,  // rule 2: adaptive, nothing measured yet
  kLone,        // rules 3-4, nothing queued
  kQueued,      // rules 3-4, earlier bytes still unclaimed
  kUneven,      // rule 5 capped the chunk
};
const char* planReasonName(PlanReason reason);

struct ChunkPlan {
  uint64_t chunk = 0;        // chunk size; 0 when inline
  uint64_t chunks = 0;       // chunks of the message (0 when inline)
  int wake = 0;              // parked data streams to wake (0 when inline)
  bool callerSends = false;  // rule 7: isend writes the one chunk on a parked stream itself
  PlanReason reason = PlanReason::kInline;

  bool operator==(const ChunkPlan&) const = default;
};

// The plan for `load` under `rules`. Requires rules.minChunk >= 1, maxChunk >= 1 and
// 1 <= load.streams <= kMaxStreams (a value outside is clamped). A 0-byte message is inline.
ChunkPlan planChunks(const CommLoad& load, const ChunkRules& rules);

// One message's decision, as SendComm::lastPlan() reports it.
struct MessagePlan {
  CommLoad load;
  ChunkRules rules;
  ChunkPlan plan;
  bool callerSent = false;  // isend wrote the chunk itself (plan.callerSends, a parked stream free)
};

}  // namespace bagua::net
