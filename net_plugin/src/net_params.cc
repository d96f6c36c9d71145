#include "bagua/net/params.h"

#include <sys/socket.h>

#include "bagua/net/engine.h"

namespace bagua::net {

NetParams& netParams() {
  static NetParams params;
  return params;
}

Status validateAddressFamily(const std::string& value) {
  Result<int> f = parseAddressFamily(value);
  return f.isOk() ? Status::ok() : f.status();
}

Result<EngineOptions> EngineOptions::fromParams() {
  NetParams& p = netParams();
  EngineOptions o;
  BAGUA_ASSIGN_OR_RETURN(int64_t streams, p.nStreams.get());
  o.nStreams = static_cast<int>(streams);
  BAGUA_ASSIGN_OR_RETURN(o.minChunkBytes, p.minChunk.get());
  BAGUA_ASSIGN_OR_RETURN(o.maxChunkBytes, p.maxChunk.get());
  BAGUA_ASSIGN_OR_RETURN(o.loneChunkBytes, p.loneChunk.get());
  BAGUA_ASSIGN_OR_RETURN(std::string chunkPolicy, p.chunkPolicy.get());
  // A floor set by hand pins the rule, unless the policy itself was chosen too.
  const bool floorPinned =
      p.minChunk.source() != ParamSource::kDefault || p.loneChunk.source() != ParamSource::kDefault;
  o.adaptiveChunks = chunkPolicy == "adaptive" &&
                     (p.chunkPolicy.source() != ParamSource::kDefault || !floorPinned);
  BAGUA_ASSIGN_OR_RETURN(o.inlineBytes, p.inlineBytes.get());
  BAGUA_ASSIGN_OR_RETURN(o.socketBufferBytes, p.socketBuffer.get());
  BAGUA_ASSIGN_OR_RETURN(o.notSentLowatBytes, p.notSentLowat.get());
  BAGUA_ASSIGN_OR_RETURN(o.timeoutMs, p.timeoutMs.get());
  BAGUA_ASSIGN_OR_RETURN(o.spinUs, p.spinUs.get());
  BAGUA_ASSIGN_OR_RETURN(o.helloTimeoutMs, p.helloTimeoutMs.get());
  BAGUA_ASSIGN_OR_RETURN(o.slowStreamBytesPerSec, p.slowStreamRate.get());
  BAGUA_ASSIGN_OR_RETURN(int64_t mbps, p.sendRateMbps.get());
  o.sendRateMbps = static_cast<uint64_t>(mbps);
  BAGUA_RETURN_IF_ERROR(o.validate());
  return o;
}

Status EngineOptions::validate() const {
  if (nStreams < 1 || nStreams > kMaxStreams) {
    return BAGUA_ERROR(kInvalidArgument, "nStreams %d outside 1..%d", nStreams, kMaxStreams);
  }
  if (minChunkBytes < 1 || maxChunkBytes < minChunkBytes) {
    return BAGUA_ERROR(
        kInvalidArgument,
        "chunk sizes: min %llu must be >= 1 and <= max %llu (BAGUA_NET_MIN_CHUNKSIZE "
        "<= BAGUA_NET_MAX_CHUNKSIZE)",
        static_cast<unsigned long long>(minChunkBytes),
        static_cast<unsigned long long>(maxChunkBytes));
  }
  if (maxChunkBytes > (uint64_t{1} << 30)) {
    return BAGUA_ERROR(kInvalidArgument, "max chunk %llu above 1 GiB",
                       static_cast<unsigned long long>(maxChunkBytes));
  }
  if (inlineBytes > 4 * 1024 * 1024) {
    return BAGUA_ERROR(kInvalidArgument, "inline limit %llu above 4 MiB",
                       static_cast<unsigned long long>(inlineBytes));
  }
  if (timeoutMs < 1 || helloTimeoutMs < 1 || spinUs < 0) {
    return BAGUA_ERROR(kInvalidArgument, "timeouts must be positive and spin non-negative");
  }
  return Status::ok();
}

}  // namespace bagua::net
