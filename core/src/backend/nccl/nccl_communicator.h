// The NCCL communicator: the Communicator interface on CUDA device buffers, one CUDA stream per
// communicator (non-blocking, high priority). Built only when NCCL and CUDA were found.
//
// Init: rank 0 makes the unique id and publishes it through the store ("nccl/id"); every rank
// then waits (rendezvous timeout) until all have arrived, and creates the communicator in NCCL's
// blocking mode: a call launches on the caller's thread and records one pooled CUDA event (no
// helper thread per call as in non-blocking mode). Errors: a watchdog thread aborts the
// communicator (ncclCommAbort) on an NCCL async error or when nothing completes within the
// collective timeout; every Work then completes with the error, so a dead peer is an error in
// bounded time, never a hang. Work::wait spins on the event, then naps briefly.
//
// Thread safety: issuing calls are serialised by a mutex (NCCL requires one issuing thread per
// communicator at a time); Works may be tested and waited on from any thread without the
// communicator's locks. A Work must not outlive its communicator.
#pragma once

#include <memory>

#include "bagua/core/communicator.h"
#include "bagua/core/process_group.h"
#include "bagua/core/store.h"

namespace bagua::core::nccl {

// Uses options.cudaDevice (or options.localRank when -1) as the device.
Result<std::unique_ptr<Communicator>> createNcclCommunicator(Store& store, int rank, int size,
                                                             const ProcessGroupOptions& options);

// Number of visible CUDA devices (0 when there is no driver or no GPU).
int visibleCudaDevices();

}  // namespace bagua::core::nccl
