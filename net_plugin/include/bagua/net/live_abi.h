/* Bagua-Net's live-settings entry: the C functions libnccl-net.so exports next to its NCCL plugin
 * tables, so that a process can change the transport knobs of the plugin copy NCCL loaded
 * (the autotuner does, between training iterations). Valid C and C++; no bagua types.
 *
 * Contract (version 1):
 *   int baguaNetSetLive_v1(int activeStreams, uint64_t minChunkBytes, uint64_t maxChunkBytes);
 *   int baguaNetGetLive_v1(int* activeStreams, uint64_t* minChunkBytes, uint64_t* maxChunkBytes);
 * set / read the plugin's process-wide live settings (bagua::net::LiveSettings in
 * bagua/net/engine.h: a field at 0 is "not set"; activeStreams 0..64, chunk bounds 0 or
 * 1 B..1 GiB, min <= max when both are set). Both return an ncclResult_t value:
 * BAGUA_NET_LIVE_OK (0) on success, BAGUA_NET_LIVE_INVALID_USAGE (5, ncclInvalidUsage) for a
 * value out of range or a null pointer (a refused setting leaves the old one), another non-zero
 * value for anything else (ncclInternalError, ncclSystemError). Thread-safe; a change applies
 * from each send comm's next message.
 *
 * Finding them: look the symbols up in the module NCCL already loaded (dl_iterate_phdr, then
 * dlopen(path, RTLD_NOLOAD) and dlsym(BAGUA_NET_LIVE_SET_SYMBOL)). Never dlopen the plugin
 * yourself to reach them: that would load a second copy of the engine, whose settings no NCCL
 * communicator reads. Do not link against these declarations either; they are here so that the
 * exporting definitions and every caller's function-pointer type come from one place. */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BAGUA_NET_LIVE_SET_SYMBOL "baguaNetSetLive_v1"
#define BAGUA_NET_LIVE_GET_SYMBOL "baguaNetGetLive_v1"

/* Return values the caller may test for (ncclResult_t's numbering). */
#define BAGUA_NET_LIVE_OK 0
#define BAGUA_NET_LIVE_INVALID_USAGE 5

typedef int (*baguaNetSetLive_v1_t)(int activeStreams, uint64_t minChunkBytes,
                                    uint64_t maxChunkBytes);
typedef int (*baguaNetGetLive_v1_t)(int* activeStreams, uint64_t* minChunkBytes,
                                    uint64_t* maxChunkBytes);

int baguaNetSetLive_v1(int activeStreams, uint64_t minChunkBytes, uint64_t maxChunkBytes);
int baguaNetGetLive_v1(int* activeStreams, uint64_t* minChunkBytes, uint64_t* maxChunkBytes);

#ifdef __cplusplus
}
#endif
