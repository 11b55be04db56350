// The sparse max-pooling op's GPU functor, over SparseMaxPoolGpu (max_pool.cu), and the GPU
// registration of its OpKernel (max_pool_kernels.h).
#if GOOGLE_CUDA

#include <vector>

#include "channel/channel_sparse_gpu.h"
#include "channel/max_pool/max_pool_gpu.h"
#include "channel/max_pool/max_pool_kernels.h"

namespace tf_sparseconv {

template <typename T>
class SparseMaxPoolFunctor<GPUDevice, T> : GpuFunctorBase {
 public:
  SparseMaxPoolFunctor(tensorflow::OpKernelContext* ctx, const PoolFlags& flags)
      : GpuFunctorBase(ctx, "SparseMaxPool"), flags_(flags) {}

  // The data checks run on the device, in the pass that orders the entries by window.
  absl::Status Count(const KeyLayout& in, const KeyLayout& out, const std::vector<int32_t>& strides,
                     const int64_t* keys, const T* values, int64_t n, int64_t* count) {
    TF_RETURN_IF_ERROR(CheckSortable(n, "SparseMaxPool", "entries"));
    gpu::PoolGeometry g;
    g.in = in;
    g.out = out;
    for (int j = 0; j < in.d; ++j) g.strides[j] = strides[j];
    gpu::PoolOptions options;
    options.check = !flags_.inputs_checked;
    options.padded_input = flags_.padded_input;
    // Checked inputs into a padded output: nothing to read back, so no wait.
    options.read_back = options.check || !flags_.padded_output;
    gpu::Report report;
    TF_RETURN_IF_ERROR(ToStatus(pool_.Count(stream_, &scratch_, g, keys, values, n, options, &report)));
    if (!options.read_back) return absl::OkStatus();
    TF_RETURN_IF_ERROR(EntryReportStatus(report, gpu::kPoolKeys, gpu::kPoolNaN, in.num_keys(), "max_pool input",
                                         "max_pool input values"));
    *count = report.count;
    return absl::OkStatus();
  }

  absl::Status Write(int64_t* out_keys, T* out_values, int64_t* argmax, int64_t capacity) {
    return ToStatus(
        pool_.Write(stream_, &scratch_, out_keys, out_values, argmax, flags_.padded_output ? capacity : 0));
  }

 private:
  const PoolFlags flags_;
  gpu::SparseMaxPoolGpu<T> pool_;
};

#define REGISTER_GPU(T)                                         \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>SparseMaxPool")    \
                              .Device(::tensorflow::DEVICE_GPU) \
                              .TypeConstraint<T>("T")           \
                              .HostMemory("dense_shape")        \
                              .HostMemory("out_dense_shape"),   \
                          SparseMaxPoolOp<GPUDevice, T>);
REGISTER_GPU(float);
REGISTER_GPU(double);
#undef REGISTER_GPU

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA
