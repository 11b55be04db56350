// The OpKernels of SiteSparseConv, SiteSparseConvFilterGrad and SiteNeighbourTable, one
// template each for both devices: the attributes, the shape checks and the allocation
// here; the map's row checks and the arithmetic in the functors, specialised per device
// (CPU: site_conv_kernels.cc; GPU: site_conv_kernels_gpu.cc over site_conv.cu).
//
// The row checks (in range, at most one pair per output row and offset; no NaN features
// for the forward) are the functors': the CPU runs them on the host in Prepare, before
// anything is allocated; the GPU's Prepare checks the offset splits (an input in host
// memory) and refuses inputs beyond its sort limits, and its Run checks the rows on the
// device with the work, their results read back in one host round trip and turned into
// the CPU's messages. With map_is_trusted the GPU skips the device checks and returns once
// its work is queued; the CPU checks whatever the attr says (no round trip to save).
#ifndef TF_SPARSECONV_SITE_CONV_SITE_CONV_KERNELS_H_
#define TF_SPARSECONV_SITE_CONV_SITE_CONV_KERNELS_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "common/device.h"
#include "common/guarded_op_kernel.h"
#include "site/conv/site_conv.h"
#include "site/conv/site_conv_checks.h"
#include "site/conv/site_gemm_cpu.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_sparseconv {

// The attributes of the three ops, those each has (map_is_trusted all; cpu_products the
// convolution and its filter gradient; map_is_submanifold and dataflow the convolution).
struct SiteConvAttrs {
  bool map_is_trusted = false;
  bool map_is_submanifold = false;
  bool map_is_table = false;
  SiteDataflow dataflow = SiteDataflow::kAuto;
  // cpu_products: 'auto' the widest tiles the CPU has (kAvx512 asked), 'avx2' at most the
  // AVX2 tiles, 'portable' Eigen's GEMM.
  CpuProducts products = CpuProducts::kAvx512;
  bool relu = false;     // activation 'relu' (the convolution's epilogue)
  float epsilon = 1e-3f;  // the epilogue's normalisation

  absl::Status Read(tensorflow::OpKernelConstruction* ctx) {
    TF_RETURN_IF_ERROR(ctx->GetAttr("map_is_trusted", &map_is_trusted));
    if (ctx->HasAttr("map_is_submanifold")) {
      TF_RETURN_IF_ERROR(ctx->GetAttr("map_is_submanifold", &map_is_submanifold));
    }
    if (ctx->HasAttr("map_is_table")) {
      TF_RETURN_IF_ERROR(ctx->GetAttr("map_is_table", &map_is_table));
    }
    if (ctx->HasAttr("dataflow")) {
      std::string name;
      TF_RETURN_IF_ERROR(ctx->GetAttr("dataflow", &name));
      TF_RETURN_IF_ERROR(ParseSiteDataflow(name, &dataflow));
    }
    if (ctx->HasAttr("activation")) {
      std::string activation;
      TF_RETURN_IF_ERROR(ctx->GetAttr("activation", &activation));
      if (activation != "none" && activation != "relu") {
        return tensorflow::errors::InvalidArgument("activation must be 'none' or 'relu', got '", activation, "'");
      }
      relu = activation == "relu";
    }
    if (ctx->HasAttr("epsilon")) {
      TF_RETURN_IF_ERROR(ctx->GetAttr("epsilon", &epsilon));
      if (!(epsilon > 0.0f) || !std::isfinite(epsilon)) {
        return tensorflow::errors::InvalidArgument("epsilon must be a positive finite float, got ", epsilon);
      }
    }
    if (ctx->HasAttr("cpu_products")) {
      std::string products;
      TF_RETURN_IF_ERROR(ctx->GetAttr("cpu_products", &products));
      if (products != "auto" && products != "avx2" && products != "portable") {
        return tensorflow::errors::InvalidArgument("cpu_products must be 'auto', 'avx2' or 'portable', got '",
                                                   products, "'");
      }
      this->products = products == "portable" ? CpuProducts::kPortable
                       : products == "avx2"   ? CpuProducts::kAvx2
                                              : CpuProducts::kAvx512;
    }
    return absl::OkStatus();
  }
};

// The functors' contracts, specialised per device; each is made per call:
//   Functor(OpKernelContext* ctx, const SiteConvAttrs& attrs);
//   absl::Status Prepare(const SiteMapView& map, ...);  // the device's checks before allocation
//   absl::Status Run(...);                             // the arithmetic (GPU: and the row checks)
//
// SiteSparseConv: Prepare(map, args) and Run(args, neighbours, out), out [num_out, cout]
// the convolution (site_conv.h), neighbours SiteNeighbourTable's table or nullptr. The CPU
// has one dataflow and refuses 'outputs' in Prepare. With map_is_table, first
// UseTable(neighbours, &map, &args): the CPU derives the pairs from the table; the GPU
// refuses a call its output-stationary tiles cannot run from the table alone.
template <typename Device, typename T>
class SiteConvFunctor;
// SiteSparseConvFilterGrad: Prepare(map, args) and Run(args, out_grad, filter_grad),
// filter_grad [volume, cin, cout] (args.filters unused, args.cout from out_grad).
template <typename Device, typename T>
class SiteConvFilterGradFunctor;
// SiteNeighbourTable: Prepare(map, num_in, num_out) and Run(map, num_in, num_out, table),
// table [num_out, NeighbourTableWidth(volume)] in SiteNeighbourTable's layout (site_conv_op.cc).
template <typename Device>
class SiteNeighbourTableFunctor;

// What the three OpKernels share: their attributes, read once.
class SiteConvOpKernel : public GuardedOpKernel {
 public:
  SiteConvOpKernel(tensorflow::OpKernelConstruction* ctx, const char* op) : GuardedOpKernel(ctx, op) {
    AttrsOk(attrs_.Read(ctx));
  }

 protected:
  SiteConvAttrs attrs_;
};

// The epilogue input's vectors (site_conv_op.cc): none; a shift; a scale and a shift; or a
// mean, a variance, a scale and a shift; each [cout] of the accumulator's type.
template <typename A>
absl::Status ReadEpilogue(tensorflow::OpKernelContext* ctx, int64_t cout, SiteEpilogue<A>* epilogue) {
  tensorflow::OpInputList list;
  TF_RETURN_IF_ERROR(ctx->input_list("epilogue", &list));
  static const char* const kNames[5][4] = {
      {}, {"shift"}, {"scale", "shift"}, {}, {"mean", "variance", "scale", "shift"}};
  if (list.size() > 4 || list.size() == 3) {
    return tensorflow::errors::InvalidArgument(
        "site_conv: the epilogue holds no tensor, a shift, a scale and a shift, or a mean, a variance, a scale and "
        "a shift; got ", list.size(), " tensors");
  }
  const tensorflow::DataType want = tensorflow::DataTypeToEnum<A>::value;
  for (int i = 0; i < list.size(); ++i) {
    const char* what = kNames[list.size()][i];
    const tensorflow::Tensor& v = list[i];
    if (v.dtype() != want) {
      return tensorflow::errors::InvalidArgument("site_conv: the epilogue's ", what, " must be ",
                                                 tensorflow::DataTypeString(want), " for these features, got ",
                                                 tensorflow::DataTypeString(v.dtype()));
    }
    if (v.dims() != 1 || v.dim_size(0) != cout) {
      return tensorflow::errors::InvalidArgument("site_conv: the epilogue's ", what, " must be [Cout] = [", cout,
                                                 "], got shape ", v.shape().DebugString());
    }
  }
  const int n = list.size();
  epilogue->mean = n == 4 ? list[0].flat<A>().data() : nullptr;
  epilogue->variance = n == 4 ? list[1].flat<A>().data() : nullptr;
  epilogue->scale = n >= 2 ? list[n - 2].flat<A>().data() : nullptr;
  epilogue->shift = n >= 1 ? list[n - 1].flat<A>().data() : nullptr;
  return absl::OkStatus();
}

template <typename Device, typename T>
class SiteSparseConvOp : public SiteConvOpKernel {
 public:
  explicit SiteSparseConvOp(tensorflow::OpKernelConstruction* ctx) : SiteConvOpKernel(ctx, "site_conv") {}

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    using ::tensorflow::Tensor;
    const Tensor& features = ctx->input(0);
    const Tensor& filters = ctx->input(1);
    const Tensor& num_out = ctx->input(5);
    const Tensor& neighbours = ctx->input(6);
    OP_REQUIRES_OK(ctx, CheckSiteConvInputs(features, filters, num_out));
    SiteMapView map;
    OP_REQUIRES_OK(ctx, CheckSiteMapShapes(ctx->input(2), ctx->input(3), ctx->input(4), filters.dim_size(0), &map));
    SiteConvArgs<T> a = SiteConvArgsOf<T>(map, features.dim_size(0), num_out.scalar<int32_t>()(),
                                          features.dim_size(1), filters.dim_size(2));
    a.features = features.flat<T>().data();
    a.filters = filters.flat<T>().data();
    bool neighbours_given = false;
    OP_REQUIRES_OK(ctx, CheckNeighboursInput(neighbours, a.num_out, a.volume, attrs_.map_is_trusted,
                                             &neighbours_given));
    OP_REQUIRES_OK(ctx, CheckSubmanifoldClaim(attrs_.map_is_submanifold, attrs_.map_is_trusted, a.num_in, a.num_out,
                                              a.volume));
    OP_REQUIRES_OK(ctx, ReadEpilogue(ctx, a.cout, &a.epilogue));
    a.epilogue.relu = attrs_.relu;
    a.epilogue.epsilon = attrs_.epsilon;
    SiteConvFunctor<Device, T> conv(ctx, attrs_);
    if (attrs_.map_is_table) {
      OP_REQUIRES_OK(ctx, CheckTableMapClaim(map, neighbours_given, attrs_.map_is_submanifold));
      OP_REQUIRES_OK(ctx, conv.UseTable(neighbours, &map, &a));
    }
    OP_REQUIRES_OK(ctx, conv.Prepare(map, a));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({a.num_out, a.cout}), &out));
    OP_REQUIRES_OK(ctx, conv.Run(a, neighbours_given ? neighbours.flat<int32_t>().data() : nullptr,
                                 out->flat<T>().data()));
  }
};

template <typename Device, typename T>
class SiteSparseConvFilterGradOp : public SiteConvOpKernel {
 public:
  explicit SiteSparseConvFilterGradOp(tensorflow::OpKernelConstruction* ctx) : SiteConvOpKernel(ctx, "site_conv_filter_grad") {}

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    using ::tensorflow::Tensor;
    const Tensor& features = ctx->input(0);
    const Tensor& out_grad = ctx->input(1);
    const Tensor& splits = ctx->input(4);
    OP_REQUIRES_OK(ctx, CheckSiteFilterGradInputs(features, out_grad, splits));
    SiteMapView map;
    OP_REQUIRES_OK(ctx, CheckSiteMapShapes(ctx->input(2), ctx->input(3), splits, splits.NumElements() - 1, &map));
    SiteConvArgs<T> a = SiteConvArgsOf<T>(map, features.dim_size(0), out_grad.dim_size(0), features.dim_size(1),
                                          out_grad.dim_size(1));
    a.features = features.flat<T>().data();
    SiteConvFilterGradFunctor<Device, T> filter_grad(ctx, attrs_);
    OP_REQUIRES_OK(ctx, filter_grad.Prepare(map, a));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({a.volume, a.cin, a.cout}), &out));
    OP_REQUIRES_OK(ctx, filter_grad.Run(a, out_grad.flat<T>().data(), out->flat<T>().data()));
  }
};

template <typename Device>
class SiteNeighbourTableOp : public SiteConvOpKernel {
 public:
  explicit SiteNeighbourTableOp(tensorflow::OpKernelConstruction* ctx) : SiteConvOpKernel(ctx, "site_neighbour_table") {}

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    SiteMapView map;
    int64_t num_in = 0, num_out = 0;
    OP_REQUIRES_OK(ctx, CheckNeighbourTableInputs(ctx->input(0), ctx->input(1), ctx->input(2), ctx->input(3),
                                                  ctx->input(4), &map, &num_in, &num_out));
    SiteNeighbourTableFunctor<Device> table(ctx, attrs_);
    OP_REQUIRES_OK(ctx, table.Prepare(map, num_in, num_out));
    tensorflow::Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, tensorflow::TensorShape({num_out, NeighbourTableWidth(map.volume)}), &out));
    OP_REQUIRES_OK(ctx, table.Run(map, num_in, num_out, out->flat<int32_t>().data()));
  }
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_CONV_KERNELS_H_
