// Device-wide primitives from CUB, instantiated once in primitives.cu for the types
// the ops use (CUB's device algorithms are what makes nvcc slow; one translation unit
// compiles them for every architecture in parallel with the rest).
#ifndef TF_SPARSECONV_COMMON_PRIMITIVES_H_
#define TF_SPARSECONV_COMMON_PRIMITIVES_H_

#include <cstdint>

#include "common/gpu_common.h"

namespace tf_sparseconv {
namespace gpu {

// Stable LSD radix sort of num_items (key, value) pairs by the key bits [0, end_bit), in
// CUB's double-buffer mode: keys[0], keys[1] (values[0], values[1]) are two buffers of
// num_items each, the input in buffer 0; on return *current (0 or 1) names the buffer
// with the sorted pairs, the other holds no data. Equal keys keep their input order.
// num_items <= kMaxSortItems. Temporary memory: CUB's scratch (digit histograms and
// look-back state), small next to the buffers: tens of MB for the largest sorts.
template <typename K, typename V>
GpuStatus SortPairs(Stream stream, Scratch* scratch, K* keys[2], V* values[2],
                    int64_t num_items, int end_bit, int* current);

// out[i] = in[0] + ... + in[i - 1] for i < n; integers, so the result is exact.
GpuStatus ExclusiveSum(Stream stream, Scratch* scratch, const int64_t* in, int64_t* out,
                       int64_t n);

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_COMMON_PRIMITIVES_H_
