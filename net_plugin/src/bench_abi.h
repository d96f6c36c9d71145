/* The benchmark's entry into libnccl-net.so: the chunk schedule of the engine the next init()
 * sets up. bagua-net-bench (tools/net_bench) measures the dynamic schedule against an equal-split
 * round-robin over the same streams (what NCCL Socket and the original Bagua-Net do, its "rr"
 * cases) through the same module. Not a user setting: no environment variable reaches it, and a
 * training job has no reason to call it.
 *
 * Contract (version 1):
 *   int baguaNetBenchSchedule_v1(int roundRobin);
 * 1: round-robin, 0: dynamic (the default), for the engine of the next init() that finds the
 * module uninitialised (the first, or the first after the last finalize). Returns
 * BAGUA_NET_BENCH_OK (0), or BAGUA_NET_BENCH_INVALID_USAGE (5, ncclInvalidUsage) for another
 * value or while the module is initialised (its comms keep the schedule they were made with).
 * Valid C and C++; the exporting definition (abi_nccl.cc) and the caller's function-pointer type
 * come from here. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

#define BAGUA_NET_BENCH_SCHEDULE_SYMBOL "baguaNetBenchSchedule_v1"
#define BAGUA_NET_BENCH_OK 0
#define BAGUA_NET_BENCH_INVALID_USAGE 5

typedef int (*baguaNetBenchSchedule_v1_t)(int roundRobin);

int baguaNetBenchSchedule_v1(int roundRobin);

#ifdef __cplusplus
}
#endif
