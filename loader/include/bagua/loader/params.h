// The loader's parameter catalogue (dumped by bagua-params). API options in LoaderOptions beat
// these; these beat the defaults.
//
//   BAGUA_LOADER_NUM_WORKERS       worker threads per DataLoader (0: load in next()'s caller)
//   BAGUA_LOADER_PREFETCH_BATCHES  batches loaded ahead of the consumer
//   BAGUA_LOADER_PIN_MEMORY        pack batches into page-locked memory
//   BAGUA_LOADER_TIMEOUT           longest wait of next() for one batch, seconds
//   BAGUA_LOADER_PROGRESS          show the progress line (samples/s, ETA) on stderr
#pragma once

#include "bagua/base/params.h"

namespace bagua::loader {

ParamCatalogue& loaderParams();

}  // namespace bagua::loader
