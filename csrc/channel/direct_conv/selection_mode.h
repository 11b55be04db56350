// k-selection modes of DirectSparseConv (Hackel et al. §3.2), without TensorFlow or CUDA
// headers so that the CUDA sources share the enum.
#ifndef TF_SPARSECONV_CHANNEL_DIRECT_CONV_SELECTION_MODE_H_
#define TF_SPARSECONV_CHANNEL_DIRECT_CONV_SELECTION_MODE_H_

namespace tf_sparseconv {

// kSigned keeps the k largest values, kAbs the k largest magnitudes; ties go to the
// smaller key.
enum class SelectionMode { kNone, kSigned, kAbs };

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_DIRECT_CONV_SELECTION_MODE_H_
