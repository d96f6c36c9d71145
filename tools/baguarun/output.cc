#include "output.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <utility>

namespace bagua::baguarun {

namespace {

// A line longer than this is written in pieces (a child printing without newlines).
constexpr size_t kMaxLine = 64 * 1024;

}  // namespace

void writeAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return;
    }
    done += static_cast<size_t>(n);
  }
}

bool makePipe(int fds[2]) {
  return ::pipe2(fds, O_CLOEXEC) == 0;
}

LinePump::LinePump(int in, int out, std::string prefix, LineHook onLine)
    : in_(in), out_(out), prefix_(std::move(prefix)), onLine_(std::move(onLine)) {
  ::fcntl(in_, F_SETFL, ::fcntl(in_, F_GETFL) | O_NONBLOCK);
}

LinePump::~LinePump() {
  if (in_ >= 0) {
    ::close(in_);
  }
}

void LinePump::emit(std::string_view line) {
  if (onLine_) {
    onLine_(line);
  }
  std::string text = prefix_;
  text.append(line);
  text += '\n';
  writeAll(out_, text);
}

void LinePump::pump() {
  if (in_ < 0) {
    return;
  }
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(in_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    }
    if (n <= 0) {  // end of file, or an error that ends this pipe as well
      finish();
      return;
    }
    partial_.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
      emit(std::string_view(partial_).substr(start, nl - start));
    }
    partial_.erase(0, start);
    if (partial_.size() >= kMaxLine) {
      emit(partial_);
      partial_.clear();
    }
  }
}

void LinePump::finish() {
  if (!partial_.empty()) {
    emit(partial_);
    partial_.clear();
  }
  if (in_ >= 0) {
    ::close(in_);
    in_ = -1;
  }
}

bool pollPumps(Pumps& pumps, int watchFd, int timeoutMs) {
  std::vector<pollfd> fds;
  std::vector<LinePump*> owners;
  for (auto& p : pumps) {
    if (p->open()) {
      fds.push_back({p->fd(), POLLIN, 0});
      owners.push_back(p.get());
    }
  }
  if (watchFd >= 0) {
    fds.push_back({watchFd, POLLIN, 0});
  }
  if (::poll(fds.data(), fds.size(), timeoutMs) <= 0) {
    return false;  // timeout, or a signal (the caller's loop looks at it)
  }
  for (size_t i = 0; i < owners.size(); ++i) {
    if (fds[i].revents != 0) {
      owners[i]->pump();
    }
  }
  return watchFd >= 0 && fds.back().revents != 0;
}

void drainPumps(Pumps& pumps, int timeoutMs) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  for (;;) {
    bool any = false;
    for (auto& p : pumps) {
      any = any || p->open();
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (!any || left.count() <= 0) {
      break;
    }
    pollPumps(pumps, -1, static_cast<int>(left.count()));
  }
  for (auto& p : pumps) {
    p->finish();
  }
}

}  // namespace bagua::baguarun
