// SparseMaxPool on the GPU (Hackel et al. §3.3): every entry gets its pooled key, a
// stable radix sort groups the entries of each window (ties keep key order), and each
// run of equal pooled keys becomes one output entry, its maximum the first largest
// value, i.e. ties go to the smaller key, like the CPU kernel.
// Temporary memory: 24 bytes per entry (pooled keys and entry indices, double-buffered)
// + 16 bytes per 2048 entries + CUB's sort scratch.
#include "channel/channel_sparse.cuh"
#include "channel/max_pool/max_pool_gpu.h"

namespace tf_sparseconv {
namespace gpu {
namespace {

__global__ void PooledKeysKernel(PoolGeometry g, const int64_t* keys, int64_t n,
                                 const Report* report, uint64_t* pooled, int32_t* order) {
  ChainedKernelBegin();
  const bool valid = ChecksPassed(report);
  const uint64_t no_window = static_cast<uint64_t>(g.out.num_keys());
  TF_SPARSECONV_GRID_LOOP(i, n) {
    order[i] = static_cast<int32_t>(i);
    if (!valid || keys[i] == kPaddingKey) {  // padding: in no window
      pooled[i] = no_window;
      continue;
    }
    const int64_t seg = g.in.segment_of(keys[i]);
    const int64_t lin = keys[i] - seg * g.in.spatial_size;
    int64_t pooled_lin = 0;
    for (int j = 0; j < g.in.d; ++j) {
      const int64_t x = (lin / g.in.stride[j]) % g.in.extent[j];
      pooled_lin += (x / g.strides[j]) * g.out.stride[j];
    }
    pooled[i] = static_cast<uint64_t>(seg * g.out.spatial_size + pooled_lin);
  }
}

template <typename T>
struct WriteWindowMax {
  const uint64_t* pooled;
  const int32_t* order;
  const T* values;
  int64_t n;
  int64_t* out_keys;
  T* out_values;
  int64_t* argmax;
  __device__ void operator()(int64_t j, int64_t rank) const {
    int64_t best = order[j];
    for (int64_t q = j + 1; q < n && pooled[q] == pooled[j]; ++q) {
      if (values[order[q]] > values[best]) best = order[q];  // strict: ties keep key order
    }
    out_keys[rank] = static_cast<int64_t>(pooled[j]);
    out_values[rank] = values[best];
    argmax[rank] = best;
  }
};

// Padding after the live entries (their count on the device) up to capacity: key kPaddingKey,
// value 0, argmax its own position.
template <typename T>
__global__ void PadOutputKernel(const int64_t* live, int64_t capacity, int64_t* out_keys, T* out_values,
                                int64_t* argmax) {
  ChainedKernelBegin();
  const int64_t first = *live;
  TF_SPARSECONV_GRID_LOOP(j, capacity) {
    if (j < first) continue;
    out_keys[j] = kPaddingKey;
    out_values[j] = T(0);
    argmax[j] = j;  // a distinct input position each (j < capacity <= n): the gradient's scatter adds
                    // padding's zeros without every one of them contending for one address
  }
}

}  // namespace

template <typename T>
GpuStatus SparseMaxPoolGpu<T>::Count(Stream stream, Scratch* scratch, const PoolGeometry& g,
                                     const int64_t* keys, const T* values, int64_t n,
                                     const PoolOptions& options, Report* report) {
  values_ = values;
  n_ = n;
  no_window_ = static_cast<uint64_t>(g.out.num_keys());
  Report* device_report = nullptr;
  if (options.check) {
    TF_SPARSECONV_RETURN_IF_ERROR(NewEntryReport(stream, scratch, keys, values, n, g.in.num_keys(), kPoolKeys,
                                                 kPoolNaN, &device_report, options.padded_input));
  } else {
    TF_SPARSECONV_RETURN_IF_ERROR(NewReport(stream, scratch, &device_report));
  }
  device_count_ = &device_report->count;
  if (n > 0) {
    uint64_t* pooled[2] = {scratch->DeviceArray<uint64_t>(n), scratch->DeviceArray<uint64_t>(n)};
    int32_t* order[2] = {scratch->DeviceArray<int32_t>(n), scratch->DeviceArray<int32_t>(n)};
    if (!pooled[0] || !pooled[1] || !order[0] || !order[1]) {
      return GpuStatus::OutOfMemory("max-pool keys");
    }
    LaunchChained(PooledKeysKernel, BlocksFor(n), kThreads, 0, stream, g, keys, n, device_report, pooled[0], order[0]);
    TF_SPARSECONV_RETURN_IF_CUDA_ERROR("max-pool keys");
    int current = 0;
    TF_SPARSECONV_RETURN_IF_ERROR(SortPairs(stream, scratch, pooled, order, n,
                                            BitsFor(no_window_), &current));
    pooled_ = pooled[current];
    order_ = order[current];
  }
  // Without a read-back nothing needs the count before Write: Write counts and writes in one
  // pass (Compact).
  one_pass_ = !options.read_back;
  if (one_pass_) return GpuStatus::Ok();
  TF_SPARSECONV_RETURN_IF_ERROR(CountCompaction(stream, scratch,
                                                IsRunStart{pooled_, no_window_}, n,
                                                &device_report->count, &compaction_));
  return ReadReport(stream, scratch, device_report, report);
}

template <typename T>
GpuStatus SparseMaxPoolGpu<T>::Write(Stream stream, Scratch* scratch, int64_t* out_keys, T* out_values,
                                     int64_t* argmax, int64_t capacity) const {
  const IsRunStart run_start{pooled_, no_window_};
  const WriteWindowMax<T> write{pooled_, order_, values_, n_, out_keys, out_values, argmax};
  if (one_pass_) {
    TF_SPARSECONV_RETURN_IF_ERROR(Compact(stream, scratch, run_start, write, n_, device_count_));
  } else {
    TF_SPARSECONV_RETURN_IF_ERROR(WriteCompaction(stream, compaction_, run_start, write));
  }
  if (capacity == 0) return GpuStatus::Ok();
  LaunchChained(PadOutputKernel<T>, BlocksFor(capacity), kThreads, 0, stream, device_count_, capacity, out_keys,
                out_values, argmax);
  TF_SPARSECONV_RETURN_IF_CUDA_ERROR("max-pool padding");
  return GpuStatus::Ok();
}

template class SparseMaxPoolGpu<float>;
template class SparseMaxPoolGpu<double>;

}  // namespace gpu
}  // namespace tf_sparseconv
