// A helper process for tests/core/control_plane_test.cc: the part of rank 0 an outsider attacks,
// in a process of its own so that its memory and descriptor limit are its own.
//
//   control_worker serve-store KEY [NOFILE]
//       hosts a TCP store on 127.0.0.1 (a free port) under the job key KEY ("-": none), with
//       RLIMIT_NOFILE lowered to NOFILE first when given; prints "port P" on stdout, then serves
//       until its stdin closes. Log lines (the store's warnings) go to stderr.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bagua/core/job_key.h"
#include "bagua/core/store.h"

namespace {

using namespace bagua;
using namespace bagua::core;

int fail(const Status& s) {
  std::fprintf(stderr, "FAILED: %s\n", s.toString().c_str());
  return 3;
}

int serveStore(const std::string& secret, long nofile) {
  TcpStoreServerOptions o;
  if (secret == "-") {
    o.key = JobKey();
  } else {
    Result<JobKey> k = JobKey::fromSecret(secret);
    if (!k.isOk()) {
      return fail(k.status());
    }
    o.key = *k;
  }
  if (nofile > 0) {
    rlimit lim{static_cast<rlim_t>(nofile), static_cast<rlim_t>(nofile)};
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) {
      return fail(BAGUA_ERRNO(errno, "setrlimit(RLIMIT_NOFILE)"));
    }
  }
  auto server = TcpStoreServer::start("127.0.0.1", 0, o);
  if (!server.isOk()) {
    return fail(server.status());
  }
  std::printf("port %d\n", (*server)->port());
  std::fflush(stdout);
  char buf[64];
  while (::read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "serve-store") {
    return serveStore(argv[2], argc >= 4 ? std::atol(argv[3]) : 0);
  }
  std::fprintf(stderr, "usage: control_worker serve-store KEY [NOFILE]\n");
  return 2;
}
