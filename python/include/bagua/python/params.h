// The Python package's parameter catalogue: the knobs only the `bagua` Python package reads
// (Bagua's Python-side variables and the launchers' node variables the core does not use).
// Declared here, in C++, so that `bagua-params` lists them beside every library's knobs; the
// package reads them through the extension (bagua/_catalogue.py) with these parsers and defaults.
// The launcher variables the core also reads (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT) and the BAGUA_AUTOTUNE* knobs are declared once, in the core's and
// the autotune library's catalogues.
//
// Thread safety: see bagua/base/params.h (values are read once and then frozen).
#pragma once

#include <cstdint>

#include "bagua/base/params.h"

namespace bagua::py {

struct PythonParams : ParamCatalogue {
  PythonParams()
      : ParamCatalogue("python", "the bagua Python package (bagua.torch_api and its launchers)") {}

  BytesParam defaultBucketSize{
      *this,
      "BAGUA_DEFAULT_BUCKET_SIZE",
      25 << 20,
      {1, uint64_t{1} << 40},
      "bucket size of with_bagua and DistributedDataParallel when the call gives none (the "
      "launchers' --default_bucket_size sets it). Larger buckets mean fewer, larger collectives; "
      "smaller ones start communicating earlier in the backward pass. The default is torch "
      "DDP's bucket_cap_mb (Bagua's was 10 MiB); bench/ddp/compare.py --bucket-mb compares sizes "
      "on a "
      "model"};
  IntParam nodeRank{*this,
                    "NODE_RANK",
                    0,
                    {0, 1 << 20},
                    "index of this node, set by python -m bagua.distributed.launch and baguarun; "
                    "get_node_rank() before init_process_group when not under an elastic "
                    "launcher"};
  IntParam groupRank{*this,
                     "GROUP_RANK",
                     0,
                     {0, 1 << 20},
                     "index of this node, set by torchrun and python -m bagua.distributed.run; "
                     "get_node_rank() before init_process_group under an elastic launcher (RANK, "
                     "GROUP_RANK, LOCAL_RANK and LOCAL_WORLD_SIZE all set)"};
  IntParam restartCount{*this,
                        "TORCHELASTIC_RESTART_COUNT",
                        0,
                        {0, 1 << 30},
                        "set by torchrun: how many times it restarted this node's workers after "
                        "a failure (bagua.torch_api.env.get_restart_count())"};
  IntParam servicePort{*this,
                       "BAGUA_SERVICE_PORT",
                       -1,
                       {-1, 65535},
                       "Bagua's autotune service port, accepted for compatibility and unused: "
                       "autotuning runs in the autotune library through the group's store "
                       "(-1: none)"};
  BoolParam reportMetrics{*this, "BAGUA_REPORT_METRICS", false,
                          "Bagua's metrics switch (is_report_metrics_switch_on()), accepted for "
                          "compatibility; nothing is reported"};
  BoolParam outputAutotuneLog{*this, "BAGUA_IS_OUTPUT_AUTOTUNE_LOG", false,
                              "Bagua's autotune log switch (get_is_output_autotune_log()), "
                              "accepted for compatibility; the autotuner's trial log is "
                              "BAGUA_AUTOTUNE_LOG_FILE"};
};
PythonParams& pythonParams();

}  // namespace bagua::py
