// Registration of the sparse ReLU.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_sparseconv {

using ::tensorflow::shape_inference::InferenceContext;

REGISTER_OP("TfSparseconv>SparseRelu")
    .Input("keys: int64")
    .Input("values: T")
    .Input("dense_shape: int64")
    .Output("out_keys: int64")
    .Output("out_values: T")
    .Output("kept: int64")
    .Attr("T: {float, double}")
    .Attr("padded_input: bool = false")
    .Attr("padded_output: bool = false")
    .Attr("inputs_checked: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      const auto n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Vector(n));
      c->set_output(2, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(
ReLU on a channel-sparse tensor: entries with value <= 0 are dropped, so the result is
sparser than the input. kept[j] is the input position of output entry j.
padded_input: the input may end in padding (keys equal to the largest int64, after every
  live key; a library op's padded output), which is absent; elsewhere such a key is out of
  range.
padded_output: the outputs have the input's length, a bound known before the op runs: the
  kept entries, then padding (key the largest int64, value 0, kept its own position).
inputs_checked: the input was made by one of the library's ops, whose keys need no check.
  On the GPU, with padded_output, the op then reads nothing back (no wait for the device):
  it checks nothing, and a NaN value is kept, to be refused by the next op that checks
  values (a convolution's status) or seen in the result. The CPU checks as ever.
)doc");

}  // namespace tf_sparseconv
