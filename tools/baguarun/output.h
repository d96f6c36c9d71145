// Children's output, line by line, with a prefix: the SSH start copies each host's stdout and
// stderr with "[HOST] " before every line, and the baguarun it starts on each host copies each
// worker's with "[rank R] " (--rank_prefix). A line is written with one write(), so lines from
// different children never interleave mid-line (pipes: up to PIPE_BUF bytes).
//
// Threads: one, the launcher's polling thread, owns every pump.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace bagua::baguarun {

// A pipe with both ends close-on-exec (dup2 onto 0/1/2 in a child clears it). False on failure.
bool makePipe(int fds[2]);

// Writes all of `text` to `fd` (retrying short writes and EINTR); stops silently when the other
// end is gone (a closed terminal, an ssh that exited: its exit status says why).
void writeAll(int fd, const std::string& text);

// Copies a pipe's lines to `out` (not owned), each after `prefix`. Owns the pipe's read end.
class LinePump {
 public:
  using LineHook = std::function<void(std::string_view line)>;
  // `in` is made non-blocking. `onLine` (optional) sees every line (without its newline).
  LinePump(int in, int out, std::string prefix, LineHook onLine = nullptr);
  ~LinePump();
  LinePump(const LinePump&) = delete;
  LinePump& operator=(const LinePump&) = delete;

  int fd() const { return in_; }
  bool open() const { return in_ >= 0; }
  // Reads what is there and writes every complete line; at end of file writes the unfinished
  // line and closes the pipe.
  void pump();
  // Writes the unfinished line, if any, and closes the pipe (a child that never closed it).
  void finish();

 private:
  void emit(std::string_view line);

  int in_;
  int out_;
  std::string prefix_;
  LineHook onLine_;
  std::string partial_;
};

using Pumps = std::vector<std::unique_ptr<LinePump>>;

// Waits up to `timeoutMs` for output on any open pump or for `watchFd` (-1: none) to become
// readable or hang up, and pumps the ready ones. Returns true when `watchFd` is ready.
bool pollPumps(Pumps& pumps, int watchFd, int timeoutMs);

// After the children ended: pumps until every pipe is at end of file or `timeoutMs` passed (a
// child's own child may still hold a pipe), then writes what is left.
void drainPumps(Pumps& pumps, int timeoutMs);

}  // namespace bagua::baguarun
