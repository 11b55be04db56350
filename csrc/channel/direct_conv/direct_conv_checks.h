// Attributes and host-side input checks of DirectSparseConv(Backprop), run by their
// OpKernel templates (direct_conv_kernels.h) on both devices, so that both reject the same
// inputs with the same messages. The checks that read keys and values (sorted, in range,
// NaN) are the functors': they run where the data lives.
#ifndef TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_CHECKS_H_
#define TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_CHECKS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "channel/channel_sparse.h"
#include "channel/direct_conv/direct_conv.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_sparseconv {

// The attribute `dataflow` of both ops (its values are checked by the op registration).
inline absl::Status ReadDataflow(tensorflow::OpKernelConstruction* ctx, DirectConvDataflow* dataflow) {
  std::string name;
  TF_RETURN_IF_ERROR(ctx->GetAttr("dataflow", &name));
  *dataflow = name == "sort"     ? DirectConvDataflow::kSort
              : name == "dense"  ? DirectConvDataflow::kDense
              : name == "bitmap" ? DirectConvDataflow::kBitmap
              : name == "atomic" ? DirectConvDataflow::kAtomic
                                 : DirectConvDataflow::kAuto;
  return absl::OkStatus();
}

struct ConvAttrs {
  SelectionMode selection = SelectionMode::kNone;
  DirectConvDataflow dataflow = DirectConvDataflow::kAuto;
  int64_t k = 0;
  float rho_up = 0.0f;
  int64_t temp_limit_bytes = 0;  // the GPU sort's contribution buffers; 0: no limit
  bool relu = false;             // activation 'relu': only kept entries > 0 are output
  bool padded_output = false;    // outputs at OutputCapacity, live entries then padding
  bool inputs_checked = false;   // the input keys were made by a library op (no key checks)
  int64_t max_entries = 0;       // the user's cap on the kept entries; 0: none

  // Reads and checks the attributes.
  absl::Status Read(tensorflow::OpKernelConstruction* ctx) {
    std::string selection_name;
    TF_RETURN_IF_ERROR(ctx->GetAttr("selection", &selection_name));
    TF_RETURN_IF_ERROR(ReadDataflow(ctx, &dataflow));
    TF_RETURN_IF_ERROR(ctx->GetAttr("k", &k));
    TF_RETURN_IF_ERROR(ctx->GetAttr("rho_up", &rho_up));
    TF_RETURN_IF_ERROR(ctx->GetAttr("temp_limit_bytes", &temp_limit_bytes));
    std::string activation;
    TF_RETURN_IF_ERROR(ctx->GetAttr("activation", &activation));
    relu = activation == "relu";
    TF_RETURN_IF_ERROR(ctx->GetAttr("padded_output", &padded_output));
    TF_RETURN_IF_ERROR(ctx->GetAttr("inputs_checked", &inputs_checked));
    TF_RETURN_IF_ERROR(ctx->GetAttr("max_entries", &max_entries));
    selection = selection_name == "signed" ? SelectionMode::kSigned
                : selection_name == "abs"  ? SelectionMode::kAbs
                                           : SelectionMode::kNone;
    if (temp_limit_bytes < 0) {
      return tensorflow::errors::InvalidArgument("temp_limit_bytes must be >= 0 (0: no limit), got ",
                                                 temp_limit_bytes);
    }
    if (k < 0) return tensorflow::errors::InvalidArgument("k must be >= 0, got ", k);
    if (max_entries < 0) {
      return tensorflow::errors::InvalidArgument("max_entries must be >= 0 (0: no cap), got ", max_entries);
    }
    if (std::isnan(rho_up) || rho_up < 0.0f || rho_up > 1.0f) {
      return tensorflow::errors::InvalidArgument("rho_up must be in (0, 1], got ", rho_up);
    }
    if (selection == SelectionMode::kNone) {
      if (k != 0 || rho_up != 0.0f) {
        return tensorflow::errors::InvalidArgument(
            "k / rho_up given with selection='none'; set selection to 'signed' or "
            "'abs' to bound density");
      }
    } else if ((k > 0) == (rho_up > 0.0f)) {
      return tensorflow::errors::InvalidArgument(
          "selection='", selection_name, "' needs exactly one of k > 0 or rho_up in "
          "(0, 1], got k = ", k, ", rho_up = ", rho_up);
    }
    return absl::OkStatus();
  }

  // The per-(b, oc) bound: k, or ceil(rho_up * S).
  int64_t EffectiveK(int64_t spatial_size) const {
    return k > 0 ? k
                 : static_cast<int64_t>(std::ceil(static_cast<double>(rho_up) * spatial_size));
  }
};

// The fused ReLU's refusal of NaN (SparseRelu refuses NaN input): checked inputs, filter
// and bias hold none, so it comes from infinite input values (inf - inf, inf * 0).
inline absl::Status FusedReluNaNError() {
  return tensorflow::errors::InvalidArgument(
      "DirectSparseConv with activation 'relu': an output value before the ReLU is NaN "
      "(from infinite input values)");
}

// More kept entries than the user's max_entries: refused (a padded output keeps none of
// them past its capacity; an exact-size one is refused alike, on both devices).
inline absl::Status CapacityError(int64_t count, int64_t max_entries) {
  return tensorflow::errors::InvalidArgument(
      "DirectSparseConv: the output has ", count, " entries, more than max_entries = ", max_entries,
      " (the capacity it was given); raise max_entries, or bound the output with k-selection");
}

// The output length of a padded_output call, from shapes and the (host) filter_mask alone,
// the same on both devices: every output entry needs a contribution, an input entry makes
// at most as many as its channel has present weights (max_row), and a (b, oc) segment holds
// at most S entries, with k-selection at most k. capacity is the input's length (padding
// included, as the GPU's contribution buffers count it).
inline int64_t OutputCapacity(const ConvAttrs& attrs, const KeyLayout& L, int64_t cout, const bool* mask,
                              int64_t mask_size, int64_t capacity) {
  // The filter is [K..., Cin, Cout]: weight j belongs to input channel (j / Cout) % Cin
  // (walked as offsets x Cin x Cout, without a division per weight).
  std::vector<int64_t> per_channel(L.channels, 0);
  const int64_t per_offset = L.channels * cout;
  for (int64_t base = 0; per_offset > 0 && base + per_offset <= mask_size; base += per_offset) {
    for (int64_t ic = 0; ic < L.channels; ++ic) {
      const bool* row = mask + base + ic * cout;
      for (int64_t oc = 0; oc < cout; ++oc) per_channel[ic] += row[oc] ? 1 : 0;
    }
  }
  int64_t max_row = 0;
  for (int64_t c : per_channel) max_row = std::max(max_row, c);
  const int64_t per_segment = attrs.selection == SelectionMode::kNone
                                  ? L.spatial_size
                                  : std::min(attrs.EffectiveK(L.spatial_size), L.spatial_size);
  const int64_t segments_bound = L.batch * cout * per_segment;
  // capacity * max_row may overflow where it exceeds the segments' bound anyway.
  if (max_row > 0 && capacity > segments_bound / max_row) return segments_bound;
  return std::min(capacity * max_row, segments_bound);
}

// The GPU forward's device checks as its `status` output (kConvStatusSize values,
// direct_conv_choices.h), for a padded_output call that does not wait for them
// (DirectSparseConvReportStatus reads them later): the slots are gpu::ConvCheck's, input
// keys, input values, filter, bias, the fused ReLU's NaN, then the capacity (more kept
// entries than a user-given max_entries, CapacityError). All -1 where the op checked on
// the host (or waited for its checks). The first failed slot's message, as the CPU gives it.
inline absl::Status ConvStatusError(const int64_t* status) {
  const int64_t limit = status[4 * kConvStatusSlots];
  const int64_t* capacity = status + 4 * kConvCapacitySlot;
  const int64_t* keys = status;
  const int64_t* values = status + 4;
  const int64_t* filter = status + 8;
  const int64_t* bias = status + 12;
  const int64_t* relu = status + 16;
  if (keys[0] != -1) return InvalidKeyError("input", keys[0], keys[1], keys[2], limit);
  if (values[0] != -1) return NaNError("input values", values[0]);
  if (filter[0] != -1) return NaNError("filter", filter[0]);
  if (bias[0] != -1) return NaNError("bias", bias[0]);
  if (relu[0] != -1) return FusedReluNaNError();
  if (capacity[0] != -1) return CapacityError(capacity[0], capacity[1]);
  return absl::OkStatus();
}

struct ConvShapes {
  int64_t kernel_size[kMaxSpatialDims] = {};
  int64_t cout = 0;
};

// Inputs filter and filter_mask against the input layout (the input tensor's own checks,
// CheckSparseTensor, come before this one).
inline absl::Status CheckConvShapes(const tensorflow::Tensor& filter, const tensorflow::Tensor& mask,
                                    const KeyLayout& L, ConvShapes* shapes) {
  namespace errors = ::tensorflow::errors;
  if (filter.dims() != L.d + 2) {
    return errors::InvalidArgument("filter must have rank ", L.d + 2,
                                   " [K1..Kd, Cin, Cout] for ", L.d,
                                   "-D input, got shape ", filter.shape().DebugString());
  }
  for (int j = 0; j < L.d; ++j) {
    shapes->kernel_size[j] = filter.dim_size(j);
    if (shapes->kernel_size[j] % 2 == 0) {
      return errors::InvalidArgument("kernel sizes must be odd ('same' padding centres the "
                                     "kernel), got ", filter.shape().DebugString());
    }
  }
  if (filter.dim_size(L.d) != L.channels) {
    return errors::InvalidArgument("channel mismatch: filter has Cin = ",
                                   filter.dim_size(L.d), " but the input has ",
                                   L.channels, " channels");
  }
  shapes->cout = filter.dim_size(L.d + 1);
  if (shapes->cout == 0) return errors::InvalidArgument("filter has zero output channels");
  if (mask.shape() != filter.shape()) {
    return errors::InvalidArgument("filter_mask must have the filter's shape ",
                                   filter.shape().DebugString(), ", got ",
                                   mask.shape().DebugString());
  }
  return absl::OkStatus();
}

inline absl::Status CheckBiasShape(const tensorflow::Tensor& bias, int64_t cout) {
  if (bias.dims() != 1 || bias.dim_size(0) != cout) {
    return tensorflow::errors::InvalidArgument("bias must have shape [", cout, "], got ",
                                               bias.shape().DebugString());
  }
  return absl::OkStatus();
}

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_CHANNEL_DIRECT_CONV_DIRECT_CONV_CHECKS_H_
