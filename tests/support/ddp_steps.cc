#include "ddp_steps.h"

#include "multi_rank.h"

namespace bagua::testing {

Result<std::unique_ptr<core::ProcessGroup>> hostGroup(std::shared_ptr<core::Store> store, int rank,
                                                      int world,
                                                      std::chrono::milliseconds collectiveTimeout) {
  core::ProcessGroupOptions po;
  po.rank = rank;
  po.worldSize = world;
  po.hierarchical = false;
  po.rendezvousTimeout = std::chrono::milliseconds(20000);
  po.collectiveTimeout = collectiveTimeout;
  return core::ProcessGroup::create(std::move(store), po);
}

std::string runHostRanks(
    int world, const std::function<std::string(int rank, core::ProcessGroup& group)>& body,
    std::chrono::milliseconds timeout) {
  auto store = std::make_shared<core::InMemoryStore>();
  auto res = runRanks(
      world,
      [&](int r) -> std::string {
        auto pg = hostGroup(store, r, world);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        return body(r, **pg);
      },
      timeout);
  return joinFailures(res);
}

Result<float> mlpStep(core::DistributedDataParallel& ddp, core::Optimizer& opt, example::Mlp& model,
                      const std::vector<float>& x, const std::vector<int32_t>& y) {
  opt.zeroGrad();
  BAGUA_RETURN_IF_ERROR(ddp.prepareForward());
  const float loss = model.forward(x.data(), y.data(), static_cast<int>(y.size()));
  Status s;
  model.backward([&](int p) {
    if (s.isOk()) {
      s = ddp.markGradReady(p);
    }
  });
  BAGUA_RETURN_IF_ERROR(s);
  BAGUA_RETURN_IF_ERROR(ddp.finishBackward());
  BAGUA_RETURN_IF_ERROR(ddp.step());
  return loss;
}

}  // namespace bagua::testing
