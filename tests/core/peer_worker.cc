// A worker for tests/core/vanished_host_test.cc, run inside a network namespace (one per "host"):
//   peer_worker allreduce     env:// rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): all-reduces
//                             1 MiB of floats in a loop, "iter N" on stdout after each, checking
//                             every element; on the first error prints "FAILED: <error>" on
//                             stderr, destroys the group and exits 3
//   peer_worker store-server  hosts a TCP store on MASTER_ADDR:MASTER_PORT until killed
//   peer_worker store-get     connects to it and blocks in get("never", 120 s); prints the error
//                             as above and exits 3 (0 would mean the key appeared)
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bagua/core/params.h"
#include "bagua/core/process_group.h"
#include "bagua/core/store.h"

namespace {

using namespace bagua;
using namespace bagua::core;

int fail(const Status& s) {
  std::fprintf(stderr, "FAILED: %s\n", s.toString().c_str());
  std::fflush(stderr);
  return 3;
}

int allReduceLoop() {
  ProcessGroupOptions o;
  o.hierarchical = false;
  auto pg = ProcessGroup::initFromEnv(o);
  if (!pg.isOk()) {
    return fail(pg.status());
  }
  const int n = (*pg)->size();
  const int rank = (*pg)->rank();
  std::vector<float> buf(1 << 18);
  for (long iter = 0;; ++iter) {
    for (size_t i = 0; i < buf.size(); ++i) {
      buf[i] = static_cast<float>((rank + 1) * ((i + iter) % 7));
    }
    WorkPtr w = (*pg)->global().allReduce(buf.data(), buf.data(), buf.size(), DataType::kF32,
                                          ReduceOp::kSum);
    Status s = w->wait(std::chrono::hours(1));
    if (!s.isOk()) {
      return fail(s);
    }
    for (size_t i = 0; i < buf.size(); ++i) {
      const float want = static_cast<float>(n * (n + 1) / 2 * ((i + iter) % 7));
      if (buf[i] != want) {
        std::fprintf(stderr, "FAILED: wrong sum at %zu: %g, want %g\n", i, buf[i], want);
        return 4;
      }
    }
    std::printf("iter %ld\n", iter);
    std::fflush(stdout);
  }
}

int storeServer() {
  auto e = readEnvInit();
  if (!e.isOk()) {
    return fail(e.status());
  }
  auto server = TcpStoreServer::start(e->masterAddr, e->masterPort);
  if (!server.isOk()) {
    return fail(server.status());
  }
  std::printf("serving\n");
  std::fflush(stdout);
  while (true) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

int storeGet() {
  auto e = readEnvInit();
  if (!e.isOk()) {
    return fail(e.status());
  }
  TcpStoreOptions so;
  so.host = e->masterAddr;
  so.port = e->masterPort;
  auto c = TcpStore::connect(so);
  if (!c.isOk()) {
    return fail(c.status());
  }
  std::printf("connected\n");
  std::fflush(stdout);
  auto v = (*c)->get("never", std::chrono::seconds(120));
  if (!v.isOk()) {
    return fail(v.status());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "allreduce") {
    return allReduceLoop();
  }
  if (mode == "store-server") {
    return storeServer();
  }
  if (mode == "store-get") {
    return storeGet();
  }
  std::fprintf(stderr, "usage: %s allreduce|store-server|store-get\n", argv[0]);
  return 2;
}
