// The exported NCCL net plugin tables ncclNetPlugin_v12 ... ncclNetPlugin_v6 and the live-settings
// entry (bagua/net/live_abi.h): thin adapters over the internal API (plugin_api.h). Every entry
// point is an exception firewall: it converts arguments, calls the internal API inside try/catch
// and maps the Status to ncclResult_t, logging failures (through NCCL's logger once init ran).
#include <climits>
#include <exception>
#include <iterator>
#include <new>
#include <type_traits>

#include "bagua/base/logging.h"
#include "bagua/net/live_abi.h"
#include "bagua/net/params.h"
#include "bench_abi.h"
#include "nccl_net_abi.h"
#include "plugin_api.h"

namespace bagua::net::plugin {
namespace {

template <typename Fn>
ncclResult_t firewall(const char* what, Fn&& fn) noexcept {
  try {
    Status s = fn();
    if (!s.isOk()) {
      BAGUA_LOG_WARN(kLogNet, "%s failed: %s", what, s.toString().c_str());
    }
    return toNcclResult(s);
  } catch (const std::bad_alloc&) {
    BAGUA_LOG_WARN(kLogNet, "%s failed: out of memory", what);
    return ncclSystemError;
  } catch (const std::exception& e) {
    BAGUA_LOG_WARN(kLogNet, "%s failed: unexpected exception: %s", what, e.what());
    return ncclInternalError;
  } catch (...) {
    BAGUA_LOG_WARN(kLogNet, "%s failed: unexpected exception", what);
    return ncclInternalError;
  }
}

Status intSize(int size, size_t* out) {
  if (size < 0) {
    return BAGUA_ERROR(kInternal, "negative message size %d", size);
  }
  *out = static_cast<size_t>(size);
  return Status::ok();
}

// Writes a size into NCCL's int array (test() reports int sizes in every version).
Status testInt(void* request, int* done, int* sizes) {
  size_t size = 0;
  BAGUA_RETURN_IF_ERROR(test(request, done, &size));
  if (*done && sizes != nullptr) {
    sizes[0] = size > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(size);
  }
  return Status::ok();
}

// ---- shared adapters ---------------------------------------------------------------------------

ncclResult_t aInit(ncclDebugLogger_t logger) {
  return firewall("init", [&] { return init(logger); });
}
ncclResult_t aInitV10(ncclDebugLogger_t logger, ncclProfilerCallback_t) {
  return aInit(logger);
}

struct Ctx {
  uint64_t commId;
};

ncclResult_t aInitV11(void** ctx, uint64_t commId, ncclNetCommConfig_v10_t*,
                      ncclDebugLogger_t logger, ncclProfilerCallback_t) {
  return firewall("init", [&]() -> Status {
    if (ctx == nullptr) {
      return BAGUA_ERROR(kInternal, "init with a null ctx");
    }
    BAGUA_RETURN_IF_ERROR(init(logger));
    *ctx = new Ctx{commId};
    return Status::ok();
  });
}
ncclResult_t aFinalizeV11(void* ctx) {
  return firewall("finalize", [&]() -> Status {
    delete static_cast<Ctx*>(ctx);
    return finalize();
  });
}

ncclResult_t aDevices(int* ndev) {
  return firewall("devices", [&] { return devices(ndev); });
}

template <typename P>
void fillCommon(const DeviceProps& d, P* p) {
  p->name = d.name;
  p->pciPath = d.pciPath;
  p->guid = d.guid;
  p->ptrSupport = NCCL_PTR_HOST;
  p->speed = d.speedMbps;
  p->port = 0;
  p->latency = 0;
  p->maxComms = d.maxComms;
  p->maxRecvs = d.maxRecvs;
}

ncclResult_t aPropsV6(int dev, ncclNetProperties_v6_t* p) {
  return firewall("getProperties", [&]() -> Status {
    DeviceProps d;
    BAGUA_RETURN_IF_ERROR(getProperties(dev, &d));
    *p = ncclNetProperties_v6_t{};
    fillCommon(d, p);
    return Status::ok();
  });
}
ncclResult_t aPropsV7(int dev, ncclNetProperties_v7_t* p) {
  return firewall("getProperties", [&]() -> Status {
    DeviceProps d;
    BAGUA_RETURN_IF_ERROR(getProperties(dev, &d));
    *p = ncclNetProperties_v7_t{};
    fillCommon(d, p);
    p->netDeviceType = NCCL_NET_DEVICE_HOST;
    p->netDeviceVersion = 0;
    return Status::ok();
  });
}
ncclResult_t aPropsV8(int dev, ncclNetProperties_v8_t* p) {
  return firewall("getProperties", [&]() -> Status {
    DeviceProps d;
    BAGUA_RETURN_IF_ERROR(getProperties(dev, &d));
    *p = ncclNetProperties_v8_t{};
    fillCommon(d, p);
    p->regIsGlobal = 0;
    p->netDeviceType = NCCL_NET_DEVICE_HOST;
    p->netDeviceVersion = 0;
    return Status::ok();
  });
}
template <typename P>
void fillV9(const DeviceProps& d, P* p) {
  fillCommon(d, p);
  p->regIsGlobal = 0;
  p->forceFlush = 0;
  p->netDeviceType = NCCL_NET_DEVICE_HOST;
  p->netDeviceVersion = 0;
  p->vProps.ndevs = 0;
  for (int v : d.vdevs) {
    if (p->vProps.ndevs < static_cast<int>(std::size(p->vProps.devs))) {
      p->vProps.devs[p->vProps.ndevs++] = v;
    }
  }
  p->maxP2pBytes = d.maxP2pBytes;
  p->maxCollBytes = d.maxCollBytes;
}
ncclResult_t aPropsV9(int dev, ncclNetProperties_v9_t* p) {
  return firewall("getProperties", [&]() -> Status {
    DeviceProps d;
    BAGUA_RETURN_IF_ERROR(getProperties(dev, &d));
    *p = ncclNetProperties_v9_t{};
    fillV9(d, p);
    return Status::ok();
  });
}
ncclResult_t aPropsV11(int dev, ncclNetProperties_v11_t* p) {
  return firewall("getProperties", [&]() -> Status {
    DeviceProps d;
    BAGUA_RETURN_IF_ERROR(getProperties(dev, &d));
    *p = ncclNetProperties_v11_t{};
    fillV9(d, p);
    p->maxMultiRequestSize = 1;
    return Status::ok();
  });
}

ncclResult_t aPropsV12(int dev, ncclNetProperties_v12_t* p) {
  return firewall("getProperties", [&]() -> Status {
    DeviceProps d;
    BAGUA_RETURN_IF_ERROR(getProperties(dev, &d));
    *p = ncclNetProperties_v12_t{};
    fillV9(d, p);
    p->maxMultiRequestSize = 1;
    // Rails and planes of a rail-optimised fabric are not known to a TCP plugin.
    p->railId = NCCL_NET_ID_UNDEF;
    p->planeId = NCCL_NET_ID_UNDEF;
    return Status::ok();
  });
}

// v9..v11 list up to 4 devices per virtual NIC, v12 up to 8.
template <typename VProps>
ncclResult_t aMakeVDevice(int* d, VProps* props) {
  return firewall("makeVDevice", [&]() -> Status {
    constexpr int kMax = static_cast<int>(std::size(VProps{}.devs));
    if (props == nullptr || props->ndevs < 1 || props->ndevs > kMax) {
      return BAGUA_ERROR(kInternal, "makeVDevice with %d devices (1..%d)",
                         props == nullptr ? -1 : props->ndevs, kMax);
    }
    return makeVDevice(props->devs, props->ndevs, d);
  });
}
ncclResult_t aMakeVDeviceV9(int* d, ncclNetVDeviceProps_v9_t* props) {
  return aMakeVDevice(d, props);
}
ncclResult_t aMakeVDeviceV12(int* d, ncclNetVDeviceProps_v12_t* props) {
  return aMakeVDevice(d, props);
}

ncclResult_t aListen(int dev, void* handle, void** listenComm) {
  return firewall("listen", [&] { return listen(dev, handle, listenComm); });
}
ncclResult_t aListenV11(void*, int dev, void* handle, void** listenComm) {
  return aListen(dev, handle, listenComm);
}
ncclResult_t aConnectV6(int dev, void* handle, void** sendComm) {
  return firewall("connect", [&] { return connect(dev, handle, sendComm); });
}
ncclResult_t aConnectV7(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v7_t**) {
  return aConnectV6(dev, handle, sendComm);
}
ncclResult_t aConnectV10(int dev, ncclNetCommConfig_v10_t*, void* handle, void** sendComm,
                         ncclNetDeviceHandle_v7_t**) {
  return aConnectV6(dev, handle, sendComm);
}
ncclResult_t aConnectV11(void*, int dev, void* handle, void** sendComm,
                         ncclNetDeviceHandle_v7_t**) {
  return aConnectV6(dev, handle, sendComm);
}
ncclResult_t aAcceptV6(void* listenComm, void** recvComm) {
  return firewall("accept", [&] { return accept(listenComm, recvComm); });
}
ncclResult_t aAcceptV7(void* listenComm, void** recvComm, ncclNetDeviceHandle_v7_t**) {
  return aAcceptV6(listenComm, recvComm);
}

ncclResult_t aRegMrInt(void* comm, void*, int, int type, void** mhandle) {
  return firewall("regMr", [&] { return regMr(comm, type, mhandle); });
}
ncclResult_t aRegMr(void* comm, void*, size_t, int type, void** mhandle) {
  return firewall("regMr", [&] { return regMr(comm, type, mhandle); });
}
ncclResult_t aRegMrDmaBuf(void* comm, void*, size_t, int type, uint64_t, int, void** mhandle) {
  return firewall("regMrDmaBuf", [&] { return regMr(comm, type, mhandle); });
}
ncclResult_t aDeregMr(void* comm, void* mhandle) {
  return firewall("deregMr", [&] { return deregMr(comm, mhandle); });
}

ncclResult_t aIsendInt(void* sendComm, void* data, int size, int, void*, void** request) {
  return firewall("isend", [&]() -> Status {
    size_t s = 0;
    BAGUA_RETURN_IF_ERROR(intSize(size, &s));
    return isend(sendComm, data, s, request);
  });
}
ncclResult_t aIsend(void* sendComm, void* data, size_t size, int, void*, void** request) {
  return firewall("isend", [&] { return isend(sendComm, data, size, request); });
}
ncclResult_t aIsendV10(void* sendComm, void* data, size_t size, int tag, void* mhandle, void*,
                       void** request) {
  return aIsend(sendComm, data, size, tag, mhandle, request);
}

ncclResult_t aIrecvInt(void* recvComm, int n, void** data, int* sizes, int*, void**,
                       void** request) {
  return firewall("irecv", [&]() -> Status {
    if (request != nullptr) {
      *request = nullptr;
    }
    if (n != 1 || sizes == nullptr) {
      return irecv(recvComm, n, data, nullptr, request);
    }
    size_t s = 0;
    BAGUA_RETURN_IF_ERROR(intSize(sizes[0], &s));
    return irecv(recvComm, n, data, &s, request);
  });
}
ncclResult_t aIrecv(void* recvComm, int n, void** data, size_t* sizes, int*, void**,
                    void** request) {
  return firewall("irecv", [&] { return irecv(recvComm, n, data, sizes, request); });
}
ncclResult_t aIrecvV10(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                       void** mhandles, void**, void** request) {
  return aIrecv(recvComm, n, data, sizes, tags, mhandles, request);
}

ncclResult_t aIflush(void*, int, void**, int*, void**, void** request) {
  return firewall("iflush", [&]() -> Status {
    if (request != nullptr) {
      *request = nullptr;
    }
    return BAGUA_ERROR(kInternal, "iflush called, but Bagua-Net reports host memory only");
  });
}

ncclResult_t aTest(void* request, int* done, int* sizes) {
  return firewall("test", [&] { return testInt(request, done, sizes); });
}
ncclResult_t aCloseSend(void* c) {
  return firewall("closeSend", [&] { return closeSend(c); });
}
ncclResult_t aCloseRecv(void* c) {
  return firewall("closeRecv", [&] { return closeRecv(c); });
}
ncclResult_t aCloseListen(void* c) {
  return firewall("closeListen", [&] { return closeListen(c); });
}

// The live-settings entry, in the numbering live_abi.h promises its callers.
static_assert(BAGUA_NET_LIVE_OK == ncclSuccess && BAGUA_NET_LIVE_INVALID_USAGE == ncclInvalidUsage);
static_assert(std::is_same_v<decltype(&baguaNetSetLive_v1), baguaNetSetLive_v1_t> &&
              std::is_same_v<decltype(&baguaNetGetLive_v1), baguaNetGetLive_v1_t>);

ncclResult_t aSetLive(int activeStreams, uint64_t minChunkBytes, uint64_t maxChunkBytes) {
  return firewall(BAGUA_NET_LIVE_SET_SYMBOL, [&] {
    LiveSettings live;
    live.activeStreams = activeStreams;
    live.minChunkBytes = minChunkBytes;
    live.maxChunkBytes = maxChunkBytes;
    return setLive(live);
  });
}
ncclResult_t aGetLive(int* activeStreams, uint64_t* minChunkBytes, uint64_t* maxChunkBytes) {
  return firewall(BAGUA_NET_LIVE_GET_SYMBOL, [&]() -> Status {
    if (activeStreams == nullptr || minChunkBytes == nullptr || maxChunkBytes == nullptr) {
      return BAGUA_ERROR(kInvalidArgument, "%s with a null pointer", BAGUA_NET_LIVE_GET_SYMBOL);
    }
    LiveSettings live;
    BAGUA_RETURN_IF_ERROR(getLive(&live));
    *activeStreams = live.activeStreams;
    *minChunkBytes = live.minChunkBytes;
    *maxChunkBytes = live.maxChunkBytes;
    return Status::ok();
  });
}

// The benchmark's entry (bench_abi.h).
static_assert(BAGUA_NET_BENCH_INVALID_USAGE == ncclInvalidUsage);
static_assert(std::is_same_v<decltype(&baguaNetBenchSchedule_v1), baguaNetBenchSchedule_v1_t>);

ncclResult_t aBenchSchedule(int roundRobin) {
  return firewall(BAGUA_NET_BENCH_SCHEDULE_SYMBOL, [&]() -> Status {
    if (roundRobin != 0 && roundRobin != 1) {
      return BAGUA_ERROR(kInvalidArgument, "%s(%d): 0 (dynamic) or 1 (round-robin)",
                         BAGUA_NET_BENCH_SCHEDULE_SYMBOL, roundRobin);
    }
    return setBenchSchedule(roundRobin == 1 ? Schedule::kRoundRobin : Schedule::kDynamic);
  });
}

}  // namespace
}  // namespace bagua::net::plugin

using namespace bagua::net::plugin;  // NOLINT(google-build-using-namespace): adapter tables

extern "C" {

__attribute__((visibility("default"))) ncclNet_v12_t ncclNetPlugin_v12 = {
    kPluginName,     aInitV11,     aDevices,     aPropsV12,  aListenV11,   aConnectV11,
    aAcceptV7,       aRegMr,       aRegMrDmaBuf, aDeregMr,   aIsendV10,    aIrecvV10,
    aIflush,         aTest,        aCloseSend,   aCloseRecv, aCloseListen,
    nullptr,  // getDeviceMr: no device offload
    nullptr,  // irecvConsumed: no device offload
    aMakeVDeviceV12, aFinalizeV11,
    nullptr,  // setNetAttr: optional hint, NCCL checks for NULL
};

__attribute__((visibility("default"))) ncclNet_v11_t ncclNetPlugin_v11 = {
    kPluginName,    aInitV11,     aDevices,     aPropsV11,  aListenV11,   aConnectV11,
    aAcceptV7,      aRegMr,       aRegMrDmaBuf, aDeregMr,   aIsendV10,    aIrecvV10,
    aIflush,        aTest,        aCloseSend,   aCloseRecv, aCloseListen,
    nullptr,  // getDeviceMr: no device offload
    nullptr,  // irecvConsumed: no device offload
    aMakeVDeviceV9, aFinalizeV11,
    nullptr,  // setNetAttr: optional hint, NCCL checks for NULL
};

__attribute__((visibility("default"))) ncclNet_v10_t ncclNetPlugin_v10 = {
    kPluginName, aInitV10,     aDevices,     aPropsV9,  aListen,   aConnectV10,    aAcceptV7,
    aRegMr,      aRegMrDmaBuf, aDeregMr,     aIsendV10, aIrecvV10, aIflush,        aTest,
    aCloseSend,  aCloseRecv,   aCloseListen, nullptr,   nullptr,   aMakeVDeviceV9,
};

__attribute__((visibility("default"))) ncclNet_v9_t ncclNetPlugin_v9 = {
    kPluginName, aInit,        aDevices,     aPropsV9, aListen, aConnectV7,     aAcceptV7,
    aRegMr,      aRegMrDmaBuf, aDeregMr,     aIsend,   aIrecv,  aIflush,        aTest,
    aCloseSend,  aCloseRecv,   aCloseListen, nullptr,  nullptr, aMakeVDeviceV9,
};

__attribute__((visibility("default"))) ncclNet_v8_t ncclNetPlugin_v8 = {
    kPluginName, aInit,        aDevices,     aPropsV8,  aListen,   aConnectV7, aAcceptV7,
    aRegMr,      aRegMrDmaBuf, aDeregMr,     aIsendInt, aIrecvInt, aIflush,    aTest,
    aCloseSend,  aCloseRecv,   aCloseListen, nullptr,   nullptr,
};

__attribute__((visibility("default"))) ncclNet_v7_t ncclNetPlugin_v7 = {
    kPluginName, aInit,        aDevices,     aPropsV7,  aListen,   aConnectV7, aAcceptV7,
    aRegMrInt,   aRegMrDmaBuf, aDeregMr,     aIsendInt, aIrecvInt, aIflush,    aTest,
    aCloseSend,  aCloseRecv,   aCloseListen, nullptr,   nullptr,
};

__attribute__((visibility("default"))) ncclNet_v6_t ncclNetPlugin_v6 = {
    kPluginName, aInit,     aDevices,     aPropsV6,   aListen,      aConnectV6,
    aAcceptV6,   aRegMrInt, aRegMrDmaBuf, aDeregMr,   aIsendInt,    aIrecvInt,
    aIflush,     aTest,     aCloseSend,   aCloseRecv, aCloseListen,
};

// Declared in bagua/net/live_abi.h, so a signature that drifts from the callers' types fails here.
__attribute__((visibility("default"))) int baguaNetSetLive_v1(int activeStreams,
                                                              uint64_t minChunkBytes,
                                                              uint64_t maxChunkBytes) {
  return aSetLive(activeStreams, minChunkBytes, maxChunkBytes);
}
__attribute__((visibility("default"))) int baguaNetGetLive_v1(int* activeStreams,
                                                              uint64_t* minChunkBytes,
                                                              uint64_t* maxChunkBytes) {
  return aGetLive(activeStreams, minChunkBytes, maxChunkBytes);
}
__attribute__((visibility("default"))) int baguaNetBenchSchedule_v1(int roundRobin) {
  return aBenchSchedule(roundRobin);
}

}  // extern "C"
