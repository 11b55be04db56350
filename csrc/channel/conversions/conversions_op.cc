// Registration of the channel-sparse tensor's conversion and validation ops.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_sparseconv {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TfSparseconv>ChannelSparseValidate")
    .Input("keys: int64")
    .Input("values: T")
    .Input("dense_shape: int64")
    .Output("valid_keys: int64")
    .Output("valid_values: T")
    .Attr("T: {float, double}")
    .Attr("padded_input: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(1));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Checks a channel-sparse tensor: keys sorted, unique and inside [0, prod(dense_shape)),
one value per key, a valid dense_shape, no NaN values. Passes keys and values through.
padded_input: the keys may end in padding (keys equal to the largest int64, after every
  live key; a library op's padded output); elsewhere such a key is out of range.
)doc");

REGISTER_OP("TfSparseconv>ChannelSparseEncodeKeys")
    .Input("indices: int64")
    .Input("dense_shape: int64")
    .Output("keys: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle indices;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &indices));
      c->set_output(0, c->Vector(c->Dim(indices, 0)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Compresses [N, d+2] indices (b, x1..xd, c) into keys (b * C + c) * S + lin(x); every
coordinate must be inside dense_shape. The keys keep the order of the rows.
)doc");

REGISTER_OP("TfSparseconv>ChannelSparseDecodeKeys")
    .Input("keys: int64")
    .Input("dense_shape: int64")
    .Output("indices: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys, shape;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &shape));
      c->set_output(0, c->Matrix(c->Dim(keys, 0), c->Dim(shape, 0)));
      return absl::OkStatus();
    })
    .Doc("Expands keys into [N, d+2] indices (b, x1..xd, c).");

REGISTER_OP("TfSparseconv>ChannelSparseReorder")
    .Input("keys: int64")
    .Input("values: T")
    .Input("dense_shape: int64")
    .Output("sorted_keys: int64")
    .Output("sorted_values: T")
    .Output("permutation: int64")
    .Attr("T: {float, double}")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(1));
      c->set_output(2, c->input(0));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Sorts in-range keys (and their values) into the canonical order; duplicate keys are an
error. sorted_values[i] = values[permutation[i]].
)doc");

REGISTER_OP("TfSparseconv>ChannelSparseToDense")
    .Input("keys: int64")
    .Input("values: T")
    .Input("dense_shape: int64")
    .Output("dense: T")
    .Attr("T: {float, double}")
    .Attr("inputs_checked: bool = false")
    .Attr("padded_input: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(2, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Scatters a channel-sparse tensor into a dense [B, R1..Rd, C] tensor (zeros elsewhere).

inputs_checked: the caller vouches that the keys are the output of an op of the library
that made or checked them (in a traced graph: tf_sparseconv.to_dense sees the op); the GPU
kernel then queues its work without checking them again and without waiting for the
device. The CPU kernel checks them in any case (its check costs no wait).
padded_input: the keys may end in padding (keys equal to the largest int64, after every
  live key; a library op's padded output), which is absent.
)doc");

REGISTER_OP("TfSparseconv>ChannelSparseGatherDense")
    .Input("keys: int64")
    .Input("dense: T")
    .Output("values: T")
    .Attr("T: {float, double}")
    .Attr("inputs_checked: bool = false")
    .Attr("padded_input: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Reads a dense [B, R1..Rd, C] tensor at the positions of the keys (the adjoint of ToDense).

inputs_checked: the caller vouches that the keys were checked by the op that took them
(ChannelSparseToDense, whose gradient this is); the GPU kernel then queues its work
without checking them again and without waiting for the device. The CPU kernel checks
them in any case (its check costs no wait).
padded_input: the keys may end in padding, whose values are 0.
)doc");

REGISTER_OP("TfSparseconv>DenseToChannelSparse")
    .Input("dense: T")
    .Output("keys: int64")
    .Output("values: T")
    .Output("dense_shape: int64")
    .Attr("T: {float, double}")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      c->set_output(2, c->Vector(c->Rank(c->input(0))));
      return absl::OkStatus();
    })
    .Doc("Keeps the non-zero entries of a dense [B, R1..Rd, C] tensor as a channel-sparse tensor.");

}  // namespace tf_sparseconv
