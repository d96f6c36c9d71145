// What the multi-process GPU tools share (bagua-nccl-bench, bagua-autotune-net-live-bench): each
// forks one process per GPU before CUDA is touched and hands the NCCL unique id over a pipe
// (forkRanks, waitRanks).
// Header only; gpu_tool_dep brings what it needs (CUDA, NCCL, base). Not for library code: the
// checks exit the process.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bagua/base/cuda_check.h"

// A failed CUDA call ends the process with status 3, a failed NCCL call with 4, naming the rank,
// the call and the error (for CUDA, base's cudaStatus message).
#define BAGUA_TOOL_CHECK_CUDA(call)                                     \
  do {                                                                  \
    const ::bagua::Status bagua_tool_status_ = BAGUA_CUDA_STATUS(call); \
    if (!bagua_tool_status_.isOk()) {                                   \
      std::fprintf(stderr, "rank %d: %s\n", ::bagua::tools::toolRank(), \
                   bagua_tool_status_.message().c_str());               \
      std::exit(3);                                                     \
    }                                                                   \
  } while (0)

#define BAGUA_TOOL_CHECK_NCCL(call)                                                       \
  do {                                                                                    \
    ncclResult_t r_ = (call);                                                             \
    if (r_ != ncclSuccess) {                                                              \
      std::fprintf(stderr, "rank %d: %s failed: %s\n", ::bagua::tools::toolRank(), #call, \
                   ncclGetErrorString(r_));                                               \
      std::exit(4);                                                                       \
    }                                                                                     \
  } while (0)

namespace bagua::tools {

// The rank the process runs as (-1 before it is known), printed by the checks above.
inline int& toolRank() {
  static int rank = -1;
  return rank;
}

// Reads or writes all n bytes of a pipe; false on EOF or an error.
inline bool readAll(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) {
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

inline bool writeAll(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t r = ::write(fd, p, n);
    if (r <= 0) {
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The ranks forkRanks started: rank r (1..n-1) at index r - 1.
struct ForkedRanks {
  ncclUniqueId id{};         // made by rank 0 after the fork, handed to every rank
  std::vector<pid_t> pids;   // the processes of ranks 1..n-1
  std::vector<int> results;  // read ends of their result pipes (what each wrote to its resultFd)
};

// Forks ranks 1..ranks-1 before CUDA is touched (a CUDA context does not survive fork). Rank r
// reads the NCCL unique id from rank 0 over a pipe and ends with _exit(child(r, id, resultFd)),
// resultFd being the write end of a pipe back to rank 0 (a tool may leave it unused); without an
// id it ends with status 5. The caller then goes on as rank 0: it makes the id (a failed NCCL
// call ends the process, BAGUA_TOOL_CHECK_NCCL) and hands it to every rank. False, after a line
// on stderr, when a pipe, a fork or the hand-over fails.
template <typename Child>
bool forkRanks(int ranks, Child child, ForkedRanks* out) {
  std::vector<int> idWrite;
  for (int r = 1; r < ranks; ++r) {
    int idPipe[2];
    int resultPipe[2];
    if (::pipe(idPipe) != 0 || ::pipe(resultPipe) != 0) {
      std::perror("pipe");
      return false;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      return false;
    }
    if (pid == 0) {
      toolRank() = r;
      ncclUniqueId id;
      if (!readAll(idPipe[0], &id, sizeof(id))) {
        std::fprintf(stderr, "rank %d: no NCCL id from rank 0\n", r);
        _exit(5);
      }
      _exit(child(r, id, resultPipe[1]));
    }
    // Rank 0 keeps its ends only, so a rank that dies unwritten reads as EOF, not a hang.
    ::close(idPipe[0]);
    ::close(resultPipe[1]);
    idWrite.push_back(idPipe[1]);
    out->pids.push_back(pid);
    out->results.push_back(resultPipe[0]);
  }
  toolRank() = 0;
  BAGUA_TOOL_CHECK_NCCL(ncclGetUniqueId(&out->id));
  for (int r = 1; r < ranks; ++r) {
    const bool sent = writeAll(idWrite[r - 1], &out->id, sizeof(out->id));
    ::close(idWrite[r - 1]);
    if (!sent) {
      std::fprintf(stderr, "rank 0: cannot hand the NCCL id to rank %d\n", r);
      return false;
    }
  }
  return true;
}

// Waits for every forked rank. False, naming each on stderr, if one did not exit with status 0.
inline bool waitRanks(const ForkedRanks& f) {
  bool ok = true;
  for (size_t i = 0; i < f.pids.size(); ++i) {
    int status = 0;
    ::waitpid(f.pids[i], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "rank 0: rank %zu exited with status %d\n", i + 1, status);
      ok = false;
    }
  }
  return ok;
}

}  // namespace bagua::tools
