// Live tuning of the host backend's transport knobs while a job runs (the autotuner switches
// them between training iterations).
//
// Knobs:
//   segmentBytes   BAGUA_HOST_SEGMENT_BYTES: the unit of pipelining of the ring collectives and,
//                  on the engine transport, the pieces messages are cut into. Both ends of every
//                  pair cut by it, so it MUST be the same on every rank at every collective.
//   engineStreams  how many of the BAGUA_HOST_NET_STREAMS data streams per connection carry new
//                  messages (engine transport only; sender side, 1..established).
//   engineChunkBytes  the engine's chunk size (min = max chunk, BAGUA_NET_MIN/MAX_CHUNKSIZE) for
//                  new messages (engine transport only; sender side).
// The parameters stay the start values; these calls change them from a point of the run on.
//
// Contract: setHostTuning is a COLLECTIVE of the communicator. It is enqueued like any other
// operation, so it takes effect after every collective issued before it and before every one
// issued after it, on every rank. Every rank must pass the same values: they are exchanged and
// compared first (a small all-gather); on any difference no rank applies anything, every rank
// gets InvalidArgument naming the values and ranks, and the communicator stays usable.
//
// Thread safety: like issuing any collective (see communicator.h); hostTuning() from any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>

#include "bagua/base/status.h"
#include "bagua/core/communicator.h"

namespace bagua::core {

class ProcessGroup;

struct HostTuning {
  size_t segmentBytes = 0;      // 0: keep; else 4 KiB .. 1 GiB
  int engineStreams = 0;        // 0: keep; else 1 .. established streams (engine transport only)
  size_t engineChunkBytes = 0;  // 0: keep; else 4 KiB .. 1 GiB (engine transport only)
};

struct HostTuningState {
  size_t segmentBytes = 0;
  std::string transport;           // "engine" or "socket"
  int establishedStreams = 0;      // engine: data streams per connection; socket: 0
  int activeStreams = 0;           // engine: streams carrying new messages; socket: 0
  size_t engineChunkBytes = 0;     // engine: chunk size set live (0: the engine's parameters)
  size_t engineMinChunkBytes = 0;  // engine: the parameters' smallest chunk
};

// The chunk the engine cuts a `segment`-byte piece into over `streams` streams while no chunk
// size is set live: an even split, at least the parameters' smallest chunk (its size rule; the
// largest chunk does not bind at segment sizes).
inline size_t engineDefaultChunkBytes(const HostTuningState& state, size_t segment, int streams) {
  return std::max(segment / static_cast<size_t>(std::max(1, streams)), state.engineMinChunkBytes);
}

// Applies `tuning` on `comm` (a host-backend communicator; anything else is InvalidArgument) and
// waits up to `timeout` for it. Collective: see the contract above.
[[nodiscard]] Status setHostTuning(Communicator& comm, const HostTuning& tuning,
                                   std::chrono::milliseconds timeout);
// The current values (the worker may apply a pending setHostTuning at any moment).
[[nodiscard]] Result<HostTuningState> hostTuning(const Communicator& comm);

// Every communicator of the group (global, then intra-node, then inter-node), in the same order
// on every rank; the engine knobs only on those that use the engine transport (FailedPrecondition
// when none does). InvalidArgument when the group does not use the host backend.
[[nodiscard]] Status setHostTuning(ProcessGroup& group, const HostTuning& tuning,
                                   std::chrono::milliseconds timeout);
// The global communicator's values.
[[nodiscard]] Result<HostTuningState> hostTuning(ProcessGroup& group);

}  // namespace bagua::core
