// Shared set-up and step loops for tests that train through the reducer on the host backend:
// a flat process group for one rank, and one optimizer step of the core's example MLP.
//
// Thread safety: each function touches only its arguments; call them from the rank's own thread
// (testing::runRanks), one reducer per thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/ddp.h"
#include "bagua/core/process_group.h"
#include "bagua/core/store.h"
#include "example_mlp.h"

namespace bagua::testing {

// Rank `rank` of a `world`-rank group on `store`: flat (no hierarchical mode), 20 s to rendezvous,
// `collectiveTimeout` per collective.
Result<std::unique_ptr<core::ProcessGroup>> hostGroup(
    std::shared_ptr<core::Store> store, int rank, int world,
    std::chrono::milliseconds collectiveTimeout = std::chrono::milliseconds(20000));

// Runs body(rank, group) on `world` ranks (threads, testing::runRanks) over one in-memory store,
// each rank's hostGroup made first (an error there is that rank's failure); the joined failures
// ("" when every rank passed). A rank still running after `timeout` is reported as hung.
std::string runHostRanks(
    int world, const std::function<std::string(int rank, core::ProcessGroup& group)>& body,
    std::chrono::milliseconds timeout);

// One training step of `model` through `ddp` on the batch (x: batch x inputs, y: labels), as a
// training loop runs it: the optimizer's zeroGrad, prepareForward, forward, backward marking each
// gradient ready as it is produced, finishBackward, step. Returns the batch's loss (before the
// step); the first error, as the reducer returned it.
Result<float> mlpStep(core::DistributedDataParallel& ddp, core::Optimizer& opt, example::Mlp& model,
                      const std::vector<float>& x, const std::vector<int32_t>& y);

}  // namespace bagua::testing
