// RedisStore on hiredis (compiled only when hiredis is found; redis_store_stub.cc otherwise).
#include "bagua/dataset_cache/redis_store.h"

#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>

#include <hiredis/hiredis.h>

#include "bagua/base/crypto.h"
#include "bagua/base/logging.h"
#include "bagua/base/params.h"
#include "bagua/dataset_cache/params.h"
#include "hash.h"

namespace bagua::cache {

bool redisAvailable() {
  return true;
}

namespace {

using Clock = std::chrono::steady_clock;

timeval toTimeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

// hiredis writes with write(2), which raises SIGPIPE when the server has gone away. A library
// must not change the process's signal disposition, so each command blocks SIGPIPE in the
// calling thread and consumes one it caused before unblocking.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipeSet_);
    sigaddset(&pipeSet_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    wasPending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipeSet_, &old_);
  }
  ~SigpipeGuard() {
    if (!wasPending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        timespec zero{0, 0};
        sigtimedwait(&pipeSet_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipeSet_;
  sigset_t old_;
  bool wasPending_ = false;
};

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

}  // namespace

struct RedisStore::Server {
  RedisHost host;
  std::string name;  // "host:port" for messages

  std::mutex mu;                    // guards the fields below
  std::vector<redisContext*> idle;  // connections ready for use
  bool down = false;
  Clock::time_point retryAt;  // while down: when the next reconnect may be tried
  std::string lastError;

  ~Server() {
    for (redisContext* c : idle) {
      redisFree(c);
    }
  }
};

// A borrowed connection; returned to the pool when healthy, closed (and the server marked down)
// when a command failed on it.
class RedisStore::Conn {
 public:
  Conn(RedisStore& store, Server& server) : store_(store), server_(server) {}
  ~Conn() {
    if (ctx_ == nullptr) {
      return;
    }
    if (healthy_) {
      std::lock_guard<std::mutex> lock(server_.mu);
      server_.idle.push_back(ctx_);
    } else {
      redisFree(ctx_);
    }
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  Status open() {
    {
      std::lock_guard<std::mutex> lock(server_.mu);
      if (server_.down) {
        auto now = Clock::now();
        if (now < server_.retryAt) {
          auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(server_.retryAt - now);
          return BAGUA_ERROR(kUnavailable, "redis %s is down (%s); next reconnect in %lld ms",
                             server_.name.c_str(), server_.lastError.c_str(),
                             static_cast<long long>(ms.count()));
        }
        // This caller probes; the others keep failing fast meanwhile.
        server_.retryAt = now + store_.options_.retryInterval;
      } else if (!server_.idle.empty()) {
        ctx_ = server_.idle.back();
        server_.idle.pop_back();
        return Status::ok();
      }
    }
    timeval tv = toTimeval(store_.options_.timeout);
    redisContext* c = redisConnectWithTimeout(server_.host.host.c_str(), server_.host.port, tv);
    if (c == nullptr || c->err != 0) {
      std::string why = c != nullptr ? c->errstr : "out of memory";
      if (c != nullptr) {
        redisFree(c);
      }
      markDown(why);
      return BAGUA_ERROR(kUnavailable, "redis %s unreachable: %s", server_.name.c_str(),
                         why.c_str());
    }
    if (redisSetTimeout(c, tv) != REDIS_OK) {
      std::string why = c->errstr;
      redisFree(c);
      markDown(why);
      return BAGUA_ERROR(kUnavailable, "redis %s: setting the timeout failed: %s",
                         server_.name.c_str(), why.c_str());
    }
    if (!server_.host.password.empty()) {
      SigpipeGuard guard;
      auto* r = static_cast<redisReply*>(
          redisCommand(c, "AUTH %b", server_.host.password.data(), server_.host.password.size()));
      const bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
      std::string why = r == nullptr                   ? std::string(c->errstr)
                        : r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len)
                                                       : std::string("unexpected reply");
      if (r != nullptr) {
        freeReplyObject(r);
      }
      if (!ok) {
        redisFree(c);
        markDown("AUTH failed: " + why);
        return BAGUA_ERROR(kUnavailable, "redis %s refused the password: %s", server_.name.c_str(),
                           why.c_str());
      }
    }
    ctx_ = c;
    std::lock_guard<std::mutex> lock(server_.mu);
    if (server_.down) {
      server_.down = false;
      BAGUA_LOG_DEBUG(kLogCache, "redis %s reachable again", server_.name.c_str());
    }
    return Status::ok();
  }

  // Runs one command. A connection failure marks the server down (kUnavailable); an error reply
  // keeps the connection (kResourceExhausted for OOM, kRemoteError otherwise).
  Result<Reply> command(std::span<const char*> argv, std::span<size_t> lens, const char* what) {
    BAGUA_RETURN_IF_ERROR(send(argv, lens, what));
    return receive(what);
  }

  // Pipelining across servers: send() formats the command and writes it out; receive() waits
  // for its reply. Sending to every server before receiving from any overlaps their round trips.
  Status send(std::span<const char*> argv, std::span<size_t> lens, const char* what) {
    SigpipeGuard guard;
    if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()) !=
        REDIS_OK) {
      return failed(what);
    }
    int done = 0;
    while (done == 0) {
      if (redisBufferWrite(ctx_, &done) != REDIS_OK) {
        return failed(what);
      }
    }
    return Status::ok();
  }

  Result<Reply> receive(const char* what) {
    SigpipeGuard guard;
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      return failed(what);
    }
    Reply reply(static_cast<redisReply*>(raw));
    if (reply->type == REDIS_REPLY_ERROR) {
      std::string msg(reply->str, reply->len);
      if (msg.rfind("OOM", 0) == 0) {
        return BAGUA_ERROR(kResourceExhausted, "redis %s refused %s: %s", server_.name.c_str(),
                           what, msg.c_str());
      }
      return BAGUA_ERROR(kRemoteError, "redis %s: %s: %s", server_.name.c_str(), what, msg.c_str());
    }
    return reply;
  }

 private:
  Status failed(const char* what) {
    std::string why = ctx_->errstr[0] != '\0' ? ctx_->errstr : "connection lost";
    healthy_ = false;
    markDown(why);
    return BAGUA_ERROR(kUnavailable, "redis %s: %s failed: %s", server_.name.c_str(), what,
                       why.c_str());
  }

  void markDown(const std::string& why) {
    std::vector<redisContext*> stale;
    {
      std::lock_guard<std::mutex> lock(server_.mu);
      if (!server_.down) {
        server_.down = true;
        server_.retryAt = Clock::now() + store_.options_.retryInterval;
        BAGUA_LOG_DEBUG(kLogCache, "redis %s marked down: %s", server_.name.c_str(), why.c_str());
      }
      server_.lastError = why;
      // The other idle connections went to the same dead server.
      stale.swap(server_.idle);
    }
    for (redisContext* c : stale) {
      redisFree(c);
    }
  }

  RedisStore& store_;
  Server& server_;
  redisContext* ctx_ = nullptr;
  bool healthy_ = true;
};

RedisStore::RedisStore(RedisOptions options) : options_(std::move(options)) {}

RedisStore::~RedisStore() {
  servers_.clear();  // close connections before the spawned servers go
  for (LocalRedisServer& s : spawned_) {
    s.stop();
  }
}

Result<std::unique_ptr<RedisStore>> RedisStore::create(RedisOptions options) {
  if (options.timeout.count() <= 0 || options.retryInterval.count() <= 0) {
    return BAGUA_ERROR(kInvalidArgument, "redis cache: timeout and retry interval must be > 0 ms");
  }
  if (options.hosts.empty() && (options.spawn < 1 || options.spawn > 64)) {
    return BAGUA_ERROR(kInvalidArgument, "redis cache: spawn must be in [1, 64], got %d",
                       options.spawn);
  }
  if (options.nodeRank < 0) {
    return BAGUA_ERROR(kInvalidArgument, "redis cache: node rank must be >= 0, got %d",
                       options.nodeRank);
  }
  auto store = std::unique_ptr<RedisStore>(new RedisStore(std::move(options)));
  RedisOptions& o = store->options_;
  if (o.hosts.empty()) {
    for (int i = 0; i < o.spawn; ++i) {
      LocalRedisServer server;
      LocalRedisOptions lo;
      lo.binary = o.serverBinary;
      lo.maxMemoryBytes = o.capacityPerNode;
      lo.maxMemoryPolicy = o.maxMemoryPolicy;
      uint8_t raw[24];
      BAGUA_RETURN_IF_ERROR(randomBytes(raw, sizeof(raw)));
      lo.password = toHex(raw, sizeof(raw));
      Status s = server.start(lo);
      if (!s.isOk()) {
        return std::move(s.withContext("redis cache: spawning a local redis-server")
                             .addFrame(__FILE__, __LINE__));
      }
      BAGUA_LOG_INFO(kLogCache, "spawned redis-server pid %d on 127.0.0.1:%d (maxmemory %s, %s)",
                     static_cast<int>(server.pid()), server.port(),
                     formatBytes(o.capacityPerNode).c_str(), o.maxMemoryPolicy.c_str());
      o.hosts.push_back({"127.0.0.1", server.port(), lo.password});
      store->spawned_.push_back(std::move(server));
    }
  }
  std::vector<RedisHost> use = o.hosts;
  if (!o.clusterMode) {
    use = {o.hosts[static_cast<size_t>(o.nodeRank) % o.hosts.size()]};
  }
  for (const RedisHost& h : use) {
    auto s = std::make_unique<Server>();
    s->host = h;
    s->name = h.host.find(':') != std::string::npos ? strPrintf("[%s]:%d", h.host.c_str(), h.port)
                                                    : strPrintf("%s:%d", h.host.c_str(), h.port);
    store->servers_.push_back(std::move(s));
  }
  Status ping = store->ping();
  if (!ping.isOk()) {
    BAGUA_LOG_INFO(kLogCache, "redis cache: not every server answers yet (will retry): %s",
                   ping.message().c_str());
  }
  return store;
}

size_t RedisStore::serverFor(std::string_view key) const {
  return servers_.size() == 1 ? 0 : detail::hashKey(key) % servers_.size();
}

std::vector<RedisHost> RedisStore::servers() const {
  std::vector<RedisHost> out;
  for (const auto& s : servers_) {
    out.push_back(s->host);
  }
  return out;
}

std::string RedisStore::describe() const {
  std::string out = "redis";
  for (const auto& s : servers_) {
    out += " " + s->name;
  }
  out += options_.clusterMode ? " (sharded by key)" : strPrintf(" (node %d)", options_.nodeRank);
  if (!spawned_.empty()) {
    out += strPrintf(", %zu spawned", spawned_.size());
  }
  return out;
}

Result<bool> RedisStore::get(std::string_view key, std::string& value) {
  Conn conn(*this, *servers_[serverFor(key)]);
  BAGUA_RETURN_IF_ERROR(conn.open());
  const char* argv[] = {"GET", key.data()};
  size_t lens[] = {3, key.size()};
  BAGUA_ASSIGN_OR_RETURN(Reply r, conn.command(argv, lens, "GET"));
  if (r->type == REDIS_REPLY_NIL) {
    return false;
  }
  if (r->type != REDIS_REPLY_STRING) {
    return BAGUA_ERROR(kRemoteError, "redis GET answered with reply type %d", r->type);
  }
  value.assign(r->str, r->len);
  return true;
}

Status RedisStore::pipelinePerServer(
    size_t count, const std::function<std::string_view(size_t)>& keyOf, const char* command,
    const std::function<void(size_t, std::vector<const char*>&, std::vector<size_t>&)>& addArgs,
    const std::function<Status(const std::vector<size_t>&, const redisReply&)>& onReply) {
  std::vector<std::vector<size_t>> perServer(servers_.size());
  for (size_t i = 0; i < count; ++i) {
    perServer[serverFor(keyOf(i))].push_back(i);
  }
  std::vector<std::unique_ptr<Conn>> conns(servers_.size());
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  Status first;
  for (size_t s = 0; s < servers_.size(); ++s) {
    if (perServer[s].empty()) {
      continue;
    }
    argv.assign(1, command);
    lens.assign(1, std::strlen(command));
    for (size_t i : perServer[s]) {
      addArgs(i, argv, lens);
    }
    auto conn = std::make_unique<Conn>(*this, *servers_[s]);
    Status st = conn->open();
    if (st.isOk()) {
      st = conn->send(argv, lens, command);
    }
    if (st.isOk()) {
      conns[s] = std::move(conn);
    } else if (first.isOk()) {
      first = std::move(st);
    }
  }
  for (size_t s = 0; s < servers_.size(); ++s) {
    if (conns[s] == nullptr) {
      continue;
    }
    Result<Reply> r = conns[s]->receive(command);
    Status st = r.isOk() ? onReply(perServer[s], **r) : r.takeStatus();
    if (!st.isOk() && first.isOk()) {
      first = std::move(st);
    }
  }
  return first;
}

Status RedisStore::getMany(std::span<const std::string_view> keys,
                           std::vector<std::optional<std::string>>& values) {
  values.assign(keys.size(), std::nullopt);
  // A server that fails leaves its keys missing; the others' values are still returned.
  return pipelinePerServer(
      keys.size(), [&](size_t i) { return keys[i]; }, "MGET",
      [&](size_t i, std::vector<const char*>& argv, std::vector<size_t>& lens) {
        argv.push_back(keys[i].data());
        lens.push_back(keys[i].size());
      },
      [&](const std::vector<size_t>& idx, const redisReply& r) -> Status {
        if (r.type != REDIS_REPLY_ARRAY || r.elements != idx.size()) {
          return BAGUA_ERROR(kRemoteError,
                             "redis MGET of %zu keys answered with type %d, %zu elements",
                             idx.size(), r.type, static_cast<size_t>(r.elements));
        }
        for (size_t j = 0; j < idx.size(); ++j) {
          const redisReply* e = r.element[j];
          if (e->type == REDIS_REPLY_STRING) {
            values[idx[j]].emplace(e->str, e->len);
          }
        }
        return Status::ok();
      });
}

Status RedisStore::put(std::string_view key, std::string_view value) {
  Conn conn(*this, *servers_[serverFor(key)]);
  BAGUA_RETURN_IF_ERROR(conn.open());
  const char* argv[] = {"SET", key.data(), value.data()};
  size_t lens[] = {3, key.size(), value.size()};
  BAGUA_ASSIGN_OR_RETURN(Reply r, conn.command(argv, lens, "SET"));
  (void)r;
  return Status::ok();
}

Status RedisStore::putMany(std::span<const KeyValue> items) {
  // A server that is down loses its part of the batch; the other servers still get theirs.
  return pipelinePerServer(
      items.size(), [&](size_t i) { return std::string_view(items[i].key); }, "MSET",
      [&](size_t i, std::vector<const char*>& argv, std::vector<size_t>& lens) {
        argv.push_back(items[i].key.data());
        lens.push_back(items[i].key.size());
        argv.push_back(items[i].value.data());
        lens.push_back(items[i].value.size());
      },
      [](const std::vector<size_t>&, const redisReply&) { return Status::ok(); });
}

Result<uint64_t> RedisStore::numKeys() {
  uint64_t total = 0;
  for (auto& server : servers_) {
    Conn conn(*this, *server);
    BAGUA_RETURN_IF_ERROR(conn.open());
    const char* argv[] = {"DBSIZE"};
    size_t lens[] = {6};
    BAGUA_ASSIGN_OR_RETURN(Reply r, conn.command(argv, lens, "DBSIZE"));
    if (r->type != REDIS_REPLY_INTEGER) {
      return BAGUA_ERROR(kRemoteError, "redis DBSIZE answered with reply type %d", r->type);
    }
    total += static_cast<uint64_t>(r->integer);
  }
  return total;
}

Status RedisStore::clear() {
  for (auto& server : servers_) {
    Conn conn(*this, *server);
    BAGUA_RETURN_IF_ERROR(conn.open());
    const char* argv[] = {"FLUSHDB"};
    size_t lens[] = {7};
    BAGUA_ASSIGN_OR_RETURN(Reply r, conn.command(argv, lens, "FLUSHDB"));
    (void)r;
  }
  return Status::ok();
}

Status RedisStore::ping() {
  Status first;
  for (auto& server : servers_) {
    Conn conn(*this, *server);
    Status st = conn.open();
    if (st.isOk()) {
      const char* argv[] = {"PING"};
      size_t lens[] = {4};
      Result<Reply> r = conn.command(argv, lens, "PING");
      st = r.takeStatus();
    }
    if (!st.isOk() && first.isOk()) {
      first = std::move(st);
    }
  }
  return first;
}

}  // namespace bagua::cache
