// A CPU-only program of the SDK: links bagua-core alone, and cpu_only_link_test.sh runs it with
// no CUDA library reachable. Two processes (a fork) rendezvous over the TCP store and all-reduce
// on the host backend; rank 0 then asks for the NCCL backend.
//
//   cpu_only_program refused '<words>'   the NCCL backend must fail with kFailedPrecondition
//                                        containing <words>, and no CUDA or NCCL library may be
//                                        loaded in either rank
//   cpu_only_program loads               (the CUDA half beside libbagua_core) asking for the NCCL
//                                        backend must load libbagua_core_cuda: the communicator
//                                        is made, or it fails for a reason other than the library
//
// Exit 0 when every check held, 1 with a message on stderr otherwise, 2 for bad usage.
#include <link.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bagua/core/process_group.h"
#include "bagua/core/store.h"

namespace {

using bagua::Status;
using namespace bagua::core;
using std::chrono::milliseconds;

int failed(const std::string& who, const std::string& what) {
  std::fprintf(stderr, "cpu_only_program %s: %s\n", who.c_str(), what.c_str());
  return 1;
}

// The loaded objects whose name contains one of `libs`.
std::vector<std::string> loadedLibraries(const std::vector<std::string>& libs) {
  struct Query {
    const std::vector<std::string>* libs;
    std::vector<std::string> found;
  } q{&libs, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        auto* query = static_cast<Query*>(out);
        const std::string name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        for (const std::string& lib : *query->libs) {
          if (name.find(lib) != std::string::npos) {
            query->found.push_back(name);
          }
        }
        return 0;
      },
      &q);
  return q.found;
}

// One rank: joins the 2-rank group, all-reduces, and (rank 0) asks for the NCCL backend.
int runRank(int rank, int port, bool refused, const std::string& words) {
  const std::string who = "rank " + std::to_string(rank);
  TcpStoreOptions so;
  so.port = port;
  so.connectTimeout = milliseconds(20000);
  auto store = TcpStore::connect(so);
  if (!store.isOk()) {
    return failed(who, "store: " + store.status().message());
  }
  std::shared_ptr<Store> shared(std::move(*store));
  ProcessGroupOptions opts;
  opts.rank = rank;
  opts.worldSize = 2;
  opts.hierarchical = false;
  opts.rendezvousTimeout = milliseconds(20000);
  opts.collectiveTimeout = milliseconds(20000);
  auto pg = ProcessGroup::create(shared, opts);
  if (!pg.isOk()) {
    return failed(who, "process group: " + pg.status().message());
  }
  // Rank r holds (r + 1) * i: the sum over both ranks is 3 * i, exact in float.
  const size_t n = 1000;
  std::vector<float> data(n);
  for (size_t i = 0; i < n; ++i) {
    data[i] = static_cast<float>((rank + 1) * i);
  }
  Status s = (*pg)
                 ->global()
                 .allReduce(data.data(), data.data(), n, DataType::kF32, ReduceOp::kSum)
                 ->wait(milliseconds(20000));
  if (!s.isOk()) {
    return failed(who, "all-reduce: " + s.message());
  }
  for (size_t i = 0; i < n; ++i) {
    if (data[i] != static_cast<float>(3 * i)) {
      return failed(who, "all-reduce: element " + std::to_string(i) + " is " +
                             std::to_string(data[i]) + ", not " + std::to_string(3 * i));
    }
  }
  std::string nccl;
  if (rank == 0) {
    ProcessGroupOptions one = opts;
    one.cudaDevice = 0;  // where there is a GPU, a real 1-rank NCCL communicator
    auto comm = createCommunicator(Backend::kNccl, *shared, 0, 1, one);
    if (refused) {
      if (comm.isOk()) {
        return failed(who, "the NCCL backend was created with no CUDA library reachable");
      }
      if (comm.status().code() != bagua::StatusCode::kFailedPrecondition ||
          comm.status().message().find(words) == std::string::npos) {
        return failed(who, "the NCCL backend's error is not kFailedPrecondition with '" + words +
                               "': " + comm.status().message());
      }
      nccl = "; NCCL backend refused: " + comm.status().message();
    } else {
      if (!comm.isOk() &&
          comm.status().message().find("is not installed or does not load") != std::string::npos) {
        return failed(who, "the CUDA half did not load: " + comm.status().message());
      }
      if (loadedLibraries({"libbagua_core_cuda.so"}).empty()) {
        return failed(who, "asking for the NCCL backend did not load libbagua_core_cuda");
      }
      nccl = "; NCCL backend: libbagua_core_cuda loaded, " +
             (comm.isOk() ? std::string("communicator made") : comm.status().message());
    }
  }
  if (refused) {
    const std::vector<std::string> loaded = loadedLibraries({"libcudart", "libcuda.so", "libnccl"});
    if (!loaded.empty()) {
      return failed(who, "CUDA/NCCL libraries loaded: " + loaded.front());
    }
    nccl += "; no CUDA or NCCL library loaded";
  }
  std::printf("cpu_only_program rank %d/2: host all-reduce of %zu floats correct%s\n", rank, n,
              nccl.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool refused = argc == 3 && std::string(argv[1]) == "refused";
  if (!refused && !(argc == 2 && std::string(argv[1]) == "loads")) {
    std::fprintf(stderr, "usage: cpu_only_program refused '<words>' | cpu_only_program loads\n");
    return 2;
  }
  const std::string words = refused ? argv[2] : "";
  // Fork first (rank 1 is a single-threaded copy); rank 0 then starts the store's server and
  // sends its port down the pipe.
  int fds[2];
  if (pipe(fds) != 0) {
    return failed("rank 0", "pipe failed");
  }
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) {
    return failed("rank 0", "fork failed");
  }
  if (child == 0) {
    close(fds[1]);
    int port = 0;
    if (read(fds[0], &port, sizeof(port)) != static_cast<ssize_t>(sizeof(port)) || port <= 0) {
      _exit(failed("rank 1", "no store port from rank 0"));
    }
    _exit(runRank(1, port, refused, words));
  }
  close(fds[0]);
  auto server = TcpStoreServer::start("127.0.0.1", 0);
  const int port = server.isOk() ? (*server)->port() : -1;
  const bool sent = write(fds[1], &port, sizeof(port)) == static_cast<ssize_t>(sizeof(port));
  close(fds[1]);
  if (!server.isOk() || !sent) {
    waitpid(child, nullptr, 0);
    return failed("rank 0", "store server: " + server.status().message());
  }
  const int mine = runRank(0, port, refused, words);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return failed("rank 0", "rank 1 failed (wait status " + std::to_string(status) + ")");
  }
  return mine;
}
