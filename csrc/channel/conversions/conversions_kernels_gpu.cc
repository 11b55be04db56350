// The GPU functors of the conversion and validation ops, over conversions.cu, and the GPU
// registration of their OpKernels (conversions_kernels.h). Each functor's data checks run
// on the device with its work and come back in its Report; its temporaries live as long as
// the functor (GpuFunctorBase).
#if GOOGLE_CUDA

#include "channel/channel_sparse_gpu.h"
#include "channel/conversions/conversions_gpu.h"
#include "channel/conversions/conversions_kernels.h"

namespace tf_sparseconv {

using ::tensorflow::OpKernelContext;

template <typename T>
struct ValidateFunctor<GPUDevice, T> : GpuFunctorBase {
  explicit ValidateFunctor(OpKernelContext* ctx) : GpuFunctorBase(ctx, "ChannelSparseValidate") {}
  absl::Status operator()(const KeyLayout& L, const int64_t* keys, const T* values, int64_t n, bool padded) {
    gpu::Report report;
    TF_RETURN_IF_ERROR(ToStatus(gpu::ValidateGpu<T>(stream_, &scratch_, L, keys, values, n, padded, &report)));
    return EntryReportStatus(report, gpu::kValidateKeys, gpu::kValidateNaN, L.num_keys(), "channel-sparse", "values");
  }
};

template <>
struct EncodeKeysFunctor<GPUDevice> : GpuFunctorBase {
  explicit EncodeKeysFunctor(OpKernelContext* ctx) : GpuFunctorBase(ctx, "ChannelSparseEncodeKeys") {}
  absl::Status operator()(const KeyLayout& L, const int64_t* indices, int64_t n, int64_t* keys) {
    gpu::Report report;
    TF_RETURN_IF_ERROR(ToStatus(gpu::EncodeKeysGpu(stream_, &scratch_, L, indices, n, keys, &report)));
    const gpu::CheckSlot& slot = report.checks[gpu::kEncodeIndices];
    if (!gpu::Failed(slot)) return absl::OkStatus();
    // The slot holds the flat position i * rank + j of the first index out of range.
    const int rank = L.d + 2;
    const int64_t i = static_cast<int64_t>(slot.first) / rank;
    const int j = static_cast<int>(static_cast<int64_t>(slot.first) % rank);
    return IndexOutOfRangeError(i, j, slot.detail[0], IndexColumnBound(L, j));
  }
};

template <>
struct DecodeKeysFunctor<GPUDevice> : GpuFunctorBase {
  explicit DecodeKeysFunctor(OpKernelContext* ctx) : GpuFunctorBase(ctx, "ChannelSparseDecodeKeys") {}
  absl::Status operator()(const KeyLayout& L, const int64_t* keys, int64_t n, int64_t* indices) {
    gpu::Report report;
    TF_RETURN_IF_ERROR(ToStatus(gpu::DecodeKeysGpu(stream_, &scratch_, L, keys, n, indices, &report)));
    return KeysInLayoutStatus(report.checks[gpu::kDecodeKeys], L.num_keys());
  }
};

template <typename T>
struct ReorderFunctor<GPUDevice, T> : GpuFunctorBase {
  static absl::Status CheckLimits(int64_t n) { return CheckSortable(n, "ChannelSparseReorder", "keys"); }

  explicit ReorderFunctor(OpKernelContext* ctx) : GpuFunctorBase(ctx, "ChannelSparseReorder") {}
  absl::Status operator()(const KeyLayout& L, const int64_t* keys, const T* values, int64_t n, int64_t* sorted_keys,
                          T* sorted_values, int64_t* permutation) {
    gpu::Report report;
    TF_RETURN_IF_ERROR(ToStatus(gpu::ReorderGpu<T>(stream_, &scratch_, L, keys, values, n, sorted_keys,
                                                   sorted_values, permutation, &report)));
    TF_RETURN_IF_ERROR(KeysInLayoutStatus(report.checks[gpu::kReorderRange], L.num_keys()));
    const gpu::CheckSlot& duplicate = report.checks[gpu::kReorderDuplicates];
    if (gpu::Failed(duplicate)) {
      return DuplicateKeyError(duplicate.detail[0], duplicate.detail[1], duplicate.detail[2]);
    }
    return absl::OkStatus();
  }
};

template <typename T>
struct ToDenseFunctor<GPUDevice, T> : GpuFunctorBase {
  explicit ToDenseFunctor(OpKernelContext* ctx) : GpuFunctorBase(ctx, "ChannelSparseToDense") {}
  absl::Status operator()(const KeyLayout& L, const int64_t* keys, const T* values, int64_t n, T* dense,
                          bool inputs_checked, bool padded) {
    if (inputs_checked) {  // no report: queued without the check, not waited for
      return ToStatus(gpu::ToDenseGpu<T>(stream_, &scratch_, L, keys, values, n, padded, dense, nullptr));
    }
    gpu::Report report;
    TF_RETURN_IF_ERROR(ToStatus(gpu::ToDenseGpu<T>(stream_, &scratch_, L, keys, values, n, padded, dense, &report)));
    return SortedKeysStatus(report.checks[gpu::kDenseKeys], L.num_keys(), "to_dense");
  }
};

template <typename T>
struct GatherDenseFunctor<GPUDevice, T> : GpuFunctorBase {
  explicit GatherDenseFunctor(OpKernelContext* ctx) : GpuFunctorBase(ctx, "ChannelSparseGatherDense") {}
  absl::Status operator()(const KeyLayout& L, const int64_t* keys, int64_t n, const T* dense, T* values,
                          bool inputs_checked, bool padded) {
    if (inputs_checked) {  // no report: queued without the check, not waited for
      return ToStatus(gpu::GatherDenseGpu<T>(stream_, &scratch_, L, keys, n, padded, dense, values, nullptr));
    }
    gpu::Report report;
    TF_RETURN_IF_ERROR(ToStatus(gpu::GatherDenseGpu<T>(stream_, &scratch_, L, keys, n, padded, dense, values, &report)));
    return SortedKeysStatus(report.checks[gpu::kDenseKeys], L.num_keys(), "gather_dense");
  }
};

template <typename T>
class DenseToChannelSparseFunctor<GPUDevice, T> : GpuFunctorBase {
 public:
  explicit DenseToChannelSparseFunctor(OpKernelContext* ctx) : GpuFunctorBase(ctx, "DenseToChannelSparse") {}

  absl::Status Count(const KeyLayout& L, const T* dense, int64_t* count) {
    gpu::Report report;
    TF_RETURN_IF_ERROR(ToStatus(convert_.Count(stream_, &scratch_, L, dense, &report)));
    *count = report.count;
    return absl::OkStatus();
  }

  absl::Status Write(int64_t* keys, T* values) { return ToStatus(convert_.Write(stream_, keys, values)); }

 private:
  gpu::DenseToChannelSparseGpu<T> convert_;
};

#define REGISTER_GPU(T)                                                                                      \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>ChannelSparseValidate")                                         \
                              .Device(::tensorflow::DEVICE_GPU)                                              \
                              .TypeConstraint<T>("T")                                                        \
                              .HostMemory("dense_shape"),                                                    \
                          ChannelSparseValidateOp<GPUDevice, T>);                                            \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>ChannelSparseReorder")                                          \
                              .Device(::tensorflow::DEVICE_GPU)                                              \
                              .TypeConstraint<T>("T")                                                        \
                              .HostMemory("dense_shape"),                                                    \
                          ChannelSparseReorderOp<GPUDevice, T>);                                             \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>ChannelSparseToDense")                                          \
                              .Device(::tensorflow::DEVICE_GPU)                                              \
                              .TypeConstraint<T>("T")                                                        \
                              .HostMemory("dense_shape"),                                                    \
                          ChannelSparseToDenseOp<GPUDevice, T>);                                             \
  REGISTER_KERNEL_BUILDER(                                                                                   \
      Name("TfSparseconv>ChannelSparseGatherDense").Device(::tensorflow::DEVICE_GPU).TypeConstraint<T>("T"), \
      ChannelSparseGatherDenseOp<GPUDevice, T>);                                                             \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>DenseToChannelSparse")                                          \
                              .Device(::tensorflow::DEVICE_GPU)                                              \
                              .TypeConstraint<T>("T")                                                        \
                              .HostMemory("dense_shape"),                                                    \
                          DenseToChannelSparseOp<GPUDevice, T>);
REGISTER_GPU(float);
REGISTER_GPU(double);
#undef REGISTER_GPU

REGISTER_KERNEL_BUILDER(Name("TfSparseconv>ChannelSparseEncodeKeys")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("dense_shape"),
                        ChannelSparseEncodeKeysOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("TfSparseconv>ChannelSparseDecodeKeys")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("dense_shape"),
                        ChannelSparseDecodeKeysOp<GPUDevice>);

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA
