// Registration of the sparse max-pooling op (Hackel et al. §3.3).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_sparseconv {

using ::tensorflow::shape_inference::InferenceContext;

REGISTER_OP("TfSparseconv>SparseMaxPool")
    .Input("keys: int64")
    .Input("values: T")
    .Input("dense_shape: int64")
    .Output("out_keys: int64")
    .Output("out_values: T")
    .Output("out_dense_shape: int64")
    .Output("argmax: int64")
    .Attr("T: {float, double}")
    .Attr("strides: list(int) >= 1")
    .Attr("padded_input: bool = false")
    .Attr("padded_output: bool = false")
    .Attr("inputs_checked: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      const auto n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Vector(n));
      c->set_output(2, c->input(2));
      c->set_output(3, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Max-pooling of a channel-sparse tensor with window = stride: the entry at x moves to
floor(x / s), and each output entry is the maximum of the entries present in its
window (empty windows stay empty, so negative maxima survive). Output spatial extents
are ceil(R / s). argmax[j] is the input position of the maximum of output entry j;
ties go to the smaller key. B * C is at most 2^24 (a table entry per (batch, channel)
segment).

padded_input: the input may end in padding (keys equal to the largest int64, after every
  live key; a library op's padded output), which is absent; elsewhere such a key is out of
  range.
padded_output: the outputs have min(input entries, B * C * ceil(R1/s1) * ... ) entries, the
  live entries followed by padding (key the largest int64, value 0, argmax its own position,
  which the gradient ignores): a size known before the op runs, so the GPU kernel allocates
  them without reading a count back.
inputs_checked: the caller vouches that keys and values were made or checked by one of the
  library's ops; the GPU kernel leaves its data checks out, and with padded_output it then
  queues its work without waiting for the device. The CPU kernel checks them in any case.
)doc");

}  // namespace tf_sparseconv
