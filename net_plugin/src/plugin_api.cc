#include "plugin_api.h"

#include <limits.h>
#include <netinet/in.h>
#include <stdlib.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bagua/base/logging.h"
#include "bagua/base/params.h"
#include "bagua/net/engine.h"
#include "bagua_config.h"  // BAGUA_VERSION
#include "tuner.h"

namespace bagua::net::plugin {

namespace {

constexpr uint64_t kListenMagic = 0x4c4e474142ULL;   // "BAGNL"
constexpr uint64_t kSendMagic = 0x534e474142ULL;     // "BAGNS"
constexpr uint64_t kRecvMagic = 0x524e474142ULL;     // "BAGNR"
constexpr uint64_t kConnectMagic = 0x434e474142ULL;  // "BAGNC" (connect state in the handle)

// One NCCL device: an interface, or several (rails) that each connection spreads its streams
// over (BAGUA_NET_DEVICES=fused, or a virtual device NCCL made with makeVDevice).
struct Device {
  std::vector<NetInterface> ifaces;  // rail r = ifaces[r]
  std::string name;                  // "eth0", or "eth0+eth1"
  std::string pciPath;               // empty: none
  int speedMbps = 0;
  std::vector<int> children;  // devices a virtual device was made of (empty: none)
};

struct ListenComm {
  uint64_t magic = kListenMagic;
  std::unique_ptr<Listener> listener;
};
struct PluginSendComm {
  uint64_t magic = kSendMagic;
  std::unique_ptr<SendComm> comm;
};
struct PluginRecvComm {
  uint64_t magic = kRecvMagic;
  std::unique_ptr<RecvComm> comm;
};

// Connect progress kept in the caller-owned part of the 128-byte handle.
struct ConnectState {
  uint64_t magic;
  Connector* connector;
};
static_assert(kHandleCallerOffset + sizeof(ConnectState) <= kHandleBytes);
static_assert(kHandleBytes == NCCL_NET_HANDLE_MAXSIZE);

struct Global {
  std::mutex mu;
  int refs = 0;  // guarded by mu
  // Guarded by mu; a deque, so that makeVDevice's appends leave references to the others valid
  // while comms use them; cleared at the last finalize.
  std::deque<Device> devices;
  EngineOptions options;  // set at first init
  // The schedule the next discover() gives options (setBenchSchedule); guarded by mu.
  Schedule benchSchedule = Schedule::kDynamic;
  std::atomic<ncclDebugLogger_t> logger{nullptr};
};

Global& global() {
  static Global g;
  return g;
}

void forwardToNccl(LogLevel level, const LogCategory& category, const char* file, int line,
                   const std::string& message) {
  ncclDebugLogger_t fn = global().logger.load(std::memory_order_acquire);
  if (fn == nullptr) {
    return;
  }
  ncclDebugLogLevel l = level >= LogLevel::kWarn   ? NCCL_LOG_WARN
                        : level == LogLevel::kInfo ? NCCL_LOG_INFO
                                                   : NCCL_LOG_TRACE;
  unsigned long flags = category == kLogInit  ? (NCCL_INIT | NCCL_NET)
                        : category == kLogEnv ? (NCCL_ENV | NCCL_NET)
                                              : NCCL_NET;
  fn(l, flags, file, line, "NET/Bagua %s", message.c_str());
}

int readSpeed(const std::string& ifname) {
  std::string path = "/sys/class/net/" + ifname + "/speed";
  FILE* f = std::fopen(path.c_str(), "r");
  int speed = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%d", &speed) != 1) {
      speed = 0;
    }
    std::fclose(f);
  }
  return speed;
}

std::string pciPathOf(const std::string& ifname) {
  std::string path = "/sys/class/net/" + ifname + "/device";
  char real[PATH_MAX];
  if (realpath(path.c_str(), real) == nullptr) {
    return {};
  }
  return real;
}

// A device over the interfaces of `devs` (plain devices of g), in that order: its rails.
// Rails after the first must be IPv4 and at most kMaxRails in all (the handle's room: 9, so
// that NCCL 2.30's virtual NICs of 8 devices fit).
Result<Device> fuse(const Global& g, const std::vector<int>& devs) {
  constexpr size_t kMaxRails = 9;
  Device d;
  for (int dev : devs) {
    if (dev < 0 || static_cast<size_t>(dev) >= g.devices.size()) {
      return BAGUA_ERROR(kInvalidArgument, "device %d out of range (%zu devices)", dev,
                         g.devices.size());
    }
    const Device& c = g.devices[static_cast<size_t>(dev)];
    if (!c.children.empty()) {
      return BAGUA_ERROR(kInvalidArgument, "device %d (%s) is itself virtual", dev, c.name.c_str());
    }
    for (const NetInterface& i : c.ifaces) {
      if (!d.ifaces.empty() && i.address.family() != AF_INET) {
        return BAGUA_ERROR(kInvalidArgument,
                           "interface %s (%s) is not IPv4: a device spanning several interfaces "
                           "needs IPv4 after the first (set NCCL_SOCKET_FAMILY=AF_INET, or "
                           "BAGUA_NET_DEVICES=per-interface)",
                           i.name.c_str(), i.address.toString().c_str());
      }
      d.ifaces.push_back(i);
    }
    d.name += (d.name.empty() ? "" : "+") + c.name;
    d.speedMbps += c.speedMbps;
    if (d.pciPath.empty()) {
      d.pciPath = c.pciPath;
    }
    d.children.push_back(dev);
  }
  if (d.ifaces.empty() || d.ifaces.size() > kMaxRails) {
    return BAGUA_ERROR(kInvalidArgument,
                       "a device spans 1 to %zu interfaces, %zu given (narrow "
                       "NCCL_SOCKET_IFNAME, or BAGUA_NET_DEVICES=per-interface)",
                       kMaxRails, d.ifaces.size());
  }
  return d;
}

Status discover(Global& g) {
  // The first line a user's NCCL_DEBUG=INFO log shows of us: which build NCCL loaded.
  BAGUA_LOG_INFO(kLogInit, "Bagua-Net %s", BAGUA_VERSION);
  NetParams& p = netParams();
  BAGUA_RETURN_IF_ERROR(p.loadAll());
  BAGUA_ASSIGN_OR_RETURN(g.options, EngineOptions::fromParams());
  g.options.schedule = g.benchSchedule;
  if (g.options.schedule == Schedule::kRoundRobin) {
    BAGUA_LOG_INFO(kLogInit, "chunk schedule: round-robin (the benchmark's entry, bench_abi.h)");
  }
  BAGUA_ASSIGN_OR_RETURN(std::string ifname, p.ifname.get());
  BAGUA_ASSIGN_OR_RETURN(std::string familyText, p.family.get());
  BAGUA_ASSIGN_OR_RETURN(int family, parseAddressFamily(familyText));
  BAGUA_ASSIGN_OR_RETURN(std::vector<NetInterface> ifs, findInterfaces(ifname, family, 16));
  BAGUA_ASSIGN_OR_RETURN(int64_t speedParam, p.speedMbps.get());
  BAGUA_ASSIGN_OR_RETURN(std::string layout, p.devices.get());
  g.devices.clear();
  std::string list;
  for (size_t i = 0; i < ifs.size(); ++i) {
    Device d;
    d.ifaces = {ifs[i]};
    d.name = ifs[i].name;
    d.pciPath = pciPathOf(d.name);
    int sysSpeed = readSpeed(d.name);
    d.speedMbps =
        speedParam > 0 ? static_cast<int>(speedParam) : (sysSpeed > 0 ? sysSpeed : 400000);
    list += strPrintf("%s[%zu]%s<%s>", i == 0 ? "" : " ", i, d.name.c_str(),
                      ifs[i].address.toString().c_str());
    g.devices.push_back(std::move(d));
  }
  BAGUA_LOG_INFO(kLogInit, "Using interfaces %s", list.c_str());
  if (layout == "fused" && g.devices.size() > 1) {
    std::vector<int> all(g.devices.size());
    for (size_t i = 0; i < all.size(); ++i) {
      all[i] = static_cast<int>(i);
    }
    BAGUA_ASSIGN_OR_RETURN(Device fused, fuse(g, all));
    fused.children.clear();  // NCCL sees one plain device
    if (speedParam > 0) {
      fused.speedMbps = static_cast<int>(speedParam);
    }
    g.devices.clear();
    g.devices.push_back(std::move(fused));
    BAGUA_LOG_INFO(kLogInit, "BAGUA_NET_DEVICES=fused: one device %s over %zu interfaces",
                   g.devices[0].name.c_str(), g.devices[0].ifaces.size());
  }
  // Both catalogues this library reads: the engine's and the tuner's (whose bad values fail the
  // tuner's init, not this one: they show as '?').
  std::string knobs;
  const ParamCatalogue* catalogues[] = {&netParams(), &tuner::tunerParams()};
  for (const ParamCatalogue* catalogue : catalogues) {
    for (ParamBase* param : catalogue->params()) {
      Result<std::string> v = param->valueString();
      knobs += strPrintf("%s%s=%s(%s)", knobs.empty() ? "" : " ", param->key().c_str(),
                         v.isOk() ? v->c_str() : "?", paramSourceName(param->source()));
    }
  }
  BAGUA_LOG_INFO(kLogEnv, "Parameters: %s", knobs.c_str());
  return Status::ok();
}

template <typename T>
Result<T*> checked(void* p, uint64_t magic, const char* what) {
  if (p == nullptr) {
    return BAGUA_ERROR(kInternal, "null %s passed to the plugin", what);
  }
  auto* t = static_cast<T*>(p);
  if (t->magic != magic) {
    return BAGUA_ERROR(kInternal, "%s %p is not a live Bagua-Net object", what, p);
  }
  return t;
}

// Checks and deletes a plugin object. The magic is cleared first so that a later call through a
// stale pointer most likely fails checked() instead of using a dead object.
template <typename T>
Status destroy(void* p, uint64_t magic, const char* what) {
  BAGUA_ASSIGN_OR_RETURN(T * t, checked<T>(p, magic, what));
  t->magic = 0;
  delete t;
  return Status::ok();
}

Result<const Device*> device(int dev) {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.refs == 0) {
    return BAGUA_ERROR(kInternal, "plugin used before init()");
  }
  if (dev < 0 || static_cast<size_t>(dev) >= g.devices.size()) {
    return BAGUA_ERROR(kInternal, "device %d out of range (%zu devices)", dev, g.devices.size());
  }
  return &g.devices[static_cast<size_t>(dev)];
}

}  // namespace

Status init(ncclDebugLogger_t logger) {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  if (logger != nullptr) {
    g.logger.store(logger, std::memory_order_release);
  }
  if (g.refs > 0) {
    ++g.refs;
    return Status::ok();
  }
  if (g.logger.load(std::memory_order_acquire) != nullptr) {
    setLogSink(forwardToNccl);
    // NCCL filters by NCCL_DEBUG itself; let INFO lines through to it.
    setLogLevel(kLogNet, LogLevel::kInfo);
    setLogLevel(kLogInit, LogLevel::kInfo);
    setLogLevel(kLogEnv, LogLevel::kInfo);
  }
  Status s = discover(g);
  if (!s.isOk()) {
    BAGUA_LOG_WARN(kLogInit, "init failed, NCCL will fall back to its own transports: %s",
                   s.toString().c_str());
    return s;
  }
  g.refs = 1;
  return Status::ok();
}

Status finalize() {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.refs <= 0) {
    return BAGUA_ERROR(kInternal, "finalize() without a matching init()");
  }
  if (--g.refs == 0) {
    g.devices.clear();
    setLogSink(nullptr);
    g.logger.store(nullptr, std::memory_order_release);
  }
  return Status::ok();
}

int initCount() {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.refs;
}

Status devices(int* ndev) {
  if (ndev == nullptr) {
    return BAGUA_ERROR(kInternal, "devices(NULL)");
  }
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.refs == 0) {
    return BAGUA_ERROR(kInternal, "devices() before init()");
  }
  *ndev = static_cast<int>(g.devices.size());
  return Status::ok();
}

Status getProperties(int dev, DeviceProps* props) {
  if (props == nullptr) {
    return BAGUA_ERROR(kInternal, "getProperties(NULL)");
  }
  BAGUA_ASSIGN_OR_RETURN(const Device* d, device(dev));
  *props = DeviceProps();
  // The strings live in the device list until the last finalize().
  props->name = const_cast<char*>(d->name.c_str());
  props->pciPath = d->pciPath.empty() ? nullptr : const_cast<char*>(d->pciPath.c_str());
  props->guid = static_cast<uint64_t>(dev);
  props->speedMbps = d->speedMbps;
  props->dev = dev;
  props->vdevs = d->children.empty() ? std::vector<int>{dev} : d->children;
  return Status::ok();
}

Status makeVDevice(const int* devs, int ndevs, int* vdev) {
  if (devs == nullptr || vdev == nullptr || ndevs < 1) {
    return BAGUA_ERROR(kInternal, "makeVDevice with null arguments or %d devices", ndevs);
  }
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.refs == 0) {
    return BAGUA_ERROR(kInternal, "makeVDevice() before init()");
  }
  BAGUA_ASSIGN_OR_RETURN(Device d, fuse(g, std::vector<int>(devs, devs + ndevs)));
  *vdev = static_cast<int>(g.devices.size());
  BAGUA_LOG_INFO(kLogInit, "virtual device %d: %s over %zu interfaces", *vdev, d.name.c_str(),
                 d.ifaces.size());
  g.devices.push_back(std::move(d));
  return Status::ok();
}

Status listen(int dev, void* handle, void** listenComm) {
  if (handle == nullptr || listenComm == nullptr) {
    return BAGUA_ERROR(kInternal, "listen with a null handle or listenComm");
  }
  *listenComm = nullptr;
  BAGUA_ASSIGN_OR_RETURN(const Device* d, device(dev));
  std::vector<SocketAddress> bindAddrs;
  for (const NetInterface& i : d->ifaces) {
    SocketAddress a = i.address;
    if (a.family() == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&a.storage)->sin_port = 0;
    } else {
      reinterpret_cast<sockaddr_in6*>(&a.storage)->sin6_port = 0;
    }
    bindAddrs.push_back(a);
  }
  BAGUA_ASSIGN_OR_RETURN(std::unique_ptr<Listener> l,
                         Listener::create(bindAddrs, global().options));
  std::memcpy(handle, l->handle().data(), kHandleBytes);
  auto lc = std::make_unique<ListenComm>();
  lc->listener = std::move(l);
  *listenComm = lc.release();
  return Status::ok();
}

Status connect(int dev, void* handle, void** sendComm) {
  if (handle == nullptr || sendComm == nullptr) {
    return BAGUA_ERROR(kInternal, "connect with a null handle or sendComm");
  }
  *sendComm = nullptr;
  BAGUA_ASSIGN_OR_RETURN(const Device* d, device(dev));
  auto* bytes = static_cast<uint8_t*>(handle);
  ConnectState st;
  std::memcpy(&st, bytes + kHandleCallerOffset, sizeof(st));
  Connector* c = nullptr;
  if (st.magic == kConnectMagic && st.connector != nullptr) {
    c = st.connector;
  } else {
    Handle h;
    std::memcpy(h.data(), bytes, kHandleBytes);
    BAGUA_ASSIGN_OR_RETURN(std::unique_ptr<Connector> fresh,
                           Connector::start(h, global().options, d->ifaces));
    c = fresh.release();
    st = ConnectState{kConnectMagic, c};
    std::memcpy(bytes + kHandleCallerOffset, &st, sizeof(st));
  }
  Result<std::unique_ptr<SendComm>> r = c->poll();
  if (r.isOk() && *r == nullptr) {
    return Status::ok();  // still connecting; NCCL calls again with the same handle
  }
  // Done either way: the connector goes, the handle forgets it.
  delete c;
  std::memset(bytes + kHandleCallerOffset, 0, sizeof(ConnectState));
  if (!r.isOk()) {
    return r.takeStatus();
  }
  auto sc = std::make_unique<PluginSendComm>();
  sc->comm = std::move(*r);
  *sendComm = sc.release();
  return Status::ok();
}

Status accept(void* listenComm, void** recvComm) {
  if (recvComm == nullptr) {
    return BAGUA_ERROR(kInternal, "accept with a null recvComm");
  }
  *recvComm = nullptr;
  BAGUA_ASSIGN_OR_RETURN(ListenComm * lc,
                         checked<ListenComm>(listenComm, kListenMagic, "listenComm"));
  BAGUA_ASSIGN_OR_RETURN(std::unique_ptr<RecvComm> r, lc->listener->accept());
  if (r == nullptr) {
    return Status::ok();
  }
  auto rc = std::make_unique<PluginRecvComm>();
  rc->comm = std::move(r);
  *recvComm = rc.release();
  return Status::ok();
}

Status regMr(void* comm, int type, void** mhandle) {
  if (comm == nullptr || mhandle == nullptr) {
    return BAGUA_ERROR(kInternal, "regMr with a null comm or mhandle");
  }
  if (type != NCCL_PTR_HOST) {
    return BAGUA_ERROR(kInternal,
                       "regMr of memory type %d: Bagua-Net supports host memory only "
                       "(ptrSupport = NCCL_PTR_HOST)",
                       type);
  }
  *mhandle = comm;  // nothing to register for TCP
  return Status::ok();
}

Status deregMr(void* /*comm*/, void* /*mhandle*/) {
  return Status::ok();
}

Status isend(void* sendComm, void* data, size_t size, void** request) {
  if (request == nullptr) {
    return BAGUA_ERROR(kInternal, "isend with a null request pointer");
  }
  *request = nullptr;
  BAGUA_ASSIGN_OR_RETURN(PluginSendComm * sc,
                         checked<PluginSendComm>(sendComm, kSendMagic, "sendComm"));
  Result<Request*> r = sc->comm->isend(data, size);
  if (!r.isOk()) {
    if (r.status().code() == StatusCode::kUnavailable) {
      return Status::ok();  // NULL request: NCCL retries
    }
    return r.takeStatus();
  }
  *request = *r;
  return Status::ok();
}

Status irecv(void* recvComm, int n, void** data, const size_t* sizes, void** request) {
  if (request == nullptr) {
    return BAGUA_ERROR(kInternal, "irecv with a null request pointer");
  }
  *request = nullptr;  // also clears NCCL's optional-completion marker
  BAGUA_ASSIGN_OR_RETURN(PluginRecvComm * rc,
                         checked<PluginRecvComm>(recvComm, kRecvMagic, "recvComm"));
  if (n != 1) {
    return BAGUA_ERROR(kInternal, "grouped irecv of n=%d buffers, but Bagua-Net reports maxRecvs=1",
                       n);
  }
  if (data == nullptr || sizes == nullptr) {
    return BAGUA_ERROR(kInternal, "irecv with null data or sizes arrays");
  }
  Result<Request*> r = rc->comm->irecv(data[0], sizes[0]);
  if (!r.isOk()) {
    if (r.status().code() == StatusCode::kUnavailable) {
      return Status::ok();
    }
    return r.takeStatus();
  }
  *request = *r;
  return Status::ok();
}

Status test(void* request, int* done, size_t* sizes) {
  if (request == nullptr || done == nullptr) {
    return BAGUA_ERROR(kInternal, "test with a null request or done");
  }
  *done = 0;
  bool finished = false;
  size_t size = 0;
  BAGUA_RETURN_IF_ERROR(static_cast<Request*>(request)->test(&finished, &size));
  if (finished) {
    *done = 1;
    if (sizes != nullptr) {
      sizes[0] = size;
    }
  }
  return Status::ok();
}

Status closeSend(void* sendComm) {
  return destroy<PluginSendComm>(sendComm, kSendMagic, "sendComm");  // joins the helper threads
}

Status closeRecv(void* recvComm) {
  return destroy<PluginRecvComm>(recvComm, kRecvMagic, "recvComm");
}

Status closeListen(void* listenComm) {
  return destroy<ListenComm>(listenComm, kListenMagic, "listenComm");
}

Status setLive(const LiveSettings& live) {
  BAGUA_RETURN_IF_ERROR(setProcessLiveSettings(live));
  BAGUA_LOG_INFO(kLogNet, "live settings: active streams %d, chunk %llu..%llu (0: default)",
                 live.activeStreams, static_cast<unsigned long long>(live.minChunkBytes),
                 static_cast<unsigned long long>(live.maxChunkBytes));
  return Status::ok();
}

Status getLive(LiveSettings* live) {
  if (live == nullptr) {
    return BAGUA_ERROR(kInvalidArgument, "getLive(NULL)");
  }
  *live = processLiveSettings();
  return Status::ok();
}

Status setBenchSchedule(Schedule schedule) {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.refs > 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "the benchmark schedule is set before init (the module is initialised)");
  }
  g.benchSchedule = schedule;
  return Status::ok();
}

ncclResult_t toNcclResult(const Status& status) {
  switch (status.code()) {
  case StatusCode::kOk:
    return ncclSuccess;
  case StatusCode::kRemoteError:
  case StatusCode::kDeadlineExceeded:
    return ncclRemoteError;
  case StatusCode::kSystemError:
  case StatusCode::kNotFound:
  case StatusCode::kUnavailable:
  case StatusCode::kResourceExhausted:
    return ncclSystemError;
  case StatusCode::kInvalidArgument:
    return ncclInvalidUsage;
  default:
    return ncclInternalError;
  }
}

}  // namespace bagua::net::plugin
