// The CPU functors of the conversion and validation ops and the CPU registration of their
// OpKernels (conversions_kernels.h).
#include <algorithm>
#include <numeric>
#include <vector>

#include "channel/conversions/conversions_kernels.h"

namespace tf_sparseconv {

using ::tensorflow::OpKernelContext;

template <typename T>
struct ValidateFunctor<CPUDevice, T> {
  explicit ValidateFunctor(OpKernelContext*) {}
  // padded: unused; the op hands over the live prefix, the whole input checked (EntriesToRead)
  absl::Status operator()(const KeyLayout& L, const int64_t* keys, const T* values, int64_t n, bool /*padded*/) {
    TF_RETURN_IF_ERROR(ValidateKeys(keys, n, L, "channel-sparse"));
    return RejectNaN(values, n, "values");
  }
};

template <>
struct EncodeKeysFunctor<CPUDevice> {
  explicit EncodeKeysFunctor(OpKernelContext*) {}
  absl::Status operator()(const KeyLayout& L, const int64_t* idx, int64_t n, int64_t* k) {
    const int64_t rank = L.d + 2;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t* row = idx + i * rank;
      int64_t lin = 0;
      for (int j = 0; j < rank; ++j) {
        const int64_t bound = IndexColumnBound(L, j);
        if (!(row[j] >= 0 && row[j] < bound)) return IndexOutOfRangeError(i, j, row[j], bound);
        if (j >= 1 && j < rank - 1) lin += row[j] * L.stride[j - 1];
      }
      k[i] = L.key_of(row[0], row[rank - 1], lin);
    }
    return absl::OkStatus();
  }
};

template <>
struct DecodeKeysFunctor<CPUDevice> {
  explicit DecodeKeysFunctor(OpKernelContext*) {}
  absl::Status operator()(const KeyLayout& L, const int64_t* k, int64_t n, int64_t* out) {
    TF_RETURN_IF_ERROR(CheckKeysInLayout(k, n, L));
    const int64_t rank = L.d + 2;
    std::vector<int32_t> x(L.d);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t seg = L.segment_of(k[i]);
      DecodeSpatial(L.spatial_of(k[i]), L, x.data());
      int64_t* row = out + i * rank;
      row[0] = seg / L.channels;
      for (int j = 0; j < L.d; ++j) row[1 + j] = x[j];
      row[rank - 1] = seg % L.channels;
    }
    return absl::OkStatus();
  }
};

template <typename T>
struct ReorderFunctor<CPUDevice, T> {
  static absl::Status CheckLimits(int64_t) { return absl::OkStatus(); }

  explicit ReorderFunctor(OpKernelContext*) {}
  absl::Status operator()(const KeyLayout& L, const int64_t* k, const T* v, int64_t n, int64_t* sk, T* sv,
                          int64_t* p) {
    TF_RETURN_IF_ERROR(CheckKeysInLayout(k, n, L));
    std::iota(p, p + n, int64_t{0});
    std::stable_sort(p, p + n, [&](int64_t a, int64_t b) { return k[a] < k[b]; });
    for (int64_t i = 0; i < n; ++i) {
      sk[i] = k[p[i]];
      sv[i] = v[p[i]];
      if (i > 0 && sk[i] == sk[i - 1]) return DuplicateKeyError(sk[i], p[i - 1], p[i]);
    }
    return absl::OkStatus();
  }
};

template <typename T>
struct ToDenseFunctor<CPUDevice, T> {
  explicit ToDenseFunctor(OpKernelContext*) {}
  absl::Status operator()(const KeyLayout& L, const int64_t* k, const T* v, int64_t n, T* out,
                          bool /*inputs_checked: the CPU checks in any case*/, bool /*padded: live prefix*/) {
    TF_RETURN_IF_ERROR(ValidateKeys(k, n, L, "to_dense"));
    std::fill(out, out + L.num_keys(), T(0));
    for (int64_t i = 0; i < n; ++i) out[DenseIndex(k[i], L)] = v[i];
    return absl::OkStatus();
  }
};

template <typename T>
struct GatherDenseFunctor<CPUDevice, T> {
  explicit GatherDenseFunctor(OpKernelContext*) {}
  // inputs_checked: unused; the CPU checks in any case (its check costs no wait)
  absl::Status operator()(const KeyLayout& L, const int64_t* k, int64_t n, const T* dense, T* out,
                          bool /*inputs_checked*/, bool /*padded: live prefix*/) {
    TF_RETURN_IF_ERROR(ValidateKeys(k, n, L, "gather_dense"));
    for (int64_t i = 0; i < n; ++i) out[i] = dense[DenseIndex(k[i], L)];
    return absl::OkStatus();
  }
};

template <typename T>
class DenseToChannelSparseFunctor<CPUDevice, T> {
 public:
  explicit DenseToChannelSparseFunctor(OpKernelContext*) {}

  // Pass 1 counts the non-zeros of every (b, c) segment; pass 2 walks the dense tensor in
  // memory order, which visits each segment in increasing spatial order.
  absl::Status Count(const KeyLayout& L, const T* x, int64_t* count) {
    L_ = L;
    x_ = x;
    const int64_t C = L.channels, S = L.spatial_size;
    offset_.assign(L.num_segments() + 1, 0);
    for (int64_t b = 0; b < L.batch; ++b)
      for (int64_t lin = 0; lin < S; ++lin)
        for (int64_t c = 0; c < C; ++c)
          if (x[(b * S + lin) * C + c] != T(0)) ++offset_[b * C + c + 1];
    for (int64_t s = 0; s < L.num_segments(); ++s) offset_[s + 1] += offset_[s];
    *count = offset_[L.num_segments()];
    return absl::OkStatus();
  }

  absl::Status Write(int64_t* k, T* v) {
    const KeyLayout& L = L_;
    const int64_t C = L.channels, S = L.spatial_size;
    for (int64_t b = 0; b < L.batch; ++b)
      for (int64_t lin = 0; lin < S; ++lin)
        for (int64_t c = 0; c < C; ++c) {
          const T value = x_[(b * S + lin) * C + c];
          if (value == T(0)) continue;
          const int64_t at = offset_[b * C + c]++;
          k[at] = L.key_of(b, c, lin);
          v[at] = value;
        }
    return absl::OkStatus();
  }

 private:
  KeyLayout L_;
  const T* x_ = nullptr;
  std::vector<int64_t> offset_;
};

#define REGISTER_CPU(T)                                                                 \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>ChannelSparseValidate")                    \
                              .Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
                          ChannelSparseValidateOp<CPUDevice, T>);                       \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>ChannelSparseReorder")                     \
                              .Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
                          ChannelSparseReorderOp<CPUDevice, T>);                        \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>ChannelSparseToDense")                     \
                              .Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
                          ChannelSparseToDenseOp<CPUDevice, T>);                        \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>ChannelSparseGatherDense")                 \
                              .Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
                          ChannelSparseGatherDenseOp<CPUDevice, T>);                    \
  REGISTER_KERNEL_BUILDER(Name("TfSparseconv>DenseToChannelSparse")                     \
                              .Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
                          DenseToChannelSparseOp<CPUDevice, T>);
REGISTER_CPU(float);
REGISTER_CPU(double);
#undef REGISTER_CPU

REGISTER_KERNEL_BUILDER(Name("TfSparseconv>ChannelSparseEncodeKeys").Device(::tensorflow::DEVICE_CPU),
                        ChannelSparseEncodeKeysOp<CPUDevice>);
REGISTER_KERNEL_BUILDER(Name("TfSparseconv>ChannelSparseDecodeKeys").Device(::tensorflow::DEVICE_CPU),
                        ChannelSparseDecodeKeysOp<CPUDevice>);

}  // namespace tf_sparseconv
