// The device parameter of the OpKernel templates (Op<Device, T>, as TensorFlow's own kernels
// are written): each op's checks and allocation are written once, in one class template
// registered for DEVICE_CPU with CPUDevice and, in builds with -DGOOGLE_CUDA=1 (the
// *_kernels_gpu.cc units), for DEVICE_GPU with GPUDevice; what differs per device is the
// functor, specialised on the same tag. Declared only: the tags select, nothing is built
// from them, so this header needs neither Eigen's thread pool nor CUDA.
#ifndef TF_SPARSECONV_COMMON_DEVICE_H_
#define TF_SPARSECONV_COMMON_DEVICE_H_

namespace Eigen {
struct ThreadPoolDevice;
struct GpuDevice;
}  // namespace Eigen

namespace tf_sparseconv {

using CPUDevice = Eigen::ThreadPoolDevice;
using GPUDevice = Eigen::GpuDevice;

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_COMMON_DEVICE_H_
