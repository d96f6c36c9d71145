// Live tuning of the host backend (bagua/core/host_tuning.h): setTuning is a collective run by
// the worker like any other operation, so the values change between the same two collectives on
// every rank; the free functions apply it to a communicator or to a process group's.
#include "bagua/core/host_tuning.h"

#include "backend/host/host_communicator.h"
#include "bagua/base/logging.h"
#include "bagua/core/params.h"
#include "bagua/core/process_group.h"

namespace bagua::core {

namespace host {

namespace {

constexpr size_t kMinSegment = 4096;
constexpr size_t kMaxSegment = size_t{1} << 30;

// Every rank decides from the same exchanged values, so every rank reaches the same verdict.
// Per rank (kFields each): requested segment, streams, chunk; streams its transport established.
constexpr int kFields = 4;

Status judgeTuning(const std::vector<uint64_t>& all, int n) {
  for (int r = 1; r < n; ++r) {
    const uint64_t* v = &all[static_cast<size_t>(kFields * r)];
    if (v[0] != all[0] || v[1] != all[1] || v[2] != all[2]) {
      return BAGUA_ERROR(
          kInvalidArgument,
          "setHostTuning: rank %d asked for segment %llu / streams %llu / chunk "
          "%llu but rank 0 for %llu / %llu / %llu; every rank must pass the same "
          "values at the same point of the operation sequence (nothing applied)",
          r, static_cast<unsigned long long>(v[0]), static_cast<unsigned long long>(v[1]),
          static_cast<unsigned long long>(v[2]), static_cast<unsigned long long>(all[0]),
          static_cast<unsigned long long>(all[1]), static_cast<unsigned long long>(all[2]));
    }
  }
  const uint64_t seg = all[0];
  if (seg != 0 && (seg < kMinSegment || seg > kMaxSegment)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "setHostTuning: segment %llu bytes outside 4 KiB .. 1 GiB (nothing applied)",
                       static_cast<unsigned long long>(seg));
  }
  const uint64_t chunk = all[2];
  if (chunk != 0 && (chunk < kMinSegment || chunk > kMaxSegment)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "setHostTuning: engine chunk %llu bytes outside 4 KiB .. 1 GiB (nothing "
                       "applied)",
                       static_cast<unsigned long long>(chunk));
  }
  const uint64_t streams = all[1];
  if (streams != 0 || chunk != 0) {
    for (int r = 0; r < n; ++r) {
      const uint64_t est = all[static_cast<size_t>(kFields * r + 3)];
      if (est == 0) {
        return BAGUA_ERROR(kFailedPrecondition,
                           "setHostTuning: rank %d does not use the engine transport, so its "
                           "stream count / chunk size cannot be set (BAGUA_HOST_TRANSPORT=engine; "
                           "nothing applied)",
                           r);
      }
      if (streams > est) {
        return BAGUA_ERROR(kInvalidArgument,
                           "setHostTuning: %llu active streams but rank %d established %llu per "
                           "connection (BAGUA_HOST_NET_STREAMS; nothing applied)",
                           static_cast<unsigned long long>(streams), r,
                           static_cast<unsigned long long>(est));
      }
    }
  }
  return Status::ok();
}

}  // namespace

WorkPtr HostCommunicator::setTuning(const HostTuning& tuning, std::shared_ptr<Status> verdict) {
  // Nothing is refused here: a bad value is judged after the exchange, by every rank alike, so
  // that one rank's mistake cannot leave the others waiting in the exchange.
  return enqueue(strPrintf("setTuning(segment %zu, streams %d, chunk %zu)", tuning.segmentBytes,
                           tuning.engineStreams, tuning.engineChunkBytes),
                 [=, this](Deadline dl) -> Status {
                   const int n = size();
                   constexpr size_t kRecord = kFields * sizeof(uint64_t);
                   std::vector<uint64_t> all(static_cast<size_t>(kFields * n));
                   uint64_t* mine = &all[static_cast<size_t>(kFields * rank())];
                   mine[0] = tuning.segmentBytes;
                   mine[1] = static_cast<uint64_t>(static_cast<int64_t>(tuning.engineStreams));
                   mine[2] = tuning.engineChunkBytes;
                   mine[3] = static_cast<uint64_t>(transport_->establishedStreams());
                   if (n > 1) {
                     BAGUA_RETURN_IF_ERROR(ringAllGather(reinterpret_cast<uint8_t*>(all.data()),
                                                         equalChunks(n, kRecord), rank(), dl));
                   }
                   Status v = judgeTuning(all, n);
                   if (v.isOk() && (all[1] != 0 || all[2] != 0)) {
                     v = transport_->setEngineLive(static_cast<int>(all[1]), all[2]);
                   }
                   if (v.isOk() && all[0] != 0) {
                     options_.segmentBytes = all[0];
                     transport_->setPieceBytes(all[0]);
                     segmentNow_.store(all[0], std::memory_order_relaxed);
                   }
                   if (v.isOk()) {
                     BAGUA_LOG_DEBUG(
                         kLogCore, "rank %d: host tuning now segment %zu bytes, %d active streams",
                         rank(), options_.segmentBytes, transport_->activeStreams());
                   }
                   *verdict = std::move(v);
                   return Status::ok();
                 });
}

HostTuningState HostCommunicator::tuning() const {
  HostTuningState st;
  st.segmentBytes = segmentNow_.load(std::memory_order_relaxed);
  st.establishedStreams = transport_->establishedStreams();
  st.activeStreams = transport_->activeStreams();
  st.engineChunkBytes = transport_->engineChunkBytes();
  st.engineMinChunkBytes = transport_->engineMinChunkBytes();
  st.transport = st.establishedStreams > 0 ? "engine" : "socket";
  return st;
}

}  // namespace host

Status setHostTuning(Communicator& comm, const HostTuning& tuning,
                     std::chrono::milliseconds timeout) {
  auto* hc = dynamic_cast<host::HostCommunicator*>(&comm);
  if (hc == nullptr) {
    return BAGUA_ERROR(kInvalidArgument,
                       "setHostTuning: the communicator uses the %s backend, not the host backend",
                       comm.backendName().c_str());
  }
  auto verdict = std::make_shared<Status>();
  WorkPtr w = hc->setTuning(tuning, verdict);
  BAGUA_RETURN_IF_ERROR(w->wait(timeout));
  return *verdict;
}

Result<HostTuningState> hostTuning(const Communicator& comm) {
  const auto* hc = dynamic_cast<const host::HostCommunicator*>(&comm);
  if (hc == nullptr) {
    return BAGUA_ERROR(kInvalidArgument,
                       "hostTuning: the communicator uses the %s backend, not the host backend",
                       comm.backendName().c_str());
  }
  return hc->tuning();
}

Status setHostTuning(ProcessGroup& group, const HostTuning& tuning,
                     std::chrono::milliseconds timeout) {
  // The stream count goes to the communicators on the engine transport only (a node's intra
  // group may run over shared memory while the global one uses the engine); each communicator's
  // transport is chosen collectively, so every rank of it skips or applies alike.
  std::vector<Communicator*> comms = {&group.global(), group.intraNode(), group.interNode()};
  bool anyEngine = false;
  for (Communicator* c : comms) {
    if (c != nullptr) {
      BAGUA_ASSIGN_OR_RETURN(HostTuningState st, hostTuning(*c));
      anyEngine = anyEngine || st.establishedStreams > 0;
    }
  }
  if ((tuning.engineStreams != 0 || tuning.engineChunkBytes != 0) && !anyEngine) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "setHostTuning: no communicator of the group uses the engine transport, "
                       "so there is no stream count / chunk size to set "
                       "(BAGUA_HOST_TRANSPORT=engine)");
  }
  for (Communicator* c : comms) {
    if (c == nullptr) {
      continue;
    }
    HostTuning t = tuning;
    BAGUA_ASSIGN_OR_RETURN(HostTuningState st, hostTuning(*c));
    if (st.establishedStreams == 0) {
      t.engineStreams = 0;
      t.engineChunkBytes = 0;
    }
    BAGUA_RETURN_IF_ERROR(setHostTuning(*c, t, timeout));
  }
  return Status::ok();
}

Result<HostTuningState> hostTuning(ProcessGroup& group) {
  return hostTuning(group.global());
}

}  // namespace bagua::core
