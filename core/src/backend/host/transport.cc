#include "backend/host/transport.h"

#include <algorithm>
#include <cstring>

namespace bagua::core::host {

Status TransportBase::startExchange(std::span<const SendOp> sends, std::span<RecvOp> recvs) {
  if (aborted()) {
    return abortedStatus();
  }
  remoteSends_.clear();
  remoteRecvs_.clear();
  selfSends_.clear();
  selfRecvs_.clear();
  for (const SendOp& s : sends) {
    if (s.peer < 0 || s.peer >= size_) {
      return BAGUA_ERROR(kInvalidArgument, "send to rank %d of a group of %d", s.peer, size_);
    }
    if (s.peer == rank_) {
      selfSends_.push_back(&s);
    } else if (s.len > 0) {
      remoteSends_.push_back(&s);
    }
  }
  for (RecvOp& r : recvs) {
    if (r.peer < 0 || r.peer >= size_) {
      return BAGUA_ERROR(kInvalidArgument, "recv from rank %d of a group of %d", r.peer, size_);
    }
    if (r.peer == rank_) {
      selfRecvs_.push_back(&r);
    } else if (r.len > 0) {
      remoteRecvs_.push_back(&r);
    }
  }
  if (selfSends_.size() != selfRecvs_.size()) {
    return BAGUA_ERROR(kInternal, "rank %d: %zu self sends but %zu self receives", rank_,
                       selfSends_.size(), selfRecvs_.size());
  }
  for (size_t i = 0; i < selfSends_.size(); ++i) {
    const SendOp& s = *selfSends_[i];
    RecvOp& r = *selfRecvs_[i];
    if (s.len != r.len) {
      return BAGUA_ERROR(kInternal, "rank %d: self send of %zu bytes into a receive of %zu", rank_,
                         s.len, r.len);
    }
    if (s.len > 0 && r.data != s.data) {
      std::memmove(r.data, s.data, s.len);
    }
    size_t reported = 0;
    reportSegments(r, r.len, &reported);
  }
  return Status::ok();
}

void TransportBase::reportSegments(RecvOp& op, size_t arrived, size_t* reported) {
  if (!op.onSegment) {
    *reported = arrived;
    return;
  }
  const size_t seg = op.segment == 0 ? op.len : op.segment;
  while (*reported < op.len &&
         (arrived - *reported >= seg || (arrived == op.len && *reported < arrived))) {
    const size_t n = std::min(seg, op.len - *reported);
    op.onSegment(*reported, n);
    *reported += n;
  }
}

}  // namespace bagua::core::host
