// The GPU functors of SiteSparseConv and SiteSparseConvFilterGrad (CUDA-free interface;
// kernels in site_conv.cu). Same contract as site_conv.h, with the map
// checked on the device: SiteConvArgs::offset_splits is the host copy, every other
// pointer is device memory.
#ifndef TF_SPARSECONV_SITE_CONV_SITE_CONV_GPU_H_
#define TF_SPARSECONV_SITE_CONV_SITE_CONV_GPU_H_

#include <cstdint>

#include "common/gpu_common.h"
#include "site/conv/site_conv.h"

namespace tf_sparseconv {
namespace gpu {

// Half-precision storage as the kernels see it: the bit layouts of Eigen::half (IEEE
// binary16, CUDA's __half) and Eigen::bfloat16 (CUDA's __nv_bfloat16). Arithmetic is in
// float32 (AccumulatorOf).
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// The part of the map whose splits the host found rising: offsets [0, offsets) hold
// pairs [0, pairs). The device checks the rows of those pairs only, as the CPU checks
// the pairs of every offset before the first bad split.
struct CheckedMap {
  int64_t offsets = 0;
  int64_t pairs = 0;
};

// Report slots. kSiteRows: the first pair p with in_rows[p] or out_rows[p] out of range,
// detail = {in_rows[p], out_rows[p]}. kSiteRepeat: some pair repeats an output row within
// its offset (which one is left to FirstRepeatedOutputRow). kSiteNaN: the first NaN
// entry of the features (forward only).
enum SiteConvCheck { kSiteRows = 0, kSiteRepeat = 1, kSiteNaN = 2 };

// Forward: out [num_out, cout] = sum over offsets of features[in_rows] @ filters[q]
// scattered onto out_rows. The products are computed only when every check passed and
// checked.offsets == volume. deterministic: offsets are accumulated one launch after
// the other without atomics (TensorFlow's op determinism); otherwise in one launch with
// atomic adds. Blocks until the report is on the host, except for a trusted map
// (map_is_trusted: valid by construction, checked.offsets == volume): no row checks, no
// NaN scan, report untouched, and it returns once the work is queued.
// half (sm_70+) and bfloat16 (sm_80+) multiply on tensor cores; so does float through
// TF32 where allow_tf32 (TensorFlow's tensor_float_32_execution_enabled()) on sm_80+,
// when cin and cout are multiples of 4 (float) or 8 (16-bit types); float without TF32
// on sm_80+ with such rows runs a pipelined CUDA-core kernel (site_conv_simt.cuh).
// Temporary memory: num_out * volume / 8 bytes (the repeat check), 16 * (volume + 1),
// and num_out * cout * 4 for half and bfloat16 (the float32 accumulator).
// The forward's dataflow on sm_80+ where the tensor-core kernels apply and volume <= 32:
// tiles of pairs scatter-added with atomics (kPairs), or tiles of output rows, each stored
// once (kOutputs, site_conv_outputs.cuh). Elsewhere kOutputs falls back to kPairs.
// kAuto, the default, picks by measurement (H200, lidar frame, README): kOutputs for half
// and bfloat16 under op determinism (about 1.3x faster end to end than the per-offset
// deterministic launches) or when `neighbours` is given, kPairs otherwise (faster
// without determinism when the table is built per call, and for TF32).
// neighbours: nullptr, or SiteNeighbourTable's table of this map with mask_groups groups
// ([num_out, volume + 2 * mask_groups], device memory), which kOutputs then reads instead
// of building one with kDefaultMaskGroups (4 * num_out * (volume + 2 * groups + 4) bytes of
// temporaries and about a third of the call for 32-64 channels).
enum class SiteDataflow { kAuto, kPairs, kOutputs };

// The products of kOutputs' tiles: mma.sync with ldmatrix fragments, as the pair tiles
// (the default: site_conv_outputs.cuh, MmaSyncGatherGemmStoreKernel; H200 2026-11-24, fp16
// forward from a table, 24 layers of 4 scenes: as fast or faster in 22, up to 10%), or WMMA
// (GatherGemmStoreKernel). TF_SPARSECONV_SITE_TABLE_PRODUCTS=mma_sync|wmma.
enum class SiteTableProducts { kMmaSync, kWmma };

// How many bytes of each input row one pipeline step of the half / bfloat16 tensor-core
// tiles (pairs and mma.sync table tiles) brings in: kAuto (128 for inputs of at least 128
// channels in whole 64-channel steps, the table tiles only where outputs average two
// pairs or more; else 64; site_conv.cu, WideRowSteps), or forced. Float (TF32) steps 64.
// TF_SPARSECONV_SITE_ROW_STEP=auto|64|128.
enum class SiteRowStep { kAuto, kBytes64, kBytes128 };

// The output rows of one output-stationary tile (mma.sync products): kAuto (128), or
// forced to 64 or 128. 64-row tiles multiply fewer rows without a pair (the rows of a
// tile share more of their offsets) at the price of loading each filter slice for half as
// many rows; on an H200 that was the slower trade for most layers (README).
// TF_SPARSECONV_SITE_TABLE_ROWS=auto|64|128.
enum class SiteTableRows { kAuto, kRows64, kRows128 };

template <typename T>
GpuStatus SiteConvForwardGpu(Stream stream, Scratch* scratch, const SiteConvArgs<T>& args,
                             const CheckedMap& checked, bool deterministic, bool allow_tf32,
                             SiteDataflow dataflow, SiteTableProducts products, SiteRowStep row_step,
                             SiteTableRows table_rows, bool trusted, const int32_t* neighbours,
                             int64_t mask_groups, T* out, Report* report);

// SiteNeighbourTable: neighbours [num_out, volume + 2 * mask_groups] (volume <= 32,
// mask_groups from MaskGroupsFor) of the map's first checked.pairs pairs, in the layout of
// site_conv_outputs.cuh. Checks the rows as the
// forward does (Report slots kSiteRows and kSiteRepeat) and blocks for the report,
// except for a trusted map. Temporary memory: 16 * (volume + 1) + 16 * num_out bytes and
// the radix sort's scratch.
GpuStatus SiteNeighbourTableGpu(Stream stream, Scratch* scratch, const int32_t* in_rows, const int32_t* out_rows,
                                const int32_t* host_splits, const CheckedMap& checked, int64_t volume,
                                int64_t mask_groups, int64_t num_in, int64_t num_out, bool trusted,
                                int32_t* neighbours, Report* report);

// filter_grad [volume, cin, cout]; deterministic (fixed chunks of pairs, partial sums
// added in chunk order). Blocks until the report is on the host, except for a trusted
// map (as for the forward: no row checks, report untouched, returns once queued).
// Temporary memory: num_out * volume / 8 bytes, 16 * (volume + 1), and the partial sums:
// about min(pairs / 512, 2048 / tiles + volume) * cin * cout * sizeof(accumulator),
// tiles = ceil(cin / 64) * ceil(cout / 64) (float on sm_80+ with rows of whole 16-byte
// vectors: tiles of 128 channels on a side above 64 channels, site_conv_filter_grad.cuh).
template <typename T>
GpuStatus SiteConvFilterGradGpu(Stream stream, Scratch* scratch, const SiteConvArgs<T>& args,
                                const CheckedMap& checked, bool allow_tf32, bool trusted,
                                const T* out_grad, T* filter_grad, Report* report);

// The error path of kSiteRepeat: the first pair p (in pair order, among the checked
// pairs with out_rows in range) whose output row an earlier pair of its offset already
// has. result->first = p (kNoError if none), detail[0] = out_rows[p]. One more round
// trip. Temporary memory: 24 bytes per checked pair + CUB's sort scratch.
GpuStatus FirstRepeatedOutputRow(Stream stream, Scratch* scratch, const int32_t* out_rows,
                                 const int32_t* host_splits, const CheckedMap& checked,
                                 int64_t num_out, CheckSlot* result);

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_CONV_GPU_H_
