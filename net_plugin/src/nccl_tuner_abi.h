// Our own declaration of NCCL's tuner plugin ABI, versions 3 to 6 (symbols ncclTunerPlugin_v6 ...
// ncclTunerPlugin_v3), as NCCL 2.22-2.30 load it. NCCL looks for a tuner in
// NCCL_TUNER_PLUGIN, then libnccl-tuner.so, then in the net plugin's own library, so exporting
// these tables from libnccl-net.so makes NCCL use our protocol/channel policy whenever it uses
// Bagua-Net, with nothing to configure. Written from the documented API; layouts pinned below.
//
// Versions: v3 (NCCL 2.22-2.23) introduced the cost table; v4 (2.24-2.26) added regBuff to
// getCollInfo; v5 (2.27+) passes a comm id, NVLink-domain facts and NCCL's tuning constants to
// init and renames destroy to finalize; v6 (2.30) is v5 plus an optional getChunkSize at the end
// (NULL: NCCL's chunk size). NCCL 2.27-2.29 load v5 first, then v4, then v3; 2.30 v6 first.
#pragma once

#include <cstddef>
#include <cstdint>

#include "nccl_net_abi.h"

extern "C" {

// Collective kinds (ncclFunc_t); the same values in every version above.
typedef enum {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4,
  ncclFuncSendRecv = 5,
  ncclFuncSend = 6,
  ncclFuncRecv = 7,
} ncclFunc_t;

// Logger subsystem flag for tuning messages (NCCL_DEBUG_SUBSYS=TUNING).
inline constexpr unsigned long NCCL_TUNING = 0x40;

// Protocol columns of the cost table (NCCL_PROTO_*), the same in v3-v5. Entries NCCL does not
// consider hold NCCL_ALGO_PROTO_IGNORE; NCCL picks the smallest non-negative entry.
#define NCCL_PROTO_LL 0
#define NCCL_PROTO_LL128 1
#define NCCL_PROTO_SIMPLE 2
#define NCCL_ALGO_PROTO_IGNORE (-1.0f)

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;

// NCCL's tuning constants as v5 hands them to init (in/out; we leave them alone).
typedef struct {
  double baseLatencies[7][3];   // [algorithm][protocol]
  double hwLatencies[3][7][3];  // [NVLink, PCI, NET][algorithm][protocol]
  double llMaxBws[4][3];        // [compute capability][tuning scale]
  double perChMaxRingLL128Bws[4][3];
  double perChMaxTreeLL128Bws[4][3];
  double perChMaxTreeBws[4][3];
  double perChMaxNVLSTreeBws[4][3];
} ncclTunerConstants_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t* nvlDomainInfo,
                       ncclTunerConstants_v5_t* constants);
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* ctx);
} ncclTuner_v5_t;

typedef ncclTunerConstants_v5_t ncclTunerConstants_v6_t;
typedef ncclNvlDomainInfo_v5_t ncclNvlDomainInfo_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v6_t* nvlDomainInfo,
                       ncclTunerConstants_v6_t* constants);
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* ctx);
  // Optional: may change NCCL's chunk size for a collective (in/out, clamped by NCCL).
  ncclResult_t (*getChunkSize)(void* ctx, ncclFunc_t collType, size_t nBytes, int algo, int proto,
                               int nChannels, size_t* chunkSize);
} ncclTuner_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** ctx);
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*destroy)(void* ctx);
} ncclTuner_v4_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** ctx);
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int* nChannels);
  ncclResult_t (*destroy)(void* ctx);
} ncclTuner_v3_t;

}  // extern "C"

// ---- Layouts (LP64)
// ------------------------------------------------------------------------------
static_assert(sizeof(ncclFunc_t) == 4);
static_assert(sizeof(ncclNvlDomainInfo_v5_t) == 12);
static_assert(offsetof(ncclTunerConstants_v5_t, hwLatencies) == 7 * 3 * 8);
static_assert(offsetof(ncclTunerConstants_v5_t, llMaxBws) == (21 + 63) * 8);
static_assert(sizeof(ncclTunerConstants_v5_t) == (21 + 63 + 5 * 12) * 8);
static_assert(sizeof(ncclTuner_v5_t) == 32 && offsetof(ncclTuner_v5_t, getCollInfo) == 16);
static_assert(sizeof(ncclTuner_v4_t) == 32 && offsetof(ncclTuner_v4_t, destroy) == 24);
static_assert(sizeof(ncclTuner_v3_t) == 32 && offsetof(ncclTuner_v3_t, getCollInfo) == 16);
static_assert(sizeof(ncclTuner_v6_t) == 40 && offsetof(ncclTuner_v6_t, finalize) == 24 &&
              offsetof(ncclTuner_v6_t, getChunkSize) == 32);
