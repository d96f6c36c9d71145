// Whole-buffer socket I/O: the one blocking loop under the engine's data and control streams,
// core's TCP store client and the host backend's connection hello.
//
// Contract: moves every byte or fails. Retries EINTR and short transfers; never raises SIGPIPE
// (MSG_NOSIGNAL). Works on blocking and non-blocking sockets alike: without a deadline the kernel
// waits inside the call (one system call per transfer on the engine's blocking streams); with one,
// the call never blocks inside send/recv and waits in poll(2) until the socket is ready or the
// deadline passes.
// Errors: kRemoteError when the peer closed the connection before every byte arrived (recv) or
// reset it; kDeadlineExceeded at the deadline; kSystemError (or the errno's own code, see
// errnoStatus) for other OS errors. After an error the stream's framing is lost (part of the
// buffer may have moved): close the socket. Messages name the direction and the progress
// ("recv timed out after 12 of 64 bytes"); callers add their own context (Status::withContext).
// Thread safety: none of its own; at most one thread per direction of a socket.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstddef>

#include "bagua/base/status.h"

namespace bagua::net {

using IoClock = std::chrono::steady_clock;
// No deadline: wait as long as the kernel does (a dead peer is bounded by TCP keepalive and
// TCP_USER_TIMEOUT where the socket has them, as the engine's do).
inline constexpr IoClock::time_point kNoDeadline = IoClock::time_point::max();

enum class IoDirection { kSend, kRecv };

// Moves every byte of iov[0, iovcnt) in `direction`. The iovec array is consumed (its entries are
// advanced as bytes move; the buffers themselves are only read or written). *cleanEof (optional,
// recv) is set when the peer closed before the first byte: an orderly end between records.
Status transferAllV(int fd, IoDirection direction, iovec* iov, int iovcnt,
                    IoClock::time_point deadline = kNoDeadline, bool* cleanEof = nullptr);

// Gather send (e.g. a header and its payload in one system call).
Status sendAllV(int fd, iovec* iov, int iovcnt, IoClock::time_point deadline = kNoDeadline);
Status sendAll(int fd, const void* data, size_t length, IoClock::time_point deadline = kNoDeadline);
Status recvAll(int fd, void* data, size_t length, IoClock::time_point deadline = kNoDeadline,
               bool* cleanEof = nullptr);

}  // namespace bagua::net
