// The GPU functors of the conversion and validation ops (CUDA-free interface; kernels in
// conversions.cu). Each fills a Report whose checks the OpKernel turns into the CPU
// kernel's message, and blocks until it is on the host.
#ifndef TF_SPARSECONV_CHANNEL_CONVERSIONS_CONVERSIONS_GPU_H_
#define TF_SPARSECONV_CHANNEL_CONVERSIONS_CONVERSIONS_GPU_H_

#include <cstdint>

#include "common/gpu_common.h"

namespace tf_sparseconv {
namespace gpu {

// ChannelSparseValidate, ChannelSparseToDense and ChannelSparseGatherDense: padded, the keys
// may end in padding (kPaddingKey), which the checks accept and the kernels skip.
enum ValidateCheck { kValidateKeys = 0, kValidateNaN = 1 };
template <typename T>
GpuStatus ValidateGpu(Stream stream, Scratch* scratch, const KeyLayout& layout,
                      const int64_t* keys, const T* values, int64_t n, bool padded, Report* report);

// ChannelSparseEncodeKeys: kEncodeIndices records the first flat position i * rank + j of
// an index outside its dimension, detail = {the index}.
enum EncodeCheck { kEncodeIndices = 0 };
GpuStatus EncodeKeysGpu(Stream stream, Scratch* scratch, const KeyLayout& layout,
                        const int64_t* indices, int64_t n, int64_t* keys, Report* report);

// ChannelSparseDecodeKeys: kDecodeKeys records the first key out of range.
enum DecodeCheck { kDecodeKeys = 0 };
GpuStatus DecodeKeysGpu(Stream stream, Scratch* scratch, const KeyLayout& layout,
                        const int64_t* keys, int64_t n, int64_t* indices, Report* report);

// ChannelSparseReorder: kReorderRange records the first key out of range;
// kReorderDuplicates the first sorted position i whose key equals that of i - 1,
// detail = {key, permutation[i - 1], permutation[i]}. n <= kMaxSortItems.
// Temporary memory: 24 bytes per entry + CUB's sort scratch.
enum ReorderCheck { kReorderRange = 0, kReorderDuplicates = 1 };
template <typename T>
GpuStatus ReorderGpu(Stream stream, Scratch* scratch, const KeyLayout& layout,
                     const int64_t* keys, const T* values, int64_t n, int64_t* sorted_keys,
                     T* sorted_values, int64_t* permutation, Report* report);

// ChannelSparseToDense and ChannelSparseGatherDense: kDenseKeys records the first key
// that is out of range or not above its predecessor.
enum DenseCheck { kDenseKeys = 0 };
template <typename T>
GpuStatus ToDenseGpu(Stream stream, Scratch* scratch, const KeyLayout& layout,
                     const int64_t* keys, const T* values, int64_t n, bool padded, T* dense,
                     Report* report);
template <typename T>
GpuStatus GatherDenseGpu(Stream stream, Scratch* scratch, const KeyLayout& layout,
                         const int64_t* keys, int64_t n, bool padded, const T* dense, T* values,
                         Report* report);  // report nullptr: keys checked already, no check, no wait

// DenseToChannelSparse: visits the dense tensor in key order (b, c, spatial), so the
// kept entries come out sorted without a sort. Temporary memory: 16 bytes per 2048
// dense elements.
template <typename T>
class DenseToChannelSparseGpu {
 public:
  // report->count = non-zero elements.
  GpuStatus Count(Stream stream, Scratch* scratch, const KeyLayout& layout, const T* dense,
                  Report* report);
  GpuStatus Write(Stream stream, int64_t* keys, T* values) const;

 private:
  KeyLayout layout_;
  const T* dense_ = nullptr;
  Compaction compaction_;
};

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_CONVERSIONS_CONVERSIONS_GPU_H_
