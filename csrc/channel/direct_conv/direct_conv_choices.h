// The typed choices of DirectSparseConv and its backprop (their attributes `selection` and
// `dataflow`), the size of the forward's status output and the input gradient's order,
// without TensorFlow or CUDA headers so that the CUDA sources share them.
#ifndef TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_CHOICES_H_
#define TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_CHOICES_H_

namespace tf_sparseconv {

// k-selection (Hackel et al. §3.2): kSigned keeps the k largest values, kAbs the k largest
// magnitudes; ties go to the smaller key.
enum class SelectionMode { kNone, kSigned, kAbs };

// How the touched set is formed and summed, the same two ways on both devices:
//  kSort:  the contributions taken in output-key order and summed per key; memory follows
//          the contributions, whatever the grid. The GPU radix-sorts every (entry, present
//          weight) contribution; the CPU k-way merges the per-weight streams of one
//          (batch, output channel), each sorted already. The backprop searches the sorted
//          output keys.
//  kDense: buffers over the grid; memory follows B * R^d, whatever the entries. The GPU
//          scatters the input into [B, Cin, R^d] with neighbour masks; the CPU adds into
//          position-major [R^d, Cout] rows per batch element. The backprop reads the output
//          gradient through the dense output grid.
//  kBitmap: the GPU only (the CPU refuses it): a presence bit per input and per output key,
//          the touched keys read from the output bits in order, no sort; memory follows
//          B * R^d / 8 per channel plus the touched entries. The backprop searches the sorted
//          output keys, as after kSort.
//  kAtomic: the GPU only (the CPU refuses it), never under TensorFlow's op determinism: the
//          output bits as kBitmap's give the touched keys in order, then every (entry, present
//          weight) contribution is added to its output's value with a float atomic. No sort
//          and no per-output search; the sums' order, and so their last bits, vary run to run.
//  kAuto:  each device's rule (the GPU: by temporary memory and op determinism,
//          direct_conv_gpu.h; the CPU: its cost model, direct_conv_kernels.cc).
// On each device kSort, kDense and kBitmap give the same touched set and bit-identical forward
// values; kAtomic the same touched set, and values within rounding of theirs.
enum class DirectConvDataflow { kAuto, kSort, kDense, kBitmap, kAtomic };

// The input gradient's summation order on both devices (on the CPU its search path; the
// dense path sums per output channel): an entry's terms over its input channel's row of
// present weights (oc, then kernel offset), in groups of kInGradGroup consecutive weights of
// the row, each group summed, then the groups' sums added in the row's order. The GPU's
// filter-gradient pass makes the groups' sums as it looks the links up.
constexpr int kInGradGroup = 8;

// DirectSparseConv's `status` output (direct_conv_checks.h, ConvStatusError): kConvStatusSlots
// slots of {first value (-1: passed), three details}: kConvCheckSlots in the order of the
// GPU's ConvCheck (the first offending position), then the capacity slot ({kept entries,
// max_entries, -1, -1} where the kept entries exceed a user-given max_entries), then the
// input's key limit.
constexpr int kConvCheckSlots = 5;
constexpr int kConvCapacitySlot = kConvCheckSlots;
constexpr int kConvStatusSlots = kConvCheckSlots + 1;
constexpr int kConvStatusSize = 4 * kConvStatusSlots + 1;

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_CHOICES_H_
