#include "multi_rank.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace bagua::testing {

std::vector<std::string> runRanks(int n, const std::function<std::string(int rank)>& body,
                                  std::chrono::milliseconds timeout) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    int done = 0;
    std::vector<std::string> results;
    std::vector<bool> finished;
  };
  auto shared = std::make_shared<Shared>();
  shared->results.assign(n, "");
  shared->finished.assign(n, false);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([shared, body, r] {
      std::string msg = body(r);
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->results[r] = std::move(msg);
      shared->finished[r] = true;
      ++shared->done;
      shared->cv.notify_all();
    });
  }
  std::vector<std::string> out;
  {
    std::unique_lock<std::mutex> lock(shared->mu);
    shared->cv.wait_for(lock, timeout, [&] { return shared->done == n; });
    out = shared->results;
    for (int r = 0; r < n; ++r) {
      if (!shared->finished[r]) {
        out[r] = "rank " + std::to_string(r) + " hung: still running after " +
                 std::to_string(timeout.count()) + " ms";
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    bool fin;
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      fin = shared->finished[r];
    }
    if (fin) {
      threads[r].join();
    } else {
      threads[r].detach();
    }
  }
  return out;
}

std::string joinFailures(const std::vector<std::string>& perRank) {
  std::string s;
  for (size_t r = 0; r < perRank.size(); ++r) {
    if (!perRank[r].empty()) {
      s += "[rank " + std::to_string(r) + "] " + perRank[r] + "\n";
    }
  }
  return s;
}

int freeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    if (fd >= 0) {
      ::close(fd);
    }
    return 0;
  }
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

}  // namespace bagua::testing
