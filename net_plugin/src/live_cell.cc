// The live settings (engine.h, LiveSettings): their validation, the seqlock cell that holds them
// and the process-wide cell every send comm reads. See comm.h for LiveCell's contract.
#include <mutex>

#include "comm.h"
#include "wire.h"

namespace bagua::net {

Status LiveSettings::validate() const {
  if (activeStreams < 0 || activeStreams > kMaxStreams) {
    return BAGUA_ERROR(kInvalidArgument, "live active streams %d outside 0..%d (0: all)",
                       activeStreams, kMaxStreams);
  }
  for (uint64_t v : {minChunkBytes, maxChunkBytes}) {
    if (v > wire::kMaxChunkWire) {
      return BAGUA_ERROR(kInvalidArgument, "live chunk bound %llu above 1 GiB",
                         static_cast<unsigned long long>(v));
    }
  }
  if (minChunkBytes > 0 && maxChunkBytes > 0 && maxChunkBytes < minChunkBytes) {
    return BAGUA_ERROR(kInvalidArgument, "live chunk bounds: min %llu above max %llu",
                       static_cast<unsigned long long>(minChunkBytes),
                       static_cast<unsigned long long>(maxChunkBytes));
  }
  return Status::ok();
}

void LiveCell::store(const LiveSettings& settings) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t s = seq_.load(std::memory_order_relaxed);
  seq_.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  active_.store(settings.activeStreams, std::memory_order_relaxed);
  minChunk_.store(settings.minChunkBytes, std::memory_order_relaxed);
  maxChunk_.store(settings.maxChunkBytes, std::memory_order_relaxed);
  seq_.store(s + 2, std::memory_order_release);
}

LiveSettings LiveCell::load() const {
  for (;;) {
    const uint64_t before = seq_.load(std::memory_order_acquire);
    if ((before & 1) != 0) {
      cpuRelax();
      continue;
    }
    LiveSettings r;
    r.activeStreams = active_.load(std::memory_order_relaxed);
    r.minChunkBytes = minChunk_.load(std::memory_order_relaxed);
    r.maxChunkBytes = maxChunk_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (seq_.load(std::memory_order_relaxed) == before) {
      return r;
    }
  }
}

LiveCell& processLiveCell() {
  static LiveCell cell;
  return cell;
}

Status setProcessLiveSettings(const LiveSettings& settings) {
  BAGUA_RETURN_IF_ERROR(settings.validate());
  processLiveCell().store(settings);
  return Status::ok();
}

LiveSettings processLiveSettings() {
  return processLiveCell().load();
}

}  // namespace bagua::net
