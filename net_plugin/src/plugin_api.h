// The one internal API behind every exported ncclNetPlugin_vN table and the live-settings entry.
// Each function returns a Status; the adapters in abi_nccl.cc convert argument types, catch
// exceptions and map Status codes to ncclResult_t (toNcclResult).
//
// Thread model: NCCL calls set-up functions from its service thread(s) and isend/irecv/test
// from its progress thread(s); several communicators may call concurrently. Global state (the
// device list, the logger, the init refcount) is guarded by one mutex taken only in init,
// finalize, devices and getProperties; per-comm calls touch only their comm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/net/engine.h"
#include "nccl_net_abi.h"

namespace bagua::net::plugin {

inline constexpr const char* kPluginName = "Bagua";

// Version-neutral device properties (converted to each version's struct by the adapters).
struct DeviceProps {
  char* name = nullptr;
  char* pciPath = nullptr;
  uint64_t guid = 0;
  int speedMbps = 0;
  int maxComms = 65536;
  int maxRecvs = 1;
  int dev = 0;
  size_t maxP2pBytes = size_t{1} << 30;
  size_t maxCollBytes = size_t{512} << 20;
  std::vector<int> vdevs;  // vProps: the devices a virtual device was made of, else {dev}
};

// Refcounted: the first call discovers interfaces and installs the NCCL logger as the log sink;
// each successful call must be matched by finalize() (v11) or stays for the process (v6..v10).
Status init(ncclDebugLogger_t logger);
Status finalize();
// Live init() calls (tests).
int initCount();

Status devices(int* ndev);
// A virtual device over plain devices `devs` (NCCL's NIC fusion): its connections spread their
// streams over every interface of them. Appended to the device list; *vdev is its index.
Status makeVDevice(const int* devs, int ndevs, int* vdev);
Status getProperties(int dev, DeviceProps* props);
Status listen(int dev, void* handle, void** listenComm);
// Non-blocking; *sendComm stays null until connected. Keeps its progress inside the handle.
Status connect(int dev, void* handle, void** sendComm);
Status accept(void* listenComm, void** recvComm);
Status regMr(void* comm, int type, void** mhandle);
Status deregMr(void* comm, void* mhandle);
// *request = nullptr means "no free slot, call again" (NCCL retries).
Status isend(void* sendComm, void* data, size_t size, void** request);
Status irecv(void* recvComm, int n, void** data, const size_t* sizes, void** request);
// sizes (optional) gets the real size of each of the request's n (= 1) messages.
Status test(void* request, int* done, size_t* sizes);
Status closeSend(void* sendComm);
Status closeRecv(void* recvComm);
Status closeListen(void* listenComm);

// The live-settings entry (bagua/net/live_abi.h): this module's process-wide engine settings.
// setLive validates (kInvalidArgument names the bad field) and logs the new settings.
Status setLive(const LiveSettings& live);
Status getLive(LiveSettings* live);

// Status -> ncclResult_t: peer gone -> ncclRemoteError, OS/network -> ncclSystemError, caller
// mistakes -> ncclInvalidUsage, NCCL misusing the plugin / bugs -> ncclInternalError.
// The benchmark's entry (bench_abi.h): the schedule of the engine the next init() sets up while
// none is (InvalidArgument, the caller's misuse, while initialised). Not a user setting.
Status setBenchSchedule(Schedule schedule);

ncclResult_t toNcclResult(const Status& status);

}  // namespace bagua::net::plugin
