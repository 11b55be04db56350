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

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "common/gpu_kernel_util.h"
#include "common/guarded_op_kernel.h"
#include "common/host_syncs.h"
#include "site/conv/site_conv.h"
#include "site/kernel_map/neighbour_table_cpu.h"
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

// The end of every asynchronous map op: counts its read-back and, once the stream has
// passed the work queued so far, runs finish(*call) in the stream's context (kernels it
// queues go there), makes its error the op's, and gives the call's temporaries back before
// the op's context goes. No thread waits meanwhile.
template <typename Call, typename Finish>
void FinishAfterStream(tensorflow::OpKernelContext* ctx, const char* op, std::shared_ptr<Call> call,
                       tensorflow::AsyncOpKernel::DoneCallback done, Finish finish) {
  CountDeferredReadBack();
  ::stream_executor::Stream* stream = ctx->op_device_context()->stream();
  ctx->device()->tensorflow_accelerator_device_info()->event_mgr->ThenExecute(
      stream, [ctx, stream, op, call = std::move(call), done = std::move(done), finish]() mutable {
        std::unique_ptr<::stream_executor::ActivateContext> activation = stream->parent()->Activate();
        const absl::Status status = RunGuarded(op, [&]() -> absl::Status { return finish(*call); });
        if (!status.ok()) ctx->SetStatus(status);
        call.reset();
        done();
      });
}

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

  // SiteSubmanifoldNeighbours: the checks, the search and the table; does not wait.
  absl::Status QueueTable(const int32_t* coords, int64_t n, int32_t* table) {
    TF_RETURN_IF_ERROR(CheckSortable(g_.volume * n, op_, "(site, kernel offset) candidates"));
    TF_RETURN_IF_ERROR(ToStatus(map_.Count(stream_, &scratch_, g_, builder_, coords, n, /*count_pairs=*/false)));
    return ToStatus(map_.WriteNeighbourTable(stream_, &scratch_, table));
  }

  // For a call that reads no report back: its pinned buffers stay until the stream passes them.
  void HoldPinned() { scratch_.HoldPinnedUntilQueuedWorkRuns(); }

  // Once the stream has passed the report's copy: the checks' errors, or the counts.
  absl::Status Read(SiteMapCounts* counts) {
    gpu::SiteMapReport report;
    TF_RETURN_IF_ERROR(ReadChecks(&report));
    counts->pairs = report.pairs;
    counts->out_sites = report.out_sites;
    counts->offset_splits = std::move(report.offset_splits);
    return absl::OkStatus();
  }

  // The same, the checks alone.
  absl::Status ReadChecks(gpu::SiteMapReport* out = nullptr) {
    gpu::SiteMapReport own;
    gpu::SiteMapReport& report = out != nullptr ? *out : own;
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
    OP_REQUIRES_OK_ASYNC(ctx, SiteCallGeometry(ctx, attrs_, &g), done);
    const tensorflow::Tensor& coords = ctx->input(0);
    std::shared_ptr<SiteKernelMapCall> call;
    OP_REQUIRES_OK_ASYNC(ctx, RunGuarded(kOp, [&]() -> absl::Status {
                           call = std::make_shared<SiteKernelMapCall>(ctx, attrs_, g);
                           return call->Queue(coords.flat<int32_t>().data(), coords.dim_size(0));
                         }),
                         done);
    FinishAfterStream(ctx, kOp, std::move(call), std::move(done), [ctx](SiteKernelMapCall& call) -> absl::Status {
      SiteMapCounts counts;
      TF_RETURN_IF_ERROR(call.Read(&counts));
      SiteMapOutputs out;
      TF_RETURN_IF_ERROR(AllocateSiteMapOutputs(ctx, call.geometry(), counts, &out));
      return call.Write(out);
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

// SiteSubmanifoldNeighbours on the GPU: its output's size is the sites', so it is
// allocated before anything runs. With sites_checked the op returns once its work is
// queued; otherwise the site checks come back as SiteKernelMap's do, in an EventMgr
// callback that no thread waits for.
class SiteSubmanifoldNeighboursGpuOp : public tensorflow::AsyncOpKernel {
 public:
  explicit SiteSubmanifoldNeighboursGpuOp(tensorflow::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    attrs_status_ = attrs_.ParseSubmanifold(ctx);
    if (attrs_status_.ok()) attrs_status_ = ctx->GetAttr("sites_checked", &sites_checked_);
  }

  void ComputeAsync(tensorflow::OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_OK_ASYNC(ctx, attrs_status_, done);
    SiteGeometry g;
    OP_REQUIRES_OK_ASYNC(ctx, SiteCallGeometry(ctx, attrs_, &g), done);
    const tensorflow::Tensor& coords = ctx->input(0);
    const int64_t n = coords.dim_size(0);
    tensorflow::Tensor* table = nullptr;
    OP_REQUIRES_OK_ASYNC(
        ctx, ctx->allocate_output(0, tensorflow::TensorShape({n, NeighbourTableWidth(g.volume)}), &table), done);
    std::shared_ptr<SiteKernelMapCall> call;
    const absl::Status queued = RunGuarded(kOp, [&]() -> absl::Status {
      call = std::make_shared<SiteKernelMapCall>(ctx, attrs_, g);
      return call->QueueTable(coords.flat<int32_t>().data(), n, table->flat<int32_t>().data());
    });
    if (!queued.ok()) {
      // The search may have queued its report's copy into pinned memory before the table's
      // allocations failed: those buffers stay until the stream has passed the copy.
      if (call != nullptr) call->HoldPinned();
      ctx->SetStatus(queued);
      done();
      return;
    }
    if (sites_checked_) {
      call->HoldPinned();
      call.reset();
      done();
      return;
    }
    FinishAfterStream(ctx, kOp, std::move(call), std::move(done),
                      [](SiteKernelMapCall& call) { return call.ReadChecks(); });
  }

 private:
  static constexpr const char* kOp = "site_submanifold_neighbours";
  SiteMapAttrs attrs_;
  bool sites_checked_ = false;
  absl::Status attrs_status_;
};

REGISTER_KERNEL_BUILDER(Name("TfSparseconv>SiteSubmanifoldNeighbours")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("spatial_shape")
                            .HostMemory("batch_size"),
                        SiteSubmanifoldNeighboursGpuOp);

namespace {

class SiteTablePairsCall : GpuOpContext {
 public:
  explicit SiteTablePairsCall(tensorflow::OpKernelContext* ctx) : GpuOpContext(ctx, "SiteTablePairs") {}

  absl::Status Queue(const int32_t* table, int64_t n, int64_t volume) {
    TF_RETURN_IF_ERROR(CheckSortable(volume * n, op_, "(site, kernel offset) entries"));
    n_ = n;
    volume_ = volume;
    return ToStatus(pairs_.Count(stream_, &scratch_, table, n, volume));
  }

  // Once the stream has passed the report's copy: the CPU's error for a bad entry, or the splits.
  absl::Status Read(gpu::TablePairsReport* report) {
    pairs_.ReadReport(report);
    if (gpu::Failed(report->range)) {
      const int64_t e = static_cast<int64_t>(report->range.first), width = volume_ + 2;
      return errors::InvalidArgument("neighbours[", e / width, ", ", e % width, "] = ", report->range.detail[0],
                                     " is outside [-1, ", n_, "): not a neighbour table of these ", n_, " sites");
    }
    return absl::OkStatus();
  }

  absl::Status Write(int32_t* in_rows, int32_t* out_rows) { return ToStatus(pairs_.Write(stream_, in_rows, out_rows)); }

 private:
  int64_t n_ = 0, volume_ = 0;
  gpu::TablePairsGpu pairs_;
};

}  // namespace

// SiteTablePairs on the GPU: the pair counts come back in an EventMgr callback, which
// allocates the outputs and queues their writing (offset_splits lives in host memory).
class SiteTablePairsGpuOp : public tensorflow::AsyncOpKernel {
 public:
  explicit SiteTablePairsGpuOp(tensorflow::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {}

  void ComputeAsync(tensorflow::OpKernelContext* ctx, DoneCallback done) override {
    const tensorflow::Tensor& table = ctx->input(0);
    int64_t volume = 0;
    OP_REQUIRES_OK_ASYNC(ctx, CheckPairsTable(table, nullptr, &volume), done);
    std::shared_ptr<SiteTablePairsCall> call;
    OP_REQUIRES_OK_ASYNC(ctx, RunGuarded(kOp, [&]() -> absl::Status {
                           call = std::make_shared<SiteTablePairsCall>(ctx);
                           return call->Queue(table.flat<int32_t>().data(), table.dim_size(0), volume);
                         }),
                         done);
    FinishAfterStream(ctx, kOp, std::move(call), std::move(done),
                      [ctx, volume](SiteTablePairsCall& call) -> absl::Status {
                        gpu::TablePairsReport report;
                        TF_RETURN_IF_ERROR(call.Read(&report));
                        tensorflow::Tensor *in_rows, *out_rows, *splits;
                        TF_RETURN_IF_ERROR(ctx->allocate_output(0, tensorflow::TensorShape({report.pairs}), &in_rows));
                        TF_RETURN_IF_ERROR(
                            ctx->allocate_output(1, tensorflow::TensorShape({report.pairs}), &out_rows));
                        TF_RETURN_IF_ERROR(ctx->allocate_output(2, tensorflow::TensorShape({volume + 1}), &splits));
                        std::copy(report.offset_splits.begin(), report.offset_splits.end(),
                                  splits->flat<int32_t>().data());
                        return call.Write(in_rows->flat<int32_t>().data(), out_rows->flat<int32_t>().data());
                      });
  }

 private:
  static constexpr const char* kOp = "site_table_pairs";
};

REGISTER_KERNEL_BUILDER(Name("TfSparseconv>SiteTablePairs").Device(::tensorflow::DEVICE_GPU).HostMemory("offset_splits"),
                        SiteTablePairsGpuOp);

}  // namespace tf_sparseconv

#endif  // GOOGLE_CUDA
