// GPU kernel of SiteKernelMap: the CPU kernel's shape and geometry checks here, the site
// checks and the map on the device (site_kernel_map.cu), the CPU kernel's messages
// for bad sites. out_spatial_shape and offset_splits are produced in host memory: both
// are known on the host after the one round trip, and the convolution reads
// offset_splits on the host, so a cached map costs the layers that use it no copies.
#if GOOGLE_CUDA

#include <cstdint>
#include <string>

#include "common/gpu_kernel_util.h"
#include "site/kernel_map/site_geometry.h"
#include "site/kernel_map/site_kernel_map_checks.h"
#include "site/kernel_map/site_kernel_map_gpu.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

class SiteKernelMapGpuOp : public OpKernel {
 public:
  explicit SiteKernelMapGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Parse(ctx));
    std::string builder;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("builder", &builder));
    builder_ = builder == "sort" ? gpu::SiteMapBuilder::kSort : gpu::SiteMapBuilder::kHash;
  }

  void Compute(OpKernelContext* ctx) override {
    SiteGeometry g;
    OP_REQUIRES_OK(ctx, MakeSiteGeometry(attrs_, ctx->input(1), ctx->input(2), &g));
    const Tensor& coords = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckCoordsShape(coords, g.d));
    const int64_t n = coords.dim_size(0);
    const int width = g.d + 1;
    int64_t candidates = 0;
    OP_REQUIRES(ctx, !__builtin_mul_overflow(g.volume, n, &candidates),
                errors::ResourceExhausted("SiteKernelMap on GPU: sites times kernel offsets overflows"));
    OP_REQUIRES_OK(ctx, CheckSortable(candidates, "SiteKernelMap", "(site, kernel offset) candidates"));

    TempScratch scratch(ctx);
    gpu::SiteKernelMapGpu map;
    gpu::SiteMapReport report;
    OP_REQUIRES_OK(ctx, ToStatus(map.Count(GpuStream(ctx), &scratch, g, builder_, coords.flat<int32_t>().data(), n,
                                           &report),
                                 scratch, "SiteKernelMap"));
    if (gpu::Failed(report.range)) {
      const int64_t e = static_cast<int64_t>(report.range.first);
      const int column = static_cast<int>(e % width);
      const int64_t limit = column == 0 ? g.batch : g.in_shape[column - 1];
      OP_REQUIRES_OK(ctx, CoordOutOfRangeError(e / width, column, report.range.detail[0], limit));
    }
    if (gpu::Failed(report.duplicate)) {
      const uint64_t pair = report.duplicate.first;
      OP_REQUIRES_OK(ctx, DuplicateSiteError(static_cast<int64_t>(pair & 0xffffffffull),
                                             static_cast<int64_t>(pair >> 32)));
    }
    OP_REQUIRES(ctx, !gpu::Failed(report.table_full),
                errors::Internal("SiteKernelMap on GPU: a hash table filled up (its capacity bound is wrong); "
                                 "use builder='sort' or the CPU"));

    Tensor *out_coords, *out_shape, *in_rows, *out_rows, *splits;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({report.out_sites, width}), &out_coords));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({g.d}), &out_shape));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({report.pairs}), &in_rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({report.pairs}), &out_rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({g.volume + 1}), &splits));
    for (int j = 0; j < g.d; ++j) out_shape->flat<int32_t>()(j) = static_cast<int32_t>(g.out_shape[j]);
    for (int64_t q = 0; q <= g.volume; ++q) splits->flat<int32_t>()(q) = report.offset_splits[q];
    OP_REQUIRES_OK(ctx, ToStatus(map.Write(GpuStream(ctx), &scratch, out_coords->flat<int32_t>().data(),
                                           in_rows->flat<int32_t>().data(), out_rows->flat<int32_t>().data()),
                                 scratch, "SiteKernelMap"));
  }

 private:
  SiteMapAttrs attrs_;
  gpu::SiteMapBuilder builder_ = gpu::SiteMapBuilder::kHash;
};

REGISTER_KERNEL_BUILDER(Name("SiteKernelMap")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("spatial_shape")
                            .HostMemory("batch_size")
                            .HostMemory("out_spatial_shape")
                            .HostMemory("offset_splits"),
                        SiteKernelMapGpuOp);

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA
