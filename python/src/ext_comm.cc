// Process groups and collectives on raw buffers (CPU memory on the host backend, device memory
// on the NCCL backend). Every blocking call releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bagua/core/communicator.h"
#include "bagua/core/params.h"
#include "bagua/core/process_group.h"
#include "bagua/core/store.h"
#include "ext.h"

namespace bagua::py {

namespace {

using core::Communicator;
using core::DataType;
using core::ProcessGroup;
using core::ReduceOp;
using core::WorkPtr;

void* ptr(uintptr_t p) {
  return reinterpret_cast<void*>(p);
}

DataType dtypeOf(int code) {
  if (code < 0 || code >= core::kNumDataTypes) {
    throw pyb::value_error("bad dtype code " + std::to_string(code));
  }
  return static_cast<DataType>(code);
}

ReduceOp opOf(int code) {
  if (code < 0 || code >= core::kNumReduceOps) {
    throw pyb::value_error("bad reduce-op code " + std::to_string(code));
  }
  return static_cast<ReduceOp>(code);
}

std::chrono::milliseconds collectiveTimeout() {
  return std::chrono::milliseconds(take(core::coreParams().collectiveTimeoutMs.get()));
}

// A Work plus the Python objects whose memory it borrows (kept alive until it completes).
class PyWork {
 public:
  PyWork(WorkPtr work, pyb::object keep) : work_(std::move(work)), keep_(std::move(keep)) {}
  // Waits up to timeoutMs (negative: the collective timeout); raises on failure.
  void wait(int64_t timeoutMs) {
    const auto t = timeoutMs < 0 ? collectiveTimeout() : std::chrono::milliseconds(timeoutMs);
    Status s;
    {
      pyb::gil_scoped_release nogil;
      s = work_->wait(t);
    }
    check(s);
  }
  bool test() { return work_->test(); }

 private:
  WorkPtr work_;
  pyb::object keep_;
};

// The TCP store server that rank 0 hosts for init_group: port 0 picks a free port, which the
// Python side publishes through torch.distributed's store (one listening port per job, the one
// torch's store already has, so no second fixed port can clash under baguarun or torchrun).
class PyStoreServer {
 public:
  explicit PyStoreServer(std::unique_ptr<core::TcpStoreServer> s) : server_(std::move(s)) {}
  int port() const { return server_->port(); }

 private:
  std::unique_ptr<core::TcpStoreServer> server_;
};

// A process group, plus (rank 0 of init_group) the store server its store talks to.
class PyGroup {
 public:
  explicit PyGroup(std::unique_ptr<ProcessGroup> pg, std::shared_ptr<PyStoreServer> server = {})
      : server_(std::move(server)), pg_(std::move(pg)) {}
  ProcessGroup& pg() { return *pg_; }
  Communicator& comm() { return pg_->global(); }

  // Destroys the group with the GIL released (closing connections can wait on peers).
  void destroy() {
    pyb::gil_scoped_release nogil;
    pg_.reset();
    server_.reset();  // after the group: peers still closing get a clean error
  }
  bool alive() const { return pg_ != nullptr; }
  ProcessGroup& live() {
    if (!pg_) {
      throw std::runtime_error("this process group was destroyed");
    }
    return *pg_;
  }

 private:
  std::shared_ptr<PyStoreServer> server_;  // declared first: destroyed after pg_
  std::unique_ptr<ProcessGroup> pg_;
};

template <typename F>
PyWork issue(F&& f, pyb::object keep) {
  WorkPtr w;
  {
    pyb::gil_scoped_release nogil;
    w = f();
  }
  return PyWork(std::move(w), std::move(keep));
}

core::Backend backendOf(const std::string& name) {
  if (name == "host" || name == "gloo" || name == "cpu") {
    return core::Backend::kHost;
  }
  if (name == "nccl") {
    return core::Backend::kNccl;
  }
  throw pyb::value_error("backend '" + name + "': expected 'host' or 'nccl'");
}

using GroupClass = pyb::class_<PyGroup, std::shared_ptr<PyGroup>>;

// Work, and the Group class with its read-only properties.
GroupClass bindWorkAndGroupInfo(pyb::module_& m) {
  pyb::class_<PyWork>(m, "Work")
      .def("wait", &PyWork::wait, pyb::arg("timeout_ms") = -1,
           "Blocks until the operation completes (GIL released); raises RuntimeError on failure")
      .def("test", &PyWork::test);

  GroupClass group(m, "Group");
  group.def_property_readonly("rank", [](PyGroup& g) { return g.live().rank(); })
      .def_property_readonly("size", [](PyGroup& g) { return g.live().size(); })
      .def_property_readonly("local_rank", [](PyGroup& g) { return g.live().localRank(); })
      .def_property_readonly("local_size", [](PyGroup& g) { return g.live().localSize(); })
      .def_property_readonly("node_rank", [](PyGroup& g) { return g.live().nodeRank(); })
      .def_property_readonly("num_nodes", [](PyGroup& g) { return g.live().numNodes(); })
      .def_property_readonly("backend", [](PyGroup& g) { return g.live().global().backendName(); })
      .def_property_readonly("alive", &PyGroup::alive);
  return group;
}

// Group's collectives on raw buffers: all_reduce, reduce, reduce_scatter, all_gather,
// broadcast, all_to_all.
void bindGroupCollectives(GroupClass& group) {
  group
      .def(
          "all_reduce",
          [](PyGroup& g, uintptr_t send, uintptr_t recv, size_t count, int dt, int op,
             pyb::object keep) {
            Communicator& c = g.live().global();
            return issue(
                [&] { return c.allReduce(ptr(send), ptr(recv), count, dtypeOf(dt), opOf(op)); },
                keep);
          },
          pyb::arg("send"), pyb::arg("recv"), pyb::arg("count"), pyb::arg("dtype"), pyb::arg("op"),
          pyb::arg("keep") = pyb::none())
      .def(
          "reduce",
          [](PyGroup& g, uintptr_t send, uintptr_t recv, size_t count, int dt, int op, int root,
             pyb::object keep) {
            Communicator& c = g.live().global();
            return issue(
                [&] { return c.reduce(ptr(send), ptr(recv), count, dtypeOf(dt), opOf(op), root); },
                keep);
          },
          pyb::arg("send"), pyb::arg("recv"), pyb::arg("count"), pyb::arg("dtype"), pyb::arg("op"),
          pyb::arg("root"), pyb::arg("keep") = pyb::none())
      .def(
          "reduce_scatter",
          [](PyGroup& g, uintptr_t send, uintptr_t recv, size_t count, int dt, int op,
             pyb::object keep) {
            Communicator& c = g.live().global();
            return issue(
                [&] { return c.reduceScatter(ptr(send), ptr(recv), count, dtypeOf(dt), opOf(op)); },
                keep);
          },
          pyb::arg("send"), pyb::arg("recv"), pyb::arg("count"), pyb::arg("dtype"), pyb::arg("op"),
          pyb::arg("keep") = pyb::none())
      .def(
          "all_gather",
          [](PyGroup& g, uintptr_t send, uintptr_t recv, size_t count, int dt, pyb::object keep) {
            Communicator& c = g.live().global();
            return issue([&] { return c.allGather(ptr(send), ptr(recv), count, dtypeOf(dt)); },
                         keep);
          },
          pyb::arg("send"), pyb::arg("recv"), pyb::arg("count"), pyb::arg("dtype"),
          pyb::arg("keep") = pyb::none())
      .def(
          "broadcast",
          [](PyGroup& g, uintptr_t buf, size_t count, int dt, int root, pyb::object keep) {
            Communicator& c = g.live().global();
            return issue([&] { return c.broadcast(ptr(buf), count, dtypeOf(dt), root); }, keep);
          },
          pyb::arg("buffer"), pyb::arg("count"), pyb::arg("dtype"), pyb::arg("root"),
          pyb::arg("keep") = pyb::none())
      .def(
          "all_to_all",
          [](PyGroup& g, uintptr_t send, uintptr_t recv, size_t count, int dt, pyb::object keep) {
            Communicator& c = g.live().global();
            return issue([&] { return c.allToAll(ptr(send), ptr(recv), count, dtypeOf(dt)); },
                         keep);
          },
          pyb::arg("send"), pyb::arg("recv"), pyb::arg("count"), pyb::arg("dtype"),
          pyb::arg("keep") = pyb::none());
}

// Group's point-to-point send and recv.
void bindGroupPointToPoint(GroupClass& group) {
  group
      .def(
          "send",
          [](PyGroup& g, uintptr_t buf, size_t count, int dt, int peer, pyb::object keep) {
            Communicator& c = g.live().global();
            return issue([&] { return c.send(ptr(buf), count, dtypeOf(dt), peer); }, keep);
          },
          pyb::arg("buffer"), pyb::arg("count"), pyb::arg("dtype"), pyb::arg("peer"),
          pyb::arg("keep") = pyb::none())
      .def(
          "recv",
          [](PyGroup& g, uintptr_t buf, size_t count, int dt, int peer, pyb::object keep) {
            Communicator& c = g.live().global();
            return issue([&] { return c.recv(ptr(buf), count, dtypeOf(dt), peer); }, keep);
          },
          pyb::arg("buffer"), pyb::arg("count"), pyb::arg("dtype"), pyb::arg("peer"),
          pyb::arg("keep") = pyb::none());
}

// Group's barrier, abort, stats, destroy and new_group.
void bindGroupControl(GroupClass& group) {
  group
      .def("barrier",
           [](PyGroup& g) {
             Communicator& c = g.live().global();
             return issue([&] { return c.barrier(); }, pyb::none());
           })
      .def("abort", [](PyGroup& g, const std::string& why) { g.live().abort(why); })
      .def("stats",
           [](PyGroup& g) {
             core::CommStats s = g.live().stats();
             pyb::dict d;
             d["bytes_sent"] = s.bytesSent;
             d["bytes_received"] = s.bytesReceived;
             d["operations"] = s.operations;
             // Per communicator: the global and intra-node ones run on every rank, the
             // inter-node one only on node leaders, so only the first two compare across ranks.
             pyb::dict by;
             ProcessGroup& pg = g.live();
             by["global"] = pg.global().stats().operations;
             by["intra"] = pg.intraNode() != nullptr ? pg.intraNode()->stats().operations : 0;
             by["inter"] = pg.interNode() != nullptr ? pg.interNode()->stats().operations : 0;
             d["operations_by_communicator"] = by;
             return d;
           })
      .def("destroy", &PyGroup::destroy,
           "Closes the group's connections (collective in spirit: every rank should do it)")
      .def(
          "new_group",
          [](PyGroup& g, const std::vector<int>& ranks, const std::string& name,
             const std::string& backend, bool hierarchical, int cudaDevice, int localRank,
             int localWorldSize) -> std::shared_ptr<PyGroup> {
            // A group over `ranks` (in that order) on the same store. Collective over the
            // parent: every rank calls it; non-members get None. local_world_size /
            // local_rank: the members' node layout (-1: the parent's for the whole group, else
            // one node).
            ProcessGroup& parent = g.live();
            int myIndex = -1;
            for (size_t i = 0; i < ranks.size(); ++i) {
              if (ranks[i] == parent.rank()) {
                myIndex = static_cast<int>(i);
              }
            }
            if (myIndex < 0) {
              return nullptr;
            }
            core::ProcessGroupOptions o;
            o.rank = myIndex;
            o.worldSize = static_cast<int>(ranks.size());
            const bool whole = ranks.size() == static_cast<size_t>(parent.size());
            o.localWorldSize =
                localWorldSize > 0 ? localWorldSize : (whole ? parent.localSize() : -1);
            o.localRank = localWorldSize > 0 ? localRank : (whole ? parent.localRank() : -1);
            o.backend = backendOf(backend);
            o.hierarchical = hierarchical;
            o.name = name;
            o.cudaDevice = cudaDevice;
            o.collectiveTimeout = parent.options().collectiveTimeout;
            o.rendezvousTimeout = parent.options().rendezvousTimeout;
            Result<std::unique_ptr<ProcessGroup>> r = Status();
            {
              pyb::gil_scoped_release nogil;
              r = ProcessGroup::create(parent.store(), o);
            }
            return std::make_shared<PyGroup>(take(std::move(r)));
          },
          pyb::arg("ranks"), pyb::arg("name"), pyb::arg("backend") = "host",
          pyb::arg("hierarchical") = false, pyb::arg("cuda_device") = -1,
          pyb::arg("local_rank") = -1, pyb::arg("local_world_size") = -1);
}

// The module's rendezvous functions (init_from_env, start_store_server and its StoreServer,
// init_group) and collective_timeout_ms.
void bindRendezvous(pyb::module_& m) {
  m.def(
      "init_from_env",
      [](const std::string& backend, bool hierarchical, int rank, int worldSize, int localRank,
         int localWorldSize, int cudaDevice) {
        // API arguments beat the environment (ParamCatalogue overrides), as Bagua's
        // init_process_group(rank=..., world_size=...) does.
        auto override = [](Param<int64_t>& p, int v) {
          if (v >= 0) {
            check(p.setOverride(v));
          }
        };
        override(core::coreParams().rank, rank);
        override(core::coreParams().worldSize, worldSize);
        override(core::coreParams().localRank, localRank);
        override(core::coreParams().localWorldSize, localWorldSize);
        core::ProcessGroupOptions o;
        o.backend = backendOf(backend);
        o.hierarchical = hierarchical;
        o.cudaDevice = cudaDevice;
        Result<std::unique_ptr<ProcessGroup>> r = Status();
        {
          pyb::gil_scoped_release nogil;
          r = ProcessGroup::initFromEnv(o);
        }
        return std::make_shared<PyGroup>(take(std::move(r)));
      },
      pyb::arg("backend") = "host", pyb::arg("hierarchical") = true, pyb::arg("rank") = -1,
      pyb::arg("world_size") = -1, pyb::arg("local_rank") = -1, pyb::arg("local_world_size") = -1,
      pyb::arg("cuda_device") = -1,
      "env:// rendezvous (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, "
      "LOCAL_WORLD_SIZE); rank 0 hosts the store");
  pyb::class_<PyStoreServer, std::shared_ptr<PyStoreServer>>(m, "StoreServer")
      .def_property_readonly("port", &PyStoreServer::port);
  m.def(
      "start_store_server",
      [](const std::string& host, int port) {
        // `host` is MASTER_ADDR: listen on its interface (or BAGUA_STORE_LISTEN_ADDR).
        Result<std::string> addr = core::storeListenAddress(host);
        if (!addr.isOk()) {
          check(addr.takeStatus());
        }
        Result<std::unique_ptr<core::TcpStoreServer>> r = core::TcpStoreServer::start(*addr, port);
        return std::make_shared<PyStoreServer>(take(std::move(r)));
      },
      pyb::arg("host"), pyb::arg("port") = 0,
      "Starts the core's TCP store server on host:port (0: a free port; see .port)");
  m.def(
      "init_group",
      [](const std::string& addr, int port, int rank, int worldSize, int localRank,
         int localWorldSize, const std::string& backend, bool hierarchical, int cudaDevice,
         std::shared_ptr<PyStoreServer> server) {
        // Like init_from_env, with the store's address given (not MASTER_ADDR/MASTER_PORT):
        // every rank connects to the server rank 0 started with start_store_server.
        core::ProcessGroupOptions o;
        o.rank = rank;
        o.worldSize = worldSize;
        o.localRank = localRank;
        o.localWorldSize = localWorldSize;
        o.backend = backendOf(backend);
        o.hierarchical = hierarchical;
        o.cudaDevice = cudaDevice;
        o.rendezvousTimeout =
            std::chrono::milliseconds(take(core::coreParams().rendezvousTimeoutMs.get()));
        core::TcpStoreOptions so;
        so.host = addr;
        so.port = port;
        so.connectTimeout = o.rendezvousTimeout;
        Result<std::unique_ptr<ProcessGroup>> r = Status();
        {
          pyb::gil_scoped_release nogil;
          Result<std::unique_ptr<core::TcpStore>> client = core::TcpStore::connect(so);
          if (!client.isOk()) {
            r = client.status();
          } else {
            std::shared_ptr<core::Store> store(std::move(client).value());
            r = ProcessGroup::create(store, o);
          }
        }
        return std::make_shared<PyGroup>(take(std::move(r)), std::move(server));
      },
      pyb::arg("addr"), pyb::arg("port"), pyb::arg("rank"), pyb::arg("world_size"),
      pyb::arg("local_rank"), pyb::arg("local_world_size"), pyb::arg("backend") = "host",
      pyb::arg("hierarchical") = true, pyb::arg("cuda_device") = -1, pyb::arg("server") = nullptr,
      "Rendezvous on the core store at addr:port (rank 0 passes the server it started, which the "
      "group then owns)");
  m.def("collective_timeout_ms", [] { return collectiveTimeout().count(); });
}

}  // namespace

void bindComm(pyb::module_& m) {
  GroupClass group = bindWorkAndGroupInfo(m);
  bindGroupCollectives(group);
  bindGroupPointToPoint(group);
  bindGroupControl(group);
  bindRendezvous(m);
}

// For ext_ddp.cc: the ProcessGroup inside a Group object.
core::ProcessGroup& groupOf(const pyb::object& group) {
  return group.cast<PyGroup&>().live();
}

}  // namespace bagua::py
