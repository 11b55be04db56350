// SiteKernelMap's OpKernel on the CPU: the attributes, the geometry and the coordinates'
// shape here, with the allocation of the outputs (shared with the GPU's asynchronous
// kernel, site_kernel_map_kernels_gpu.cc, over site_kernel_map.cu and its two builders);
// the site checks (in range, no duplicates) and the map itself in
// SiteKernelMapFunctor<CPUDevice> (site_kernel_map_kernels.cc, a hash table probed per
// site and kernel offset).
#ifndef TF_SPARSECONV_SITE_KERNEL_MAP_SITE_KERNEL_MAP_KERNELS_H_
#define TF_SPARSECONV_SITE_KERNEL_MAP_SITE_KERNEL_MAP_KERNELS_H_

#include <cstdint>
#include <vector>

#include "common/device.h"
#include "common/guarded_op_kernel.h"
#include "site/kernel_map/site_geometry.h"
#include "site/kernel_map/site_kernel_map_checks.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_sparseconv {

// What Count finds: the map's size, known on the host before the outputs are allocated.
struct SiteMapCounts {
  int64_t pairs = 0;
  int64_t out_sites = 0;
  std::vector<int32_t> offset_splits;  // volume + 1
};

// The outputs' device buffers, once allocated.
struct SiteMapOutputs {
  int32_t* out_coords = nullptr;
  int32_t* in_rows = nullptr;
  int32_t* out_rows = nullptr;
};

// Allocates the op's outputs for counts and fills the two that live in host memory on
// every device (out_spatial_shape and offset_splits; the GPU registers them so).
inline absl::Status AllocateSiteMapOutputs(tensorflow::OpKernelContext* ctx, const SiteGeometry& g,
                                           const SiteMapCounts& counts, SiteMapOutputs* out) {
  using ::tensorflow::Tensor;
  using ::tensorflow::TensorShape;
  Tensor *out_coords, *out_shape, *in_rows, *out_rows, *splits;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({counts.out_sites, g.d + 1}), &out_coords));
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({g.d}), &out_shape));
  TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({counts.pairs}), &in_rows));
  TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({counts.pairs}), &out_rows));
  TF_RETURN_IF_ERROR(ctx->allocate_output(4, TensorShape({g.volume + 1}), &splits));
  for (int j = 0; j < g.d; ++j) out_shape->flat<int32_t>()(j) = static_cast<int32_t>(g.out_shape[j]);
  for (int64_t q = 0; q <= g.volume; ++q) splits->flat<int32_t>()(q) = counts.offset_splits[q];
  out->out_coords = out_coords->flat<int32_t>().data();
  out->in_rows = in_rows->flat<int32_t>().data();
  out->out_rows = out_rows->flat<int32_t>().data();
  return absl::OkStatus();
}

// The CPU functor's contract:
//   SiteKernelMapFunctor(OpKernelContext* ctx, const SiteMapAttrs& attrs);
//   absl::Status Count(const SiteGeometry& g, const int32_t* coords, int64_t n, SiteMapCounts* counts);
//     Checks the sites of coords [n, 1 + d] (every entry in range, then no site twice:
//     CoordOutOfRangeError and DuplicateSiteError, the first offending site in row
//     order) and finds the pairs and the output sites.
//   absl::Status Write(int32_t* out_coords, int32_t* in_rows, int32_t* out_rows);
//     The output sites [out_sites, 1 + d] and the pairs grouped by offset, within one
//     offset ordered by input row.
// (The GPU kernel is asynchronous and has its own OpKernel, site_kernel_map_kernels_gpu.cc.)
template <typename Device>
class SiteKernelMapFunctor;

template <typename Device>
class SiteKernelMapOp : public GuardedOpKernel {
 public:
  explicit SiteKernelMapOp(tensorflow::OpKernelConstruction* ctx) : GuardedOpKernel(ctx, "site_kernel_map") {
    AttrsOk(attrs_.Parse(ctx));
  }

 private:
  void ComputeGuarded(tensorflow::OpKernelContext* ctx) override {
    using ::tensorflow::Tensor;
    SiteGeometry g;
    OP_REQUIRES_OK(ctx, SiteCallGeometry(ctx, attrs_, &g));
    const Tensor& coords = ctx->input(0);
    SiteKernelMapFunctor<Device> map(ctx, attrs_);
    SiteMapCounts counts;
    OP_REQUIRES_OK(ctx, map.Count(g, coords.flat<int32_t>().data(), coords.dim_size(0), &counts));
    SiteMapOutputs out;
    OP_REQUIRES_OK(ctx, AllocateSiteMapOutputs(ctx, g, counts, &out));
    OP_REQUIRES_OK(ctx, map.Write(out.out_coords, out.in_rows, out.out_rows));
  }

 private:
  SiteMapAttrs attrs_;
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_KERNEL_MAP_SITE_KERNEL_MAP_KERNELS_H_
