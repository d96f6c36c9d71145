// The NCCL communicator: the Communicator interface on CUDA device buffers, one CUDA stream per
// communicator (non-blocking, high priority). Built only when NCCL and CUDA were found.
//
// Init: rank 0 makes the unique id and publishes it through the store ("nccl/id"); the
// communicator is created in NCCL's non-blocking mode so init and every call can be polled with
// a deadline. Errors: Work::wait polls the CUDA event and ncclCommGetAsyncError; an async error
// or a deadline aborts the communicator (ncclCommAbort) and completes the Work with NcclError or
// DeadlineExceeded, so a dead peer is an error, never a silent hang.
//
// Thread safety: issuing calls are serialised by a mutex (NCCL requires one issuing thread per
// communicator at a time); Works may be waited on from any thread.
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
