// PowerSGD's per-bucket arithmetic on host or device memory (one body for both, as vec_ops.h):
// a bucket's layout (its compressed matrices, its uncompressed segments, the tiles the device
// kernels split them into) and the batched steps over it. Host loops accumulate in double; the
// device kernels (cuda/powersgd_kernels.cu) in float, so the two agree to float rounding (not
// bit for bit). Device steps only enqueue on the calling thread's per-thread stream (sync() in
// vec_ops.h waits for them). Private to algorithms/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/communicator.h"
#include "cuda/powersgd_kernels.h"
#include "vec_ops.h"

namespace bagua::algo::detail::psgd {

using algo::psgd::Matrix;
using algo::psgd::Segment;
using algo::psgd::Tile;

// Which factor a step works on.
enum class Factor { kP = 0, kQ = 1 };

// A bucket's layout: built once on the host (build()), mirrored on the device (upload()).
struct Layout {
  std::vector<Matrix> matrices;
  std::vector<Segment> segments;
  size_t errElems = 0;   // sum of rows * cols over the matrices
  size_t pElems = 0;     // sum of rows * rank
  size_t qElems = 0;     // sum of cols * rank
  size_t partElems = 0;  // device partial sums of M^T P
  size_t normElems = 0;  // sum of rank
  size_t uncompressedElems = 0;

  // Device mirrors (empty on the host).
  std::vector<Tile> rowTiles, qTiles, qReduceTiles, qElemTiles, pElemTiles, elemTiles, segTiles;
  Buffer dMatrices, dSegments, dRowTiles, dQTiles, dQReduceTiles, dQElemTiles, dPElemTiles,
      dElemTiles, dSegTiles;
  // The host's double accumulators of M^T P (capacity reserved by upload()).
  mutable std::vector<double> hostAcc;

  // Builds the tile lists and copies everything to the device when `exec` is one; on the host,
  // reserves hostAcc.
  [[nodiscard]] Status upload(const Exec& exec);
};

// M (+= error when err != nullptr), then P = M Q.
[[nodiscard]] Status project(const Exec& x, const Layout& l, float* flat, float* err,
                             const float* q, float* p);
// Gram-Schmidt on every matrix's factor (columns of `buf`), see powersgd_kernels.h.
[[nodiscard]] Status orthogonalize(const Exec& x, const Layout& l, float* buf, Factor which,
                                   float eps, bool redraw, uint64_t seed, uint64_t generation);
// Q = M^T P; `partials` holds l.partElems floats on the device (unused on the host).
[[nodiscard]] Status backProject(const Exec& x, const Layout& l, const float* flat, const float* p,
                                 float* partials, float* q);
// flat = P Q^T on every matrix; err = M - P Q^T first when err != nullptr.
[[nodiscard]] Status reconstruct(const Exec& x, const Layout& l, float* flat, float* err,
                                 const float* p, const float* q);
// Q = uniform draws in [-1, 1) keyed by (seed, matrix key, generation, index).
[[nodiscard]] Status fillRandom(const Exec& x, const Layout& l, float* q, uint64_t seed,
                                uint64_t generation);
// The uncompressed segments into the pack ([P | the segments]; Segment::dst counts from its
// start) (toPack) or back from it, divided by `divisor`.
[[nodiscard]] Status segments(const Exec& x, const Layout& l, float* flat, float* pack, bool toPack,
                              float divisor);
// Column norms of every matrix's Q.
[[nodiscard]] Status columnNorms(const Exec& x, const Layout& l, const float* q, float* norms);
// Scales (or unscales) every factor column by sqrt(dim) / norm (1 where the norm is 0 or not
// finite).
[[nodiscard]] Status scaleColumns(const Exec& x, const Layout& l, float* buf, const float* norms,
                                  Factor which, bool divide);

// Device ordering without host waits, for a communicator with a device stream (NCCL):
// streamBefore() makes the collective issued next on `c` wait, on the device, for the work this
// thread enqueued so far; streamAfter() makes this thread's later work wait for every collective
// issued on `c` so far. FailedPrecondition from a communicator without a stream (the caller then
// waits on the host: sync() before, Work::wait() after). No-ops on the host.
[[nodiscard]] Status streamBefore(const Exec& x, core::Communicator& c);
[[nodiscard]] Status streamAfter(const Exec& x, core::Communicator& c);

}  // namespace bagua::algo::detail::psgd
