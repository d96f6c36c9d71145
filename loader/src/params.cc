#include "bagua/loader/params.h"

namespace bagua::loader {

ParamCatalogue& loaderParams() {
  static ParamCatalogue* catalogue = [] {
    auto* c = new ParamCatalogue("loader", "load-balanced samplers and the prefetching loader");
    c->addInt("BAGUA_LOADER_NUM_WORKERS", 2, 0, 256,
              "Worker threads per data loader that read samples and collate batches; 0 loads "
              "each batch in the thread calling next() (no prefetch).");
    c->addInt("BAGUA_LOADER_PREFETCH_BATCHES", 4, 1, 4096,
              "Batches loaded ahead of the consumer (bounds the loader's memory to this many "
              "batches plus one in flight per worker).");
    c->addBool("BAGUA_LOADER_PIN_MEMORY", false,
               "Pack batches into page-locked host memory (cudaHostAlloc with a CUDA device, "
               "else mmap + mlock) so GPU copies can be asynchronous.");
    c->addDouble("BAGUA_LOADER_TIMEOUT", 300.0, 0.001, 86400.0,
                 "Longest time next() waits for one batch, in seconds, before it fails with "
                 "DeadlineExceeded (a stuck dataset read).");
    c->addBool("BAGUA_LOADER_PROGRESS", false,
               "Show a progress line (samples/s, ETA) on stderr while an epoch is read.");
    return c;
  }();
  return *catalogue;
}

}  // namespace bagua::loader
