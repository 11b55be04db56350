// SiteKernelMap's GPU functor, over site_kernel_map.cu, and the GPU registration of its
// OpKernel (site_kernel_map_kernels.h): the site checks and the map on the device, read
// back in one round trip as the CPU kernel's messages for bad sites. out_spatial_shape and
// offset_splits are produced in host memory: both are known on the host after that round
// trip, and the convolution reads offset_splits on the host, so a cached map costs the
// layers that use it no copies.
#if GOOGLE_CUDA

#include <cstdint>

#include "common/gpu_kernel_util.h"
#include "site/kernel_map/site_geometry.h"
#include "site/kernel_map/site_kernel_map_checks.h"
#include "site/kernel_map/site_kernel_map_gpu.h"
#include "site/kernel_map/site_kernel_map_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_sparseconv {

namespace errors = ::tensorflow::errors;

template <>
class SiteKernelMapFunctor<GPUDevice> : GpuOpContext {
 public:
  SiteKernelMapFunctor(tensorflow::OpKernelContext* ctx, const SiteMapAttrs& attrs)
      : GpuOpContext(ctx, "SiteKernelMap"),
        builder_(attrs.builder == "sort" ? gpu::SiteMapBuilder::kSort : gpu::SiteMapBuilder::kHash) {}

  absl::Status Count(const SiteGeometry& g, const int32_t* coords, int64_t n, SiteMapCounts* counts) {
    int64_t candidates = 0;
    if (__builtin_mul_overflow(g.volume, n, &candidates)) {
      return errors::ResourceExhausted("SiteKernelMap on GPU: sites times kernel offsets overflows");
    }
    TF_RETURN_IF_ERROR(CheckSortable(candidates, op_, "(site, kernel offset) candidates"));
    gpu::SiteMapReport report;
    TF_RETURN_IF_ERROR(ToStatus(map_.Count(stream_, &scratch_, g, builder_, coords, n, &report)));
    const int width = g.d + 1;
    if (gpu::Failed(report.range)) {
      const int64_t e = static_cast<int64_t>(report.range.first);
      const int column = static_cast<int>(e % width);
      const int64_t limit = column == 0 ? g.batch : g.in_shape[column - 1];
      return CoordOutOfRangeError(e / width, column, report.range.detail[0], limit);
    }
    if (gpu::Failed(report.duplicate)) {
      const uint64_t pair = report.duplicate.first;
      return DuplicateSiteError(static_cast<int64_t>(pair & 0xffffffffull), static_cast<int64_t>(pair >> 32));
    }
    if (gpu::Failed(report.table_full)) {
      return errors::Internal("SiteKernelMap on GPU: a hash table filled up (its capacity bound is wrong); "
                              "use builder='sort' or the CPU");
    }
    counts->pairs = report.pairs;
    counts->out_sites = report.out_sites;
    counts->offset_splits = report.offset_splits;
    return absl::OkStatus();
  }

  absl::Status Write(int32_t* out_coords, int32_t* in_rows, int32_t* out_rows) {
    return ToStatus(map_.Write(stream_, &scratch_, out_coords, in_rows, out_rows));
  }

 private:
  const gpu::SiteMapBuilder builder_;
  gpu::SiteKernelMapGpu map_;
};

REGISTER_KERNEL_BUILDER(Name("TfSparseconv>SiteKernelMap")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("spatial_shape")
                            .HostMemory("batch_size")
                            .HostMemory("out_spatial_shape")
                            .HostMemory("offset_splits"),
                        SiteKernelMapOp<GPUDevice>);

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA
