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
)doc");

}  // namespace tf_sparseconv
