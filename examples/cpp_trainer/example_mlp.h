// A small multi-layer perceptron with hand-written forward and backward, a real model: this
// example's, and also the demo job's (bagua-train-demo) and the tests', which the tree builds from
// here as a private library (example_mlp_dep; not part of the SDK). Linear+ReLU layers, a linear
// output, softmax cross-entropy averaged over the batch. Optional "aux" head (an extra linear
// output added to the logits only when asked) gives a parameter that can go unused in an iteration.
// A running-mean buffer of the inputs ("input_norm.running_mean") is a buffer to broadcast.
//
// Parameters are named "fc{i}.weight" / "fc{i}.bias" (weights row-major [out][in]), then
// "aux.weight" / "aux.bias".
//
// Thread safety: none; one trainer thread per model.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <bagua/core/parameter.h>

namespace bagua::example {

struct MlpConfig {
  std::vector<int> sizes{16, 64, 64, 4};  // input, hidden..., classes
  bool auxHead = false;
  uint64_t seed = 1;  // weight initialisation
};

class Mlp {
 public:
  explicit Mlp(const MlpConfig& config);
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  std::vector<core::Parameter>& parameters() { return params_; }
  std::vector<core::Parameter>& buffers() { return buffers_; }

  // Mean cross-entropy over the batch; x is [batch][in], labels in [0, classes).
  float forward(const float* x, const int32_t* labels, int batch, bool useAux = false);
  // Backward of the last forward: adds into the gradients (through parameters()[i].grad) and
  // calls ready(i) once parameter i's gradient is final, last layer first.
  void backward(const std::function<void(int)>& ready);
  void zeroGrad();
  // Correct predictions in the last forward.
  int correct() const { return correct_; }
  size_t numParams() const;

 private:
  struct Layer {
    int in = 0;
    int out = 0;
    int weight = 0;  // index in params_
    int bias = 0;
  };
  float* data(int p) { return static_cast<float*>(params_[p].data); }
  float* grad(int p) { return static_cast<float*>(params_[p].grad); }

  MlpConfig config_;
  std::vector<Layer> layers_;
  Layer aux_;
  std::vector<std::vector<float>> storage_;  // weights and initial gradient storage
  std::vector<core::Parameter> params_;
  std::vector<core::Parameter> buffers_;
  std::vector<float> runningMean_;

  // Saved activations of the last forward.
  int batch_ = 0;
  bool usedAux_ = false;
  std::vector<std::vector<float>> acts_;  // acts_[0] = input, acts_[i+1] = output of layer i
  std::vector<float> probs_;
  std::vector<int32_t> labels_;
  int correct_ = 0;
};

}  // namespace bagua::example
