// contrib: the load-balancing samplers and the elastic batch plan (loader/), the dataset cache
// (dataset_cache/).
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bagua/core/job_key.h"
#include "bagua/dataset_cache/cache.h"
#include "bagua/dataset_cache/value_codec.h"
#include "bagua/loader/batch_sampler.h"
#include "bagua/loader/elastic_plan.h"
#include "bagua/loader/sampler.h"
#include "ext.h"

namespace bagua::py {

namespace {

class PySampler {
 public:
  PySampler(std::vector<int64_t> complexities, int numReplicas, int rank, bool shuffle,
            uint64_t seed, bool dropLast, double randomLevel) {
    loader::LoadBalancingOptions o;
    o.numReplicas = numReplicas;
    o.rank = rank;
    o.shuffle = shuffle;
    o.seed = seed;
    o.dropLast = dropLast;
    o.randomLevel = randomLevel;
    s_ = take(loader::LoadBalancingDistributedSampler::create(std::move(complexities), o));
  }
  loader::LoadBalancingDistributedSampler& get() { return *s_; }

 private:
  std::unique_ptr<loader::LoadBalancingDistributedSampler> s_;
};

class PyBatchSampler {
 public:
  PyBatchSampler(PySampler& sampler, pyb::function batchFn, bool dropLast) : fn_(batchFn) {
    // The batch function is Python: it runs on this (GIL-holding) thread, synchronously.
    loader::BatchFn f = [this](const std::vector<size_t>& indices) -> Result<loader::Batches> {
      try {
        pyb::object r = fn_(indices);
        return r.cast<loader::Batches>();
      } catch (pyb::error_already_set& e) {
        return BAGUA_ERROR(kInvalidArgument, "batch_fn raised: %s", e.what());
      } catch (pyb::cast_error& e) {
        return BAGUA_ERROR(kInvalidArgument, "batch_fn must return a list of lists of indices (%s)",
                           e.what());
      }
    };
    b_ = take(loader::LoadBalancingDistributedBatchSampler::create(sampler.get(), f, dropLast));
  }
  loader::LoadBalancingDistributedBatchSampler& get() { return *b_; }

 private:
  pyb::function fn_;
  std::unique_ptr<loader::LoadBalancingDistributedBatchSampler> b_;
};

// The elastic batch plan behind contrib.ElasticDistributedSampler.
std::unique_ptr<loader::ElasticBatchPlan> makeElasticPlan(size_t datasetSize, size_t batchSize,
                                                          int numReplicas, int rank, bool shuffle,
                                                          uint64_t seed,
                                                          std::vector<int64_t> complexities,
                                                          double randomLevel) {
  loader::ElasticPlanOptions o;
  o.numReplicas = numReplicas;
  o.rank = rank;
  o.batchSize = batchSize;
  o.shuffle = shuffle;
  o.seed = seed;
  o.complexities = std::move(complexities);
  o.randomLevel = randomLevel;
  return take(loader::ElasticBatchPlan::create(datasetSize, std::move(o)));
}

// One cache loader (a dataset name) over a shared backend; values are opaque bytes (Python
// pickles the samples).
class PyCacheLoader {
 public:
  PyCacheLoader(std::shared_ptr<cache::CacheBackend> backend, const std::string& name,
                size_t writerBufferSize)
      : loader_(std::move(backend), cache::CacheLoaderOptions{name, writerBufferSize}) {}

  // `checkValue(value)` (optional) decodes a cached value; when it raises, the value is a miss:
  // counted as corrupt, logged with the exception's text, reloaded and overwritten.
  pyb::bytes get(const std::string& key, const pyb::function& load, const pyb::object& checkValue) {
    std::string value;
    auto fn = [&](std::string_view, std::string& out) -> Status {
      try {
        out = load(key).cast<std::string>();
        return Status::ok();
      } catch (pyb::error_already_set& e) {
        return BAGUA_ERROR(kInvalidArgument, "load function raised: %s", e.what());
      } catch (pyb::cast_error& e) {
        return BAGUA_ERROR(kInvalidArgument, "load function must return bytes (%s)", e.what());
      }
    };
    if (checkValue.is_none()) {
      check(loader_.get(key, value, fn));
    } else {
      auto verify = [&](std::string_view cached) -> Status {
        try {
          checkValue(pyb::bytes(cached.data(), cached.size()));
          return Status::ok();
        } catch (pyb::error_already_set& e) {
          return BAGUA_ERROR(kInvalidArgument, "%s", e.what());
        }
      };
      check(loader_.get(key, value, fn, verify));
    }
    return pyb::bytes(value);
  }
  void flush() { check(loader_.flush()); }
  uint64_t numKeys() { return take(loader_.numKeys()); }
  pyb::dict stats() const {
    cache::CacheStats s = loader_.stats();
    pyb::dict d;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["writes"] = s.writes;
    d["dropped_writes"] = s.droppedWrites;
    d["backend_errors"] = s.backendErrors;
    d["corrupt"] = s.corrupt;
    return d;
  }

 private:
  cache::CacheLoader loader_;
};

// The typed cache codec (value_codec.h) for contrib/utils/codec.py: items as tuples whose first
// field is the tag: (0,) None, (1,) False, (2,) True, (3, int), (4, float), (5, str),
// (6, bytes), (7, n) list, (8, n) tuple, (9, pairs) dict, (10, elem, flavor, shape, data) array.
pyb::bytes cacheEncode(const pyb::list& items) {
  namespace codec = cache::codec;
  std::vector<codec::Item> v(items.size());
  std::vector<std::string> text;  // the UTF-8 of str items, alive until encode returns
  text.reserve(items.size());
  std::vector<pyb::buffer_info> buffers;
  buffers.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const pyb::tuple t = items[i].cast<pyb::tuple>();
    codec::Item& it = v[i];
    it.tag = static_cast<codec::Tag>(t[0].cast<int>());
    switch (it.tag) {
    case codec::Tag::kInt:
      it.integer = t[1].cast<int64_t>();
      break;
    case codec::Tag::kFloat:
      it.real = t[1].cast<double>();
      break;
    case codec::Tag::kStr:
      text.push_back(t[1].cast<std::string>());
      it.data = text.back();
      break;
    case codec::Tag::kBytes:
    case codec::Tag::kArray: {
      const size_t at = it.tag == codec::Tag::kBytes ? 1 : 4;
      buffers.push_back(pyb::buffer(t[at]).request());
      const pyb::buffer_info& b = buffers.back();
      it.data = std::string_view(static_cast<const char*>(b.ptr),
                                 static_cast<size_t>(b.size * b.itemsize));
      if (it.tag == codec::Tag::kArray) {
        it.elem = t[1].cast<uint8_t>();
        it.flavor = t[2].cast<uint8_t>();
        it.shape = t[3].cast<std::vector<uint64_t>>();
      }
      break;
    }
    case codec::Tag::kList:
    case codec::Tag::kTuple:
    case codec::Tag::kDict:
      it.count = t[1].cast<uint64_t>();
      break;
    default:
      break;
    }
  }
  return pyb::bytes(take(codec::encode(v)));
}

pyb::list cacheDecode(const pyb::bytes& data) {
  namespace codec = cache::codec;
  const std::string_view bytes = data;
  pyb::list out;
  for (const codec::Item& it : take(codec::decode(bytes))) {
    const int tag = static_cast<int>(it.tag);
    switch (it.tag) {
    case codec::Tag::kInt:
      out.append(pyb::make_tuple(tag, it.integer));
      break;
    case codec::Tag::kFloat:
      out.append(pyb::make_tuple(tag, it.real));
      break;
    case codec::Tag::kStr:
      out.append(pyb::make_tuple(tag, pyb::str(it.data.data(), it.data.size())));
      break;
    case codec::Tag::kBytes:
      out.append(pyb::make_tuple(tag, pyb::bytes(it.data.data(), it.data.size())));
      break;
    case codec::Tag::kList:
    case codec::Tag::kTuple:
    case codec::Tag::kDict:
      out.append(pyb::make_tuple(tag, it.count));
      break;
    case codec::Tag::kArray: {
      // Writable, so that torch.frombuffer can take it without a copy or a warning.
      pyb::bytearray b(it.data.data(), it.data.size());
      out.append(pyb::make_tuple(tag, it.elem, it.flavor, pyb::tuple(pyb::cast(it.shape)), b));
      break;
    }
    default:
      out.append(pyb::make_tuple(tag));
      break;
    }
  }
  return out;
}

// The typed cache value codec (cache_encode, cache_decode) and the key cached pickles are
// authenticated with.
void bindCacheValueCodec(pyb::module_& m) {
  m.def("cache_encode", &cacheEncode, pyb::arg("items"),
        "Encodes a value's items (pre-order tuples, value_codec.h) as a typed cache value");
  m.def("cache_decode", &cacheDecode, pyb::arg("data"),
        "The items of a typed cache value; ValueError-like RuntimeError when it is damaged");
  m.def(
      "cache_value_key",
      []() -> pyb::object {
        core::JobKey k = take(core::readJobKeyFromParams());
        if (!k.present()) {
          return pyb::none();
        }
        const Digest d = k.derive("cache");
        return pyb::bytes(reinterpret_cast<const char*>(d.data()), d.size());
      },
      "The key cached pickles are authenticated with (derived from the job key), or None without "
      "a job key");
}

// loader/: LoadBalancingSampler, LoadBalancingBatchSampler and ElasticPlan.
void bindLoader(pyb::module_& m) {
  pyb::class_<PySampler>(m, "LoadBalancingSampler")
      .def(pyb::init<std::vector<int64_t>, int, int, bool, uint64_t, bool, double>(),
           pyb::arg("complexities"), pyb::arg("num_replicas"), pyb::arg("rank"),
           pyb::arg("shuffle"), pyb::arg("seed"), pyb::arg("drop_last"), pyb::arg("random_level"))
      .def("set_epoch", [](PySampler& s, uint64_t e) { s.get().setEpoch(e); })
      .def("indices",
           [](PySampler& s) {
             auto v = s.get().indices();
             return std::vector<int64_t>(v.begin(), v.end());
           })
      .def("indices_of",
           [](PySampler& s, int rank) {
             auto v = s.get().indicesOf(rank);
             return std::vector<int64_t>(v.begin(), v.end());
           })
      .def_property_readonly("num_samples", [](PySampler& s) { return s.get().numSamples(); })
      .def_property_readonly("total_size", [](PySampler& s) { return s.get().totalSize(); });

  pyb::class_<PyBatchSampler>(m, "LoadBalancingBatchSampler")
      .def(pyb::init<PySampler&, pyb::function, bool>(), pyb::arg("sampler"), pyb::arg("batch_fn"),
           pyb::arg("drop_last"), pyb::keep_alive<1, 2>())
      .def("set_epoch", [](PyBatchSampler& b, uint64_t e) { check(b.get().setEpoch(e)); })
      .def("batches", [](PyBatchSampler& b) { return b.get().batches(); })
      .def_property_readonly("num_batches", [](PyBatchSampler& b) { return b.get().numBatches(); });

  // position(k) -> (epoch, remaining samples); resume(...) takes the same fields back.
  pyb::class_<loader::ElasticBatchPlan>(m, "ElasticPlan")
      .def(pyb::init(&makeElasticPlan), pyb::arg("dataset_size"), pyb::arg("batch_size"),
           pyb::arg("num_replicas"), pyb::arg("rank"), pyb::arg("shuffle"), pyb::arg("seed"),
           pyb::arg("complexities"), pyb::arg("random_level"))
      .def("batches_for_epoch", [](loader::ElasticBatchPlan& p,
                                   uint64_t epoch) { return take(p.batchesForEpoch(epoch)); })
      .def("position",
           [](const loader::ElasticBatchPlan& p, size_t batchesConsumed) {
             loader::ElasticPosition pos = take(p.position(batchesConsumed));
             return pyb::make_tuple(
                 pos.epoch, std::vector<int64_t>(pos.remaining.begin(), pos.remaining.end()));
           })
      .def(
          "resume",
          [](loader::ElasticBatchPlan& p, uint64_t epoch, const std::vector<int64_t>& remaining,
             uint64_t datasetSize, uint64_t seed) {
            loader::ElasticPosition pos;
            pos.epoch = epoch;
            pos.datasetSize = datasetSize;
            pos.seed = seed;
            pos.numReplicas = static_cast<uint32_t>(p.options().numReplicas);
            for (int64_t i : remaining) {
              if (i < 0) {
                throw pyb::value_error("bagua: the data position names sample " +
                                       std::to_string(i));
              }
              pos.remaining.push_back(static_cast<uint64_t>(i));
            }
            check(p.resume(pos));
          },
          pyb::arg("epoch"), pyb::arg("remaining"), pyb::arg("dataset_size"), pyb::arg("seed"))
      .def_property_readonly("num_steps", &loader::ElasticBatchPlan::numSteps);
}

// CacheBackend: the backend as a key-value store (Bagua's contrib.utils.store API); values are
// bytes. Every call releases the GIL (Redis calls block on the network).
void bindCacheBackend(pyb::module_& m) {
  pyb::class_<cache::CacheBackend, std::shared_ptr<cache::CacheBackend>>(m, "CacheBackend")
      .def("describe", &cache::CacheBackend::describe)
      .def("num_keys",
           [](cache::CacheBackend& b) {
             pyb::gil_scoped_release nogil;
             return take(b.numKeys());
           })
      .def("clear",
           [](cache::CacheBackend& b) {
             pyb::gil_scoped_release nogil;
             check(b.clear());
           })
      .def("ping",
           [](cache::CacheBackend& b) {
             pyb::gil_scoped_release nogil;
             return b.ping().isOk();
           })
      .def("get",
           [](cache::CacheBackend& b, const std::string& key) -> pyb::object {
             std::string value;
             bool hit = false;
             {
               pyb::gil_scoped_release nogil;
               hit = take(b.get(key, value));
             }
             if (!hit) {
               return pyb::none();
             }
             return pyb::bytes(value);
           })
      .def("put",
           [](cache::CacheBackend& b, const std::string& key, const std::string& value) {
             pyb::gil_scoped_release nogil;
             check(b.put(key, value));
           })
      .def("get_many",
           [](cache::CacheBackend& b, const std::vector<std::string>& keys) {
             std::vector<std::string_view> views(keys.begin(), keys.end());
             std::vector<std::optional<std::string>> values;
             {
               pyb::gil_scoped_release nogil;
               check(b.getMany(views, values));
             }
             pyb::list out;
             for (auto& v : values) {
               out.append(v.has_value() ? pyb::object(pyb::bytes(*v)) : pyb::object(pyb::none()));
             }
             return out;
           })
      .def("put_many", [](cache::CacheBackend& b,
                          const std::vector<std::pair<std::string, std::string>>& items) {
        std::vector<cache::KeyValue> kv;
        kv.reserve(items.size());
        for (const auto& [k, v] : items) {
          kv.push_back({k, v});
        }
        pyb::gil_scoped_release nogil;
        check(b.putMany(kv));
      });
}

// make_cache_backend: an embedded or Redis backend from the parameters and the API's arguments.
void bindCacheBackendFactory(pyb::module_& m) {
  m.def(
      "make_cache_backend",
      [](const std::string& kind, int64_t capacityBytes,
         const std::vector<std::pair<std::string, int>>& hosts, int clusterMode, int nodeRank) {
        cache::CacheOptions o = take(cache::CacheOptions::fromParams());
        if (kind == "embedded") {
          o.backend = cache::BackendKind::kEmbedded;
        } else if (kind == "redis") {
          o.backend = cache::BackendKind::kRedis;
        } else {
          throw pyb::value_error("cache backend '" + kind + "': expected 'embedded' or 'redis'");
        }
        if (capacityBytes > 0) {
          o.embedded.capacityBytes = static_cast<uint64_t>(capacityBytes);
          o.redis.capacityPerNode = static_cast<uint64_t>(capacityBytes);
        }
        // API arguments beat the BAGUA_CACHE_REDIS_* parameters (Bagua's RedisStore(hosts=,
        // cluster_mode=)).
        if (!hosts.empty()) {
          o.redis.hosts.clear();
          for (const auto& [host, port] : hosts) {
            o.redis.hosts.push_back(cache::RedisHost{host, port});
          }
        }
        if (clusterMode >= 0) {
          o.redis.clusterMode = clusterMode != 0;
        }
        if (nodeRank >= 0) {
          o.redis.nodeRank = nodeRank;
        }
        pyb::gil_scoped_release nogil;
        return take(cache::makeBackend(o));
      },
      pyb::arg("kind"), pyb::arg("capacity_bytes") = 0,
      pyb::arg("hosts") = std::vector<std::pair<std::string, int>>{}, pyb::arg("cluster_mode") = -1,
      pyb::arg("node_rank") = -1);
}

// CacheLoader: one dataset's cache loader over a shared backend.
void bindCacheLoader(pyb::module_& m) {
  pyb::class_<PyCacheLoader>(m, "CacheLoader")
      .def(pyb::init<std::shared_ptr<cache::CacheBackend>, const std::string&, size_t>(),
           pyb::arg("backend"), pyb::arg("dataset_name"), pyb::arg("writer_buffer_size"))
      .def("get", &PyCacheLoader::get, pyb::arg("key"), pyb::arg("load"),
           pyb::arg("check") = pyb::none())
      .def("flush", &PyCacheLoader::flush)
      .def("num_keys", &PyCacheLoader::numKeys)
      .def("stats", &PyCacheLoader::stats);
}

}  // namespace

void bindContrib(pyb::module_& m) {
  bindCacheValueCodec(m);
  bindLoader(m);
  bindCacheBackend(m);
  bindCacheBackendFactory(m);
  bindCacheLoader(m);
}

}  // namespace bagua::py
