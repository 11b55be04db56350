// The channel-sparse tensor on the device, shared by the family's CUDA sources: its data
// checks queued into a new Report, and the compaction pieces that select entries of sorted
// keys (common/gpu_util.cuh's CountCompaction / WriteCompaction).
#ifndef TF_SPARSECONV_CHANNEL_CHANNEL_SPARSE_CUH_
#define TF_SPARSECONV_CHANNEL_CHANNEL_SPARSE_CUH_

#include <cstdint>

#include "common/gpu_util.cuh"

namespace tf_sparseconv {
namespace gpu {

// A new Report in device memory with the checks of one input's entries queued: keys
// sorted, unique and below limit (CheckSortedKeys) into checks[keys_check], values free of
// NaN (CheckNaN) into checks[nan_check]; padded_tail: the keys may end in padding.
template <typename T>
GpuStatus NewEntryReport(Stream stream, Scratch* scratch, const int64_t* keys, const T* values, int64_t n,
                         int64_t limit, int keys_check, int nan_check, Report** report, bool padded_tail = false) {
  TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, report));
  TF_SPARSECONV_RETURN_IF_ERROR(
      CheckSortedKeys(stream, keys, n, limit, &(*report)->checks[keys_check], padded_tail));
  return CheckNaN(stream, values, n, &(*report)->checks[nan_check]);
}

// Selects the first position of each run of equal sorted keys, positions holding `none`
// (nothing there) left out: one output entry per run.
struct IsRunStart {
  const uint64_t* keys;
  uint64_t none;
  __device__ bool operator()(int64_t q) const { return keys[q] != none && (q == 0 || keys[q] != keys[q - 1]); }
};

// Emits the selected entries' keys and values in order and, where positions is given, the
// position each came from.
template <typename T>
struct CopyEntries {
  const int64_t* keys;
  const T* values;
  int64_t* out_keys;
  T* out_values;
  int64_t* positions;  // nullptr: not wanted
  __device__ void operator()(int64_t q, int64_t rank) const {
    out_keys[rank] = keys[q];
    out_values[rank] = values[q];
    if (positions != nullptr) positions[rank] = q;
  }
};

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_CHANNEL_SPARSE_CUH_
