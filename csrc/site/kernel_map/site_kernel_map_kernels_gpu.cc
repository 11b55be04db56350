// SiteKernelMap on the GPU (site_kernel_map.cu and its two builders), as an asynchronous
// OpKernel: ComputeAsync queues the site checks, the map's search and the copy of its
// report (the check results and the pair count of every offset) into pinned host memory,
// and returns without waiting. TensorFlow's EventMgr runs the rest once the stream has
// passed the copy: the failed checks as the CPU kernel's messages, or the outputs
// allocated at their sizes and the map written into them. No thread blocks meanwhile, so
// the ops that do not need this map (the convolutions of the level before it, another
// map) are queued while the GPU works. out_spatial_shape and offset_splits are produced
// in host memory: the convolution reads offset_splits on the host, so a cached map costs
// the layers that use it no copies.
#if GOOGLE_CUDA

#include <cstdint>
#include <memory>
#include <utility>

#include "common/gpu_kernel_util.h"
#include "common/guarded_op_kernel.h"
#include "common/host_syncs.h"
#include "site/kernel_map/site_geometry.h"
#include "site/kernel_map/site_kernel_map_checks.h"
#include "site/kernel_map/site_kernel_map_gpu.h"
#include "site/kernel_map/site_kernel_map_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "xla/stream_executor/activate_context.h"
#include "xla/stream_executor/stream_executor.h"

namespace tf_sparseconv {

namespace errors = ::tensorflow::errors;

namespace {

// One call's state, from ComputeAsync to the callback: the temporary memory (held until
// the Write kernels are queued) and the map.
class SiteKernelMapCall : GpuOpContext {
 public:
  SiteKernelMapCall(tensorflow::OpKernelContext* ctx, const SiteMapAttrs& attrs, const SiteGeometry& g)
      : GpuOpContext(ctx, "SiteKernelMap"),
        g_(g),
        builder_(attrs.builder == "sort" ? gpu::SiteMapBuilder::kSort : gpu::SiteMapBuilder::kHash) {}

  // Queues the checks, the search and the report's copy; does not wait.
  absl::Status Queue(const int32_t* coords, int64_t n) {
    int64_t candidates = 0;
    if (__builtin_mul_overflow(g_.volume, n, &candidates)) {
      return errors::ResourceExhausted("SiteKernelMap on GPU: sites times kernel offsets overflows");
    }
    TF_RETURN_IF_ERROR(CheckSortable(candidates, op_, "(site, kernel offset) candidates"));
    return ToStatus(map_.Count(stream_, &scratch_, g_, builder_, coords, n));
  }

  // Once the stream has passed the report's copy: the checks' errors, or the counts.
  absl::Status Read(SiteMapCounts* counts) {
    gpu::SiteMapReport report;
    map_.ReadReport(&report);
    const int width = g_.d + 1;
    if (gpu::Failed(report.range)) {
      const int64_t e = static_cast<int64_t>(report.range.first);
      const int column = static_cast<int>(e % width);
      const int64_t limit = column == 0 ? g_.batch : g_.in_shape[column - 1];
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
    counts->offset_splits = std::move(report.offset_splits);
    return absl::OkStatus();
  }

  absl::Status Write(const SiteMapOutputs& out) {
    return ToStatus(map_.Write(stream_, &scratch_, out.out_coords, out.in_rows, out.out_rows));
  }

  const SiteGeometry& geometry() const { return g_; }

 private:
  const SiteGeometry g_;
  const gpu::SiteMapBuilder builder_;
  gpu::SiteKernelMapGpu map_;
};

}  // namespace

class SiteKernelMapGpuOp : public tensorflow::AsyncOpKernel {
 public:
  explicit SiteKernelMapGpuOp(tensorflow::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    // Refused attributes are reported by the call, as GuardedOpKernel does (guarded_op_kernel.h).
    attrs_status_ = attrs_.Parse(ctx);
  }

  void ComputeAsync(tensorflow::OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_OK_ASYNC(ctx, attrs_status_, done);
    SiteGeometry g;
    OP_REQUIRES_OK_ASYNC(ctx, MakeSiteGeometry(attrs_, ctx->input(1), ctx->input(2), &g), done);
    const tensorflow::Tensor& coords = ctx->input(0);
    OP_REQUIRES_OK_ASYNC(ctx, CheckCoordsShape(coords, g.d), done);
    std::shared_ptr<SiteKernelMapCall> call;
    OP_REQUIRES_OK_ASYNC(ctx, RunGuarded(kOp, [&]() -> absl::Status {
                           call = std::make_shared<SiteKernelMapCall>(ctx, attrs_, g);
                           return call->Queue(coords.flat<int32_t>().data(), coords.dim_size(0));
                         }),
                         done);
    CountDeferredReadBack();
    ::stream_executor::Stream* stream = ctx->op_device_context()->stream();
    ctx->device()->tensorflow_accelerator_device_info()->event_mgr->ThenExecute(
        stream, [ctx, stream, call, done = std::move(done)]() mutable {
          // Kernels queued from this thread go to the stream's context.
          std::unique_ptr<::stream_executor::ActivateContext> activation = stream->parent()->Activate();
          const absl::Status status = RunGuarded(kOp, [&]() -> absl::Status {
            SiteMapCounts counts;
            TF_RETURN_IF_ERROR(call->Read(&counts));
            SiteMapOutputs out;
            TF_RETURN_IF_ERROR(AllocateSiteMapOutputs(ctx, call->geometry(), counts, &out));
            return call->Write(out);
          });
          if (!status.ok()) ctx->SetStatus(status);
          call.reset();  // the temporaries go back before the context does
          done();
        });
  }

 private:
  static constexpr const char* kOp = "site_kernel_map";
  SiteMapAttrs attrs_;
  absl::Status attrs_status_;
};

REGISTER_KERNEL_BUILDER(Name("TfSparseconv>SiteKernelMap")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("spatial_shape")
                            .HostMemory("batch_size")
                            .HostMemory("out_spatial_shape")
                            .HostMemory("offset_splits"),
                        SiteKernelMapGpuOp);

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA
