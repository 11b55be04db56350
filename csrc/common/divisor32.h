// Exact n / d and n % d for 32-bit n and d >= 1 by two multiplications (Lemire, Kaser and
// Kurz, "Faster remainder by direct computation", 2019), for the CPU kernels that decode
// keys: a 64-bit division per coordinate part had been 8 % of a CPU training step.
#ifndef TF_SPARSECONV_COMMON_DIVISOR32_H_
#define TF_SPARSECONV_COMMON_DIVISOR32_H_

#include <cstdint>

#include "common/key_layout.h"

namespace tf_sparseconv {

// The largest divisor and dividend Divisor32 takes.
constexpr int64_t kMaxDivisor32 = 0xffffffffLL;

// m = floor((2^64 - 1) / d) + 1; d = 1 has no such m (it wraps to 0) and is taken apart.
struct Divisor32 {
  uint64_t m = 0;
  uint32_t d = 1;
  Divisor32() = default;
  explicit Divisor32(uint32_t divisor) : m(divisor > 1 ? ~uint64_t{0} / divisor + 1 : 0), d(divisor) {}
  uint32_t Div(uint32_t n) const {
    return d == 1 ? n : static_cast<uint32_t>((static_cast<unsigned __int128>(m) * n) >> 64);
  }
  uint32_t Mod(uint32_t n) const {
    return d == 1 ? 0 : static_cast<uint32_t>((static_cast<unsigned __int128>(m * n) * d) >> 64);
  }
};

// A layout's spatial decode by multiplications: Coord(lin, j) = (lin / stride[j]) % extent[j],
// DecodeSpatial's coordinate j, for a spatial index lin of a layout whose spatial_size is at
// most kMaxDivisor32.
struct SpatialDivisors {
  Divisor32 stride[kMaxSpatialDims], extent[kMaxSpatialDims];
  explicit SpatialDivisors(const KeyLayout& L) {
    for (int j = 0; j < L.d; ++j) {
      stride[j] = Divisor32(static_cast<uint32_t>(L.stride[j]));
      extent[j] = Divisor32(static_cast<uint32_t>(L.extent[j]));
    }
  }
  uint32_t Coord(uint32_t lin, int j) const { return extent[j].Mod(stride[j].Div(lin)); }
};

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_COMMON_DIVISOR32_H_
