// PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019): gradients of two or more dimensions are
// sent as rank-r factors P (rows x r) and Q (cols x r) found by one step of power iteration per
// training step, with error feedback and a warm-started Q; vectors and matrices not worth
// compressing are all-reduced in full precision. Optional 8-bit quantisation of P and Q with
// ByteGrad's MinMaxUInt8 codec. Host tensors (host backend) and CUDA tensors (NCCL).
//
// Per bucket and step, once compression has started (step >= startIter):
//   M = gradient + error                        (errorFeedback; else M = gradient)
//   Q orthogonalised (warm start: last step's averaged Q; else, and the first time, random)
//   P = M Q;  all-reduce SUM of [P | the uncompressed tensors] (one collective)
//   orthogonalise P's columns (Gram-Schmidt);  Q = M^T P;  all-reduce AVG of Q
//   gradient = P Q^T (the same on every rank);  error = M - P Q^T (kept on this rank)
// A matrix is the first dimension by the product of the others (core::Parameter::shape), at
// rank r' = min(rank, rows, cols), compressed when rows * cols > minCompressionRate * (rows +
// cols) * r'. Elements sent per step: sum over compressed matrices of (rows + cols) * r', plus
// the uncompressed elements; see algorithms/README.md for when that pays.
//
// Thread model: as every algorithm (core/algorithm.h): runBucket on the reducer's bucket thread,
// the other hooks on the trainer's. snapshot() may be called from the trainer's thread between
// iterations.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/algorithm.h"

namespace bagua::algo {

struct PowerSgdOptions {
  // Rank of the approximation. 1 sends the fewest bytes; raise it (2, 4, 8: a power of two at a
  // time) when the loss falls behind full all-reduce. Must be >= 1 and at most min(rows, cols)
  // of at least one matrix of the model.
  int rank = 1;
  // Steps (that communicate) of plain all-reduce before compression starts. 10: past the first
  // steps, whose large and fast-changing gradients are the ones a low-rank approximation fits
  // worst, at a negligible cost in a run of thousands of steps. Raise it (towards 10% of the
  // training steps, torch's advice for its hook) when the final accuracy falls short.
  int64_t startIter = 10;
  // A matrix is compressed only when it shrinks by more than this factor:
  // rows * cols > minCompressionRate * (rows + cols) * rank. Smaller matrices are all-reduced
  // with the vectors. 2 (torch's default) skips matrices whose saving would not pay for the
  // extra arithmetic and the second collective. Must be >= 0 (0: every matrix).
  double minCompressionRate = 2.0;
  // Keep M - P Q^T and add it to the next step's gradient (the paper's error feedback). Keep it
  // on: without it PowerSGD is biased and the loss stalls above all-reduce's.
  bool errorFeedback = true;
  // Start each step's power iteration from the last step's Q (one iteration per step then
  // tracks the top singular vectors). Keep it on; off draws a fresh random Q every step.
  bool warmStart = true;
  // Added to each column's norm before dividing by it in the Gram-Schmidt orthogonalisation.
  // 0 (torch's default) divides by the norm itself; a column whose norm is 0 is left at 0 (P) or
  // redrawn at random (Q). A positive value (1e-8) damps columns of tiny norm.
  float orthogonalizationEpsilon = 0.0f;
  // Seed of the random Q (the same on every rank). Any value; change it only to vary runs.
  uint64_t seed = 0;
  // Send P and Q quantised to 8 bits (ByteGrad's MinMaxUInt8, through ByteGrad's scatter-reduce
  // / all-gather, columns prescaled to a common magnitude): a quarter of the factor bytes, at
  // the cost of a second collective per factor. Error feedback absorbs the quantisation error.
  // Worth it when the factors dominate the bytes (rank >= 4 on slow links).
  bool quantizeFactors = false;
};

// Checks every option on its own (the rank against the model is checked when the reducer is
// created): InvalidArgument naming the setting.
[[nodiscard]] Status validatePowerSgdOptions(const PowerSgdOptions& options);

// Builds the options from Algorithm.init-style string arguments (rank, start_iter,
// min_compression_rate, error_feedback, warm_start, orthogonalization_epsilon, seed,
// quantize_factors; hierarchical=false is accepted and true refused, for front ends that pass
// it to every algorithm), strictly: an unknown key or a bad value is InvalidArgument naming it.
Result<PowerSgdOptions> parsePowerSgdArgs(const std::map<std::string, std::string>& args);

// The random start of Q, the same on every rank and on host and device: element `index` (of the
// cols x rank row-major Q) of the matrix of parameter `key` (its index in the reducer's
// parameter list), drawn at compressed step `generation` (the communicating step's number; a
// column of norm 0 is redrawn the same way at the step it vanishes), uniform in [-1, 1) from a
// SplitMix64 hash of the four arguments.
float powerSgdDraw(uint64_t seed, uint32_t key, uint64_t generation, uint64_t index);

class PowerSgdImpl;

class PowerSgd final : public core::Algorithm {
 public:
  explicit PowerSgd(const PowerSgdOptions& options = {}) : options_(options) {}
  std::string name() const override { return "powersgd"; }
  Result<std::unique_ptr<core::AlgorithmImpl>> reify(core::ProcessGroup& group) override;
  const PowerSgdOptions& options() const { return options_; }

  // The live implementation's state, for tests and debugging (host copies; call between
  // iterations). FailedPrecondition before the reducer was created.
  struct TensorState {
    size_t rows = 0;
    size_t cols = 0;
    int rank = 0;              // r' of this matrix; 0: not compressed
    std::vector<float> error;  // rows x cols (empty without error feedback)
    std::vector<float> q;      // cols x r', row-major: the averaged Q of the last step
  };
  struct Snapshot {
    int64_t steps = 0;  // communicating steps completed
    bool compressing = false;
    size_t compressedMatrices = 0;
    size_t elementsPerStep = 0;  // elements all-reduced per compressed step (P, Q and the rest)
    size_t uncompressedElements = 0;             // elements a plain all-reduce sends per step
    std::map<std::string, TensorState> tensors;  // compressed tensors by name
  };
  Result<Snapshot> snapshot();

 private:
  friend class PowerSgdImpl;
  PowerSgdOptions options_;
  std::mutex mu_;
  PowerSgdImpl* live_ = nullptr;
};

}  // namespace bagua::algo
