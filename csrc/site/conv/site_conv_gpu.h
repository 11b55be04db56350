// The GPU functors of SiteSparseConv and SiteSparseConvFilterGrad (CUDA-free interface;
// kernels in site_conv.cu). Same contract as site_conv.h, with the map
// checked on the device: SiteConvArgs::offset_splits is the host copy, every other
// pointer is device memory.
#ifndef TF_SPARSECONV_SITE_CONV_SITE_CONV_GPU_H_
#define TF_SPARSECONV_SITE_CONV_SITE_CONV_GPU_H_

#include <cstdint>
#include <string>

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

// The choices of one forward call. deterministic: TensorFlow's op determinism; allow_tf32:
// float may multiply in TF32 (TensorFlow's tensor_float_32_execution_enabled()); dataflow:
// the op's dataflow attr; trusted: map_is_trusted (valid by construction, checked.offsets
// == volume).
struct SiteConvOptions {
  bool deterministic = false;
  bool allow_tf32 = false;
  SiteDataflow dataflow = SiteDataflow::kAuto;
  bool trusted = false;
  // map_is_table: the pairs are absent (their count unknown); the table is the map.
  bool map_is_table = false;
};

// Forward: out [num_out, cout] = sum over offsets of features[in_rows] @ filters[q]
// scattered onto out_rows. The products are computed only when every check passed and
// checked.offsets == volume. Blocks until the report is on the host, except for a trusted
// map: no row checks, no NaN scan, report untouched, and it returns once the work is queued.
// half (sm_70+) and bfloat16 (sm_80+) multiply on tensor cores; so does float through
// TF32 where allow_tf32 on sm_80+, when cin and cout are multiples of 4 (float) or 8
// (16-bit types); float without TF32 on sm_80+ with such rows runs a pipelined CUDA-core
// kernel (site_conv_simt.cuh).
// The dataflow on sm_80+ where the tensor-core kernels apply and volume <= 32: tiles of
// pairs scatter-added with atomics, or under determinism one launch per offset without
// them (kPairs), or tiles of output rows, each stored once (kOutputs,
// site_conv_outputs.cuh). Elsewhere the op refuses kOutputs before the call
// (OutputStationaryUnavailable); with no input channels it runs kPairs. kAuto: kOutputs for half and
// bfloat16 under determinism or given `neighbours`, kPairs otherwise (the measurements
// behind the rule: docs/gpu-kernels.md).
// neighbours: nullptr, or SiteNeighbourTable's table of this map ([num_out, volume + 2],
// device memory), which kOutputs then reads instead of building one in the call.
// Temporary memory: the repeat check's num_out * volume / 8 bytes where that is at most
// 8 * pairs + 16 KiB, else 24 bytes per pair and a radix sort's scratch; 16 * (volume + 1),
// num_out * cout * 4 for half and bfloat16 on the pairs (the float32 accumulator),
// 4 * num_out * (volume + 7) bytes for a table built in the call, and 8 * cout for an
// epilogue on the output-stationary tiles (its affine map per column).
// Why the output-stationary tiles (kOutputs) cannot run this forward on the current
// device, for an error message, or "" where they can: they need the pipelined tensor-core
// kernels (sm_80+, half, bfloat16 or float with allow_tf32, rows of whole 16-byte
// vectors) and volume <= 32. Host-side: reads no device memory.
template <typename T>
std::string OutputStationaryUnavailable(const SiteConvArgs<T>& args, bool allow_tf32);

template <typename T>
GpuStatus SiteConvForwardGpu(Stream stream, Scratch* scratch, const SiteConvArgs<T>& args,
                             const CheckedMap& checked, const SiteConvOptions& options,
                             const int32_t* neighbours, T* out, Report* report);

// SiteNeighbourTable: neighbours [num_out, volume + 2] (volume <= 32) of the map's first
// checked.pairs pairs, in the layout of site_conv_outputs.cuh. Checks the rows as the
// forward does (Report slots kSiteRows and kSiteRepeat) and blocks for the report,
// except for a trusted map. Temporary memory: 16 * (volume + 1) + 20 * num_out bytes and
// the radix sort's scratch.
GpuStatus SiteNeighbourTableGpu(Stream stream, Scratch* scratch, const int32_t* in_rows, const int32_t* out_rows,
                                const int32_t* host_splits, const CheckedMap& checked, int64_t volume,
                                int64_t num_in, int64_t num_out, bool trusted, int32_t* neighbours,
                                Report* report);

// The last two columns of a neighbour table [n, volume + 2] whose neighbour columns are
// written: the rows stably sorted by masks[o] (bit q: table[o, q] >= 0; clobbered), as
// (mask, row). Temporary memory: 12 * n bytes and the radix sort's scratch.
GpuStatus SortNeighbourRows(Stream stream, Scratch* scratch, uint32_t* masks, int64_t n, int64_t volume,
                            int32_t* table);

// filter_grad [volume, cin, cout]; deterministic (fixed chunks of pairs, partial sums
// added in chunk order). Blocks until the report is on the host, except for a trusted
// map (as for the forward: no row checks, report untouched, returns once queued).
// Temporary memory: the repeat check's (as for the forward), 16 * (volume + 1), and the
// partial sums: about min(pairs / 512, 2048 / tiles + volume) * cin * cout * sizeof(accumulator),
// tiles = ceil(cin / 64) * ceil(cout / 64) (float, half and bfloat16 on sm_80+ with rows
// of whole 16-byte vectors: tiles of 128 channels on a side above 64 channels,
// site_conv_filter_grad.cuh).
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
