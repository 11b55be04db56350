// Element-wise passes over [rows, c] arrays that take kV adjacent elements of one row per
// thread in one load and one store (kV = 4, 2 or 1, at most 16 bytes): the row passes of
// the batch norm (site/batch_norm/row_batch_norm.cu) and the convolution's epilogue after
// its pair tiles (site_conv.cu). The vector width changes no result, only the accesses.
#ifndef TF_SPARSECONV_SITE_CONV_SITE_VECTOR_CUH_
#define TF_SPARSECONV_SITE_CONV_SITE_VECTOR_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "site/conv/site_half.cuh"

namespace tf_sparseconv {
namespace gpu {

// An unsigned type of `bytes` bytes, for one load or store of several elements.
template <int kBytes>
struct Raw;
template <>
struct Raw<2> {
  using type = uint16_t;
};
template <>
struct Raw<4> {
  using type = uint32_t;
};
template <>
struct Raw<8> {
  using type = uint2;
};
template <>
struct Raw<16> {
  using type = uint4;
};

// kV consecutive elements in one load (p aligned to kV elements), widened to the
// accumulator type A (ToAcc).
template <int kV, typename T, typename A>
__device__ inline void LoadVec(const T* p, A* out) {
  using R = typename Raw<static_cast<int>(sizeof(T)) * kV>::type;
  const R raw = *reinterpret_cast<const R*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < kV; ++k) out[k] = ToAcc(e[k]);
}

// kV consecutive accumulators rounded to T and stored in one store (p aligned to kV
// elements).
template <int kV, typename T, typename A>
__device__ inline void StoreVec(T* p, const A* v) {
  using R = typename Raw<static_cast<int>(sizeof(T)) * kV>::type;
  R raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int k = 0; k < kV; ++k) e[k] = FromAcc<T>::Convert(v[k]);
  *reinterpret_cast<R*>(p) = raw;
}

// The first column of vector v of kV adjacent elements in rows of row_vectors vectors; with
// narrow (at most 2^32 vectors) in 32-bit remainders, far cheaper than 64-bit ones.
template <int kV>
__device__ inline int64_t FirstColumn(int64_t v, int64_t row_vectors, bool narrow) {
  return kV * (narrow ? static_cast<int64_t>(static_cast<uint32_t>(v) % static_cast<uint32_t>(row_vectors))
                      : v % row_vectors);
}

// The most elements of T in one access: 4, or as many as 16 bytes hold (a double: 2).
template <typename T>
constexpr int kWidestVector = sizeof(T) * 4 <= 16 ? 4 : static_cast<int>(16 / sizeof(T));

// The widest of 4, 2 and 1 elements of T per access (at most kWidestVector<T>) that c and
// every pointer allow.
template <typename T>
int VectorWidth(int64_t c, std::initializer_list<const void*> pointers) {
  for (int v : {4, 2}) {
    bool fits = c % v == 0 && v <= kWidestVector<T>;
    for (const void* p : pointers) {
      fits = fits && (p == nullptr || reinterpret_cast<uintptr_t>(p) % (sizeof(T) * v) == 0);
    }
    if (fits) return v;
  }
  return 1;
}

// Calls launch(std::integral_constant<int, w>()) for the vector width w (4, 2 or 1) that
// VectorWidth<T> chose, so that one launch statement serves each kernel's widths; widths
// beyond kWidestVector<T> are never instantiated.
template <typename T, typename Launch>
void WithVectorWidth(int width, const Launch& launch) {
  switch (width) {
    case 4:
      if constexpr (kWidestVector<T> >= 4) launch(std::integral_constant<int, 4>());
      break;
    case 2:
      launch(std::integral_constant<int, 2>());
      break;
    default:
      launch(std::integral_constant<int, 1>());
  }
}

}  // namespace gpu
}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_SITE_CONV_SITE_VECTOR_CUH_
