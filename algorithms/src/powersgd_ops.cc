#include "powersgd_ops.h"

#include <algorithm>
#include <cmath>

#include "cuda_kernels.h"

namespace bagua::algo::detail::psgd {

using algo::psgd::kColBlock;
using algo::psgd::kElemTile;
using algo::psgd::kReduceTile;
using algo::psgd::kRowChunk;
using algo::psgd::kRowsPerTile;

namespace {

// The kernels' entry points return cudaError_t values as int (cuda_kernels.h).
Status onDevice(CudaKernels& k, int err, const char* what) {
  if (err == 0) {
    return Status::ok();
  }
  return k.status(err, strPrintf("powersgd: %s", what), __FILE__, __LINE__);
}
// Runs `call` (an expression over `k`, the CUDA half) on x's device.
#define BAGUA_PSGD_DEVICE(x, what, call)                                               \
  do {                                                                                 \
    BAGUA_ASSIGN_OR_RETURN(CudaKernels* kp, cudaKernels());                            \
    CudaKernels& k = *kp;                                                              \
    BAGUA_RETURN_IF_ERROR(onDevice(k, k.setDevice((x).deviceIndex), "cudaSetDevice")); \
    return onDevice(k, (call), (what));                                                \
  } while (0)

template <class T>
const T* dev(const Buffer& b) {
  return reinterpret_cast<const T*>(const_cast<Buffer&>(b).u8());
}

int count(const std::vector<Tile>& tiles) {
  return static_cast<int>(tiles.size());
}

// Column k of a rows x r row-major factor.
inline float& at(float* x, int64_t i, int r, int k) {
  return x[i * r + k];
}

void addElementTiles(std::vector<Tile>& out, int32_t item, int64_t n, int64_t per = kElemTile) {
  for (int64_t b = 0; b < n; b += per) {
    out.push_back({item, 0, b, std::min(n, b + per)});
  }
}

}  // namespace

Status Layout::upload(const Exec& exec) {
  rowTiles.clear();
  qTiles.clear();
  qReduceTiles.clear();
  qElemTiles.clear();
  pElemTiles.clear();
  elemTiles.clear();
  segTiles.clear();
  partElems = 0;
  if (!exec.device) {
    size_t most = 0;
    for (const Matrix& m : matrices) {
      most = std::max(most, static_cast<size_t>(m.cols) * static_cast<size_t>(m.rank));
    }
    hostAcc.reserve(most);
    return Status::ok();
  }
  for (size_t d = 0; d < matrices.size(); ++d) {
    Matrix& m = matrices[d];
    const auto item = static_cast<int32_t>(d);
    for (int64_t i = 0; i < m.rows; i += kRowsPerTile) {
      rowTiles.push_back({item, 0, i, std::min<int64_t>(m.rows, i + kRowsPerTile)});
    }
    m.partOffset = static_cast<int64_t>(partElems);
    const int64_t chunks = (m.rows + kRowChunk - 1) / kRowChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      for (int64_t j = 0; j < m.cols; j += kColBlock) {
        qTiles.push_back({item, 0, c * kRowChunk, j});
      }
    }
    partElems += static_cast<size_t>(chunks * m.cols * m.rank);
    addElementTiles(qReduceTiles, item, static_cast<int64_t>(m.cols) * m.rank, kReduceTile);
    addElementTiles(qElemTiles, item, static_cast<int64_t>(m.cols) * m.rank);
    addElementTiles(pElemTiles, item, static_cast<int64_t>(m.rows) * m.rank);
    addElementTiles(elemTiles, item, static_cast<int64_t>(m.rows) * m.cols);
  }
  for (size_t s = 0; s < segments.size(); ++s) {
    addElementTiles(segTiles, static_cast<int32_t>(s), segments[s].len);
  }
  auto put = [&](Buffer& b, const void* src, size_t bytes) -> Status {
    BAGUA_RETURN_IF_ERROR(b.ensure(exec, std::max<size_t>(bytes, 16)));
    return copyFromHost(exec, b.u8(), src, bytes);
  };
  BAGUA_RETURN_IF_ERROR(put(dMatrices, matrices.data(), matrices.size() * sizeof(Matrix)));
  BAGUA_RETURN_IF_ERROR(put(dSegments, segments.data(), segments.size() * sizeof(Segment)));
  BAGUA_RETURN_IF_ERROR(put(dRowTiles, rowTiles.data(), rowTiles.size() * sizeof(Tile)));
  BAGUA_RETURN_IF_ERROR(put(dQTiles, qTiles.data(), qTiles.size() * sizeof(Tile)));
  BAGUA_RETURN_IF_ERROR(
      put(dQReduceTiles, qReduceTiles.data(), qReduceTiles.size() * sizeof(Tile)));
  BAGUA_RETURN_IF_ERROR(put(dQElemTiles, qElemTiles.data(), qElemTiles.size() * sizeof(Tile)));
  BAGUA_RETURN_IF_ERROR(put(dPElemTiles, pElemTiles.data(), pElemTiles.size() * sizeof(Tile)));
  BAGUA_RETURN_IF_ERROR(put(dElemTiles, elemTiles.data(), elemTiles.size() * sizeof(Tile)));
  return put(dSegTiles, segTiles.data(), segTiles.size() * sizeof(Tile));
}

Status project(const Exec& x, const Layout& l, float* flat, float* err, const float* q, float* p) {
  if (!x.device) {
    for (const Matrix& m : l.matrices) {
      const int r = m.rank;
      const float* qm = q + m.qOffset;
      for (int64_t i = 0; i < m.rows; ++i) {
        float* row = flat + m.offset + i * m.cols;
        if (err != nullptr) {
          const float* e = err + m.errOffset + i * m.cols;
          for (int64_t j = 0; j < m.cols; ++j) {
            row[j] = row[j] + e[j];
          }
        }
        for (int k = 0; k < r; ++k) {
          double acc = 0.0;
          for (int64_t j = 0; j < m.cols; ++j) {
            acc += static_cast<double>(row[j]) * qm[j * r + k];
          }
          p[m.pOffset + i * r + k] = static_cast<float>(acc);
        }
      }
    }
    return Status::ok();
  }
  BAGUA_PSGD_DEVICE(x, "P = M Q",
                    k.psgdProject(flat, err, q, p, dev<Matrix>(l.dMatrices), dev<Tile>(l.dRowTiles),
                                  count(l.rowTiles)));
}

Status orthogonalize(const Exec& x, const Layout& l, float* buf, Factor which, float eps,
                     bool redraw, uint64_t seed, uint64_t generation) {
  if (!x.device) {
    for (const Matrix& m : l.matrices) {
      const int r = m.rank;
      const int64_t dim = which == Factor::kP ? m.rows : m.cols;
      float* v = buf + (which == Factor::kP ? m.pOffset : m.qOffset);
      auto dot = [&](int a, int b) {
        double s = 0.0;
        for (int64_t i = 0; i < dim; ++i) {
          s += static_cast<double>(at(v, i, r, a)) * at(v, i, r, b);
        }
        return s;
      };
      for (int k = 0; k < r; ++k) {
        double nrm2 = dot(k, k);
        if (redraw && nrm2 == 0.0) {
          for (int64_t i = 0; i < dim; ++i) {
            at(v, i, r, k) =
                algo::psgd::uniformDraw(seed, m.key, generation, static_cast<uint64_t>(i * r + k));
          }
          for (int c = 0; c < k; ++c) {
            const auto d = static_cast<float>(dot(c, k));
            for (int64_t i = 0; i < dim; ++i) {
              at(v, i, r, k) -= d * at(v, i, r, c);
            }
          }
          nrm2 = dot(k, k);
        }
        const auto nrm = static_cast<float>(std::sqrt(nrm2));
        if (nrm > 0.0f || eps > 0.0f) {
          const float den = nrm + eps;
          for (int64_t i = 0; i < dim; ++i) {
            at(v, i, r, k) = at(v, i, r, k) / den;
          }
        }
        for (int c = k + 1; c < r; ++c) {
          const auto d = static_cast<float>(dot(k, c));
          for (int64_t i = 0; i < dim; ++i) {
            at(v, i, r, c) -= d * at(v, i, r, k);
          }
        }
      }
    }
    return Status::ok();
  }
  BAGUA_PSGD_DEVICE(
      x, "orthogonalisation",
      k.psgdOrthogonalize(buf, dev<Matrix>(l.dMatrices), static_cast<int>(l.matrices.size()),
                          which == Factor::kP ? 0 : 1, eps, redraw, seed, generation));
}

Status backProject(const Exec& x, const Layout& l, const float* flat, const float* p,
                   [[maybe_unused]] float* partials, float* q) {
  if (!x.device) {
    std::vector<double>& acc = l.hostAcc;
    for (const Matrix& m : l.matrices) {
      const int r = m.rank;
      const size_t n = static_cast<size_t>(m.cols) * r;
      acc.assign(n, 0.0);  // sized once (upload): no allocation here
      for (int64_t i = 0; i < m.rows; ++i) {
        const float* row = flat + m.offset + i * m.cols;
        const float* pi = p + m.pOffset + i * r;
        for (int64_t j = 0; j < m.cols; ++j) {
          const double v = row[j];
          for (int k = 0; k < r; ++k) {
            acc[j * r + k] += v * pi[k];
          }
        }
      }
      for (size_t e = 0; e < n; ++e) {
        q[m.qOffset + e] = static_cast<float>(acc[e]);
      }
    }
    return Status::ok();
  }
  BAGUA_PSGD_DEVICE(
      x, "Q = M^T P",
      k.psgdBackProject(flat, p, partials, q, dev<Matrix>(l.dMatrices), dev<Tile>(l.dQTiles),
                        count(l.qTiles), dev<Tile>(l.dQReduceTiles), count(l.qReduceTiles)));
}

Status reconstruct(const Exec& x, const Layout& l, float* flat, float* err, const float* p,
                   const float* q) {
  if (!x.device) {
    for (const Matrix& m : l.matrices) {
      const int r = m.rank;
      for (int64_t i = 0; i < m.rows; ++i) {
        const float* pi = p + m.pOffset + i * r;
        float* row = flat + m.offset + i * m.cols;
        float* e = err != nullptr ? err + m.errOffset + i * m.cols : nullptr;
        for (int64_t j = 0; j < m.cols; ++j) {
          const float* qj = q + m.qOffset + j * r;
          double a = 0.0;
          for (int k = 0; k < r; ++k) {
            a += static_cast<double>(pi[k]) * qj[k];
          }
          const auto af = static_cast<float>(a);
          if (e != nullptr) {
            e[j] = row[j] - af;
          }
          row[j] = af;
        }
      }
    }
    return Status::ok();
  }
  BAGUA_PSGD_DEVICE(x, "P Q^T",
                    k.psgdReconstruct(flat, err, p, q, dev<Matrix>(l.dMatrices),
                                      dev<Tile>(l.dElemTiles), count(l.elemTiles)));
}

Status fillRandom(const Exec& x, const Layout& l, float* q, uint64_t seed, uint64_t generation) {
  if (!x.device) {
    for (const Matrix& m : l.matrices) {
      const int64_t n = static_cast<int64_t>(m.cols) * m.rank;
      for (int64_t e = 0; e < n; ++e) {
        q[m.qOffset + e] =
            algo::psgd::uniformDraw(seed, m.key, generation, static_cast<uint64_t>(e));
      }
    }
    return Status::ok();
  }
  BAGUA_PSGD_DEVICE(x, "random Q",
                    k.psgdFillRandom(q, dev<Matrix>(l.dMatrices), dev<Tile>(l.dQElemTiles),
                                     count(l.qElemTiles), seed, generation));
}

Status segments(const Exec& x, const Layout& l, float* flat, float* pack, bool toPack,
                float divisor) {
  if (!x.device) {
    for (const Segment& s : l.segments) {
      for (int64_t e = 0; e < s.len; ++e) {
        if (toPack) {
          pack[s.dst + e] = flat[s.src + e];
        } else {
          flat[s.src + e] = pack[s.dst + e] / divisor;
        }
      }
    }
    return Status::ok();
  }
  BAGUA_PSGD_DEVICE(x, "uncompressed segments",
                    k.psgdSegments(flat, pack, dev<Segment>(l.dSegments), dev<Tile>(l.dSegTiles),
                                   count(l.segTiles), toPack, divisor));
}

Status columnNorms(const Exec& x, const Layout& l, const float* q, float* norms) {
  if (!x.device) {
    for (const Matrix& m : l.matrices) {
      const int r = m.rank;
      for (int k = 0; k < r; ++k) {
        double s = 0.0;
        for (int64_t j = 0; j < m.cols; ++j) {
          const double v = q[m.qOffset + j * r + k];
          s += v * v;
        }
        norms[m.normOffset + k] = static_cast<float>(std::sqrt(s));
      }
    }
    return Status::ok();
  }
  BAGUA_PSGD_DEVICE(
      x, "column norms",
      k.psgdColumnNorms(q, norms, dev<Matrix>(l.dMatrices), static_cast<int>(l.matrices.size())));
}

Status scaleColumns(const Exec& x, const Layout& l, float* buf, const float* norms, Factor which,
                    bool divide) {
  const bool isP = which == Factor::kP;
  if (!x.device) {
    for (const Matrix& m : l.matrices) {
      const int r = m.rank;
      const auto dim = static_cast<float>(isP ? m.rows : m.cols);
      float* v = buf + (isP ? m.pOffset : m.qOffset);
      const int64_t n = static_cast<int64_t>(isP ? m.rows : m.cols) * r;
      for (int64_t e = 0; e < n; ++e) {
        const float nrm = norms[m.normOffset + static_cast<int>(e % r)];
        const float s = nrm > 0.0f && std::isfinite(nrm) ? std::sqrt(dim) / nrm : 1.0f;
        v[e] = divide ? v[e] / s : v[e] * s;
      }
    }
    return Status::ok();
  }
  [[maybe_unused]] const std::vector<Tile>& tiles = isP ? l.pElemTiles : l.qElemTiles;
  BAGUA_PSGD_DEVICE(x, "column scaling",
                    k.psgdScaleColumns(buf, norms, dev<Matrix>(l.dMatrices),
                                       dev<Tile>(isP ? l.dPElemTiles : l.dQElemTiles), count(tiles),
                                       isP ? 0 : 1, divide));
}

Status streamBefore(const Exec& x, core::Communicator& c) {
  if (!x.device) {
    return Status::ok();
  }
  BAGUA_ASSIGN_OR_RETURN(CudaKernels * k, cudaKernels());
  BAGUA_RETURN_IF_ERROR(onDevice(*k, k->setDevice(x.deviceIndex), "cudaSetDevice"));
  void* ev = nullptr;
  BAGUA_RETURN_IF_ERROR(onDevice(*k, k->eventRecord(&ev, k->perThreadStream()), "cudaEventRecord"));
  // The communicator's stream waits for the event's capture; the event itself can go.
  Status s = c.afterEvent(static_cast<CUevent_st*>(ev));
  k->eventDestroy(ev);
  return s;
}

Status streamAfter(const Exec& x, core::Communicator& c) {
  if (!x.device) {
    return Status::ok();
  }
  BAGUA_ASSIGN_OR_RETURN(CudaKernels * k, cudaKernels());
  BAGUA_RETURN_IF_ERROR(onDevice(*k, k->setDevice(x.deviceIndex), "cudaSetDevice"));
  return c.orderStream(static_cast<CUstream_st*>(k->perThreadStream()));
}

}  // namespace bagua::algo::detail::psgd
