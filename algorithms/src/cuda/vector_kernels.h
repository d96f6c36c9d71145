// Plain-C++ entry points of the algorithms' element-wise CUDA kernels and the runtime calls the
// host code needs (compiled by nvcc, called from vec_ops.cc). Everything runs on the calling
// thread's per-thread default stream. Return a cudaError_t value (0: success). Private.
#pragma once

#include <cstddef>

namespace bagua::algo::cudakernels {

int setDevice(int device);
int deviceAlloc(void** out, size_t bytes);
void deviceFree(void* p);
int copy(void* dst, const void* src, size_t bytes);
int zero(void* dst, size_t bytes);
// Synchronous device-to-host copy (after this thread's stream work).
int copyToHost(void* hostDst, const void* src, size_t bytes);
// Synchronous host-to-device copy (after this thread's stream work).
int copyFromHost(void* dst, const void* hostSrc, size_t bytes);
// 0: the stream's work is done, 1: still running, else the error.
int queryStream();
void* perThreadStream();
// Records an event on `stream` (a cudaStream_t, nullptr: the legacy default stream) of the
// current device; eventQuery: 0 done, 1 not yet, else the error. eventDestroy frees it.
int eventRecord(void** event, void* stream);
int eventQuery(void* event);
void eventDestroy(void* event);

int reduceChunks(const float* chunks, size_t n, size_t c, bool average, float* out);
int averagePair(float* a, const float* b, size_t n);
int lowPrecisionDiff(float* d, const float* x, const float* l, const float* r, const float* w,
                     size_t n);
int addInPlace(float* a, const float* b, size_t n);
int addAndCopy(float* w, const float* d, float* x, size_t n);
int divideInPlace(float* a, float divisor, size_t n);
// QAdam (vec_ops.h qadamStep / momentumMix). hold: elements with v == 0 keep x (only passed
// true outside warm-up).
int qadamStep(float* x, const float* grad, float* m, float* v, size_t n, bool warm,
              float weightDecay, float b1, float b2, float ob1, float ob2, float stepSize,
              float bc2Sqrt, float eps, bool hold);
int momentumMix(float* slot, const float* m, float b1, float ob1, size_t n);
// Async model average (vec_ops.h addMeanMinusSnapshot).
int addMeanMinusSnapshot(float* w, const float* sum, const float* snap, float n, size_t count);

}  // namespace bagua::algo::cudakernels
