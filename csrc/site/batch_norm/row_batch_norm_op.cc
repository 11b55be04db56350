// RowBatchNorm, RowBatchNormGrad, RowScaleShift and RowNormalize: batch normalization of site feature
// rows [N, C] (FusedBatchNormalization's computation, tf_sparseconv/site/batch_norm.py).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_sparseconv {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// rows [N, C] and the float vectors [C] named by `vectors` (input indices) -> C.
Status RowsAndVectors(InferenceContext* c, int rows, std::initializer_list<int> vectors, DimensionHandle* channels) {
  ShapeHandle x;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(rows), 2, &x));
  *channels = c->Dim(x, 1);
  for (int i : vectors) {
    ShapeHandle v;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &v));
    TF_RETURN_IF_ERROR(c->Merge(*channels, c->Dim(v, 0), channels));
  }
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("TfSparseconv>RowBatchNorm")
    .Input("x: T")
    .Input("gamma: float")
    .Input("beta: float")
    .Output("y: T")
    .Output("mean: float")
    .Output("variance: float")
    .Output("inv_std: float")
    .Attr("T: {half, bfloat16, float}")
    .Attr("epsilon: float")
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle channels;
      TF_RETURN_IF_ERROR(RowsAndVectors(c, 0, {1, 2}, &channels));
      c->set_output(0, c->input(0));
      for (int i = 1; i < 4; ++i) c->set_output(i, c->Vector(channels));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Batch normalization of rows over the rows, per column, with the batch's statistics
(training): y = (x - mean) / sqrt(variance + epsilon) * gamma + beta.

x: [N, C] rows. gamma, beta: [C].
y: [N, C], x's type. mean, variance: [C], the rows' mean and biased variance (float32).
inv_std: [C], 1 / sqrt(variance + epsilon), for the gradient.
epsilon: added to the variance, > 0.
)doc");

REGISTER_OP("TfSparseconv>RowBatchNormGrad")
    .Input("dy: T")
    .Input("x: T")
    .Input("gamma: float")
    .Input("mean: float")
    .Input("inv_std: float")
    .Output("dx: T")
    .Output("dgamma: float")
    .Output("dbeta: float")
    .Attr("T: {half, bfloat16, float}")
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle channels;
      TF_RETURN_IF_ERROR(RowsAndVectors(c, 1, {2, 3, 4}, &channels));
      ShapeHandle dy;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1), &dy));
      c->set_output(0, dy);
      c->set_output(1, c->Vector(channels));
      c->set_output(2, c->Vector(channels));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The gradient of RowBatchNorm's y with respect to x (through the batch's mean and
variance), gamma and beta.

dy, x: [N, C]. gamma, mean, inv_std: [C], RowBatchNorm's.
dx: [N, C]. dgamma, dbeta: [C].
)doc");

REGISTER_OP("TfSparseconv>RowScaleShift")
    .Input("x: T")
    .Input("scale: float")
    .Input("shift: float")
    .Output("y: T")
    .Attr("T: {half, bfloat16, float}")
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle channels;
      TF_RETURN_IF_ERROR(RowsAndVectors(c, 0, {1, 2}, &channels));
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc(R"doc(
y = x * scale + shift per column, computed in float32 (batch normalization from moving
statistics, folded into scale and shift).

x: [N, C] rows. scale, shift: [C].
y: [N, C], x's type.
)doc");

REGISTER_OP("TfSparseconv>RowNormalize")
    .Input("x: T")
    .Input("mean: float")
    .Input("variance: float")
    .Input("gamma: float")
    .Input("beta: float")
    .Output("y: T")
    .Attr("epsilon: float")
    .Attr("T: {half, bfloat16, float}")
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle channels;
      TF_RETURN_IF_ERROR(RowsAndVectors(c, 0, {1, 2, 3, 4}, &channels));
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Batch normalization from given statistics (inference): per column, scale = gamma /
sqrt(variance + epsilon) and y = (x - mean) * scale + beta, computed in float32. One op
where the moving statistics would otherwise be folded into a scale and a shift by four
element-wise ops first.

x: [N, C] rows. mean, variance, gamma, beta: [C]. epsilon: > 0.
y: [N, C], x's type.
)doc");

}  // namespace tf_sparseconv
