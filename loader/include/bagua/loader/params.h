// The loader's parameter catalogue (dumped by bagua-params). API options in LoaderOptions beat
// these; these beat the defaults.
//
//   BAGUA_LOADER_NUM_WORKERS       worker threads per DataLoader (0: load in next()'s caller)
//   BAGUA_LOADER_PREFETCH_BATCHES  batches loaded ahead of the consumer
//   BAGUA_LOADER_PIN_MEMORY        pack batches into page-locked memory
//   BAGUA_LOADER_TIMEOUT           longest wait of next() for one batch, seconds
//   BAGUA_LOADER_PROGRESS          show the progress line (samples/s, ETA) on stderr
#pragma once

#include <string>

#include "bagua/base/logging.h"
#include "bagua/base/params.h"

namespace bagua::loader {

// The library's knobs, each declared once (bagua/base/params.h): read them as
// loaderParams().numWorkers.get().
struct LoaderParams : ParamCatalogue {
  LoaderParams() : ParamCatalogue("loader", "load-balanced samplers and the prefetching loader") {}

  IntParam numWorkers{
      *this,
      "BAGUA_LOADER_NUM_WORKERS",
      2,
      {0, 256},
      "Worker threads per data loader that read samples and collate batches; 0 loads "
      "each batch in the thread calling next() (no prefetch)."};
  IntParam prefetchBatches{
      *this,
      "BAGUA_LOADER_PREFETCH_BATCHES",
      4,
      {1, 4096},
      "Batches loaded ahead of the consumer (bounds the loader's memory to this many "
      "batches plus one in flight per worker)."};
  BoolParam pinMemory{
      *this, "BAGUA_LOADER_PIN_MEMORY", false,
      "Pack batches into page-locked host memory (cudaHostAlloc with a CUDA device, "
      "else mmap + mlock) so GPU copies can be asynchronous."};
  DoubleParam timeout{*this,
                      "BAGUA_LOADER_TIMEOUT",
                      300.0,
                      {0.001, 86400.0},
                      "Longest time next() waits for one batch, in seconds, before it fails with "
                      "DeadlineExceeded (a stuck dataset read)."};
  BoolParam progress{*this, "BAGUA_LOADER_PROGRESS", false,
                     "Show a progress line (samples/s, ETA) on stderr while an epoch is read."};
};
LoaderParams& loaderParams();

// The loader's log category (BAGUA_LOG_SUBSYS name "loader").
inline const LogCategory kLogLoader{"loader"};

}  // namespace bagua::loader
