// Keeps C++ exceptions inside an OpKernel's Compute: a host allocation that fails (a
// std::vector sized by the data) becomes ResourceExhausted instead of terminating the
// process. The sizes computed from the inputs are checked before this is reached; this
// covers what no check can rule out, a machine short of memory.
#ifndef TF_SPARSECONV_COMMON_GUARDED_COMPUTE_H_
#define TF_SPARSECONV_COMMON_GUARDED_COMPUTE_H_

#include <new>
#include <stdexcept>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/errors.h"

namespace tf_sparseconv {

// Runs body() (which may use OP_REQUIRES, returning from the lambda); `op` names the op in
// the error.
template <typename Body>
void GuardedCompute(tensorflow::OpKernelContext* ctx, const char* op, Body&& body) {
  try {
    body();
  } catch (const std::bad_alloc&) {
    ctx->CtxFailure(tensorflow::errors::ResourceExhausted(op, ": out of host memory for its working tables"));
  } catch (const std::length_error&) {
    ctx->CtxFailure(tensorflow::errors::ResourceExhausted(op, ": a working table would exceed the largest size"));
  }
}

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_COMMON_GUARDED_COMPUTE_H_
