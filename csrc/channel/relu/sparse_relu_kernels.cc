// The sparse ReLU's CPU functor and the CPU registration of its OpKernel
// (sparse_relu_kernels.h).
#include "channel/relu/sparse_relu_kernels.h"

namespace tf_sparseconv {

template <typename T>
class SparseReluFunctor<CPUDevice, T> {
 public:
  explicit SparseReluFunctor(tensorflow::OpKernelContext*) {}

  absl::Status Count(const KeyLayout& layout, const int64_t* keys, const T* values, int64_t n,
                     bool /*padded: the op hands over the live prefix*/, bool /*no_wait: checks cost no wait*/,
                     int64_t* count) {
    TF_RETURN_IF_ERROR(ValidateKeys(keys, n, layout, "relu input"));
    TF_RETURN_IF_ERROR(RejectNaN(values, n, "relu input values"));
    keys_ = keys;
    values_ = values;
    n_ = n;
    *count = 0;
    for (int64_t i = 0; i < n; ++i) *count += values[i] > T(0);
    return absl::OkStatus();
  }

  absl::Status Write(int64_t* out_keys, T* out_values, int64_t* kept, int64_t capacity) {
    int64_t j = 0;
    for (int64_t i = 0; i < n_; ++i) {
      if (!(values_[i] > T(0))) continue;
      out_keys[j] = keys_[i];
      out_values[j] = values_[i];
      kept[j++] = i;
    }
    for (; j < capacity; ++j) {  // padding; kept its own position (< the input's length)
      out_keys[j] = kPaddingKey;
      out_values[j] = T(0);
      kept[j] = j;
    }
    return absl::OkStatus();
  }

 private:
  const int64_t* keys_ = nullptr;
  const T* values_ = nullptr;
  int64_t n_ = 0;
};

#define REGISTER_CPU(T)                                                                        \
  REGISTER_KERNEL_BUILDER(                                                                     \
      Name("TfSparseconv>SparseRelu").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      SparseReluOp<CPUDevice, T>);
REGISTER_CPU(float);
REGISTER_CPU(double);
#undef REGISTER_CPU

}  // namespace tf_sparseconv
