// The sparse ReLU's GPU functor, over SparseReluGpu (sparse_relu.cu), and the GPU
// registration of its OpKernel (sparse_relu_kernels.h).
#if GOOGLE_CUDA

#include "channel/channel_sparse_gpu.h"
#include "channel/relu/sparse_relu_gpu.h"
#include "channel/relu/sparse_relu_kernels.h"

namespace tf_sparseconv {

template <typename T>
class SparseReluFunctor<GPUDevice, T> : GpuFunctorBase {
 public:
  explicit SparseReluFunctor(tensorflow::OpKernelContext* ctx) : GpuFunctorBase(ctx, "SparseRelu") {}

  // The data checks run on the device, in the pass that counts the kept entries.
  absl::Status Count(const KeyLayout& layout, const int64_t* keys, const T* values, int64_t n, bool padded,
                     bool no_wait, int64_t* count) {
    if (no_wait) {
      *count = kReluCountOnDevice;
      return ToStatus(relu_.Count(stream_, &scratch_, layout, keys, values, n, padded, nullptr));
    }
    gpu::Report report;
    TF_RETURN_IF_ERROR(ToStatus(relu_.Count(stream_, &scratch_, layout, keys, values, n, padded, &report)));
    TF_RETURN_IF_ERROR(
        EntryReportStatus(report, gpu::kReluKeys, gpu::kReluNaN, layout.num_keys(), "relu input", "relu input values"));
    *count = report.count;
    return absl::OkStatus();
  }

  absl::Status Write(int64_t* out_keys, T* out_values, int64_t* kept, int64_t capacity) {
    return ToStatus(relu_.Write(stream_, &scratch_, out_keys, out_values, kept, capacity));
  }

 private:
  gpu::SparseReluGpu<T> relu_;
};

#define REGISTER_GPU(T)                                         \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>SparseRelu")       \
                              .Device(::tensorflow::DEVICE_GPU) \
                              .TypeConstraint<T>("T")           \
                              .HostMemory("dense_shape"),       \
                          SparseReluOp<GPUDevice, T>);
REGISTER_GPU(float);
REGISTER_GPU(double);
#undef REGISTER_GPU

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA
