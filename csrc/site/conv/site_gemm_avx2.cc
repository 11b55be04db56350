// AVX2 + FMA products of the CPU site convolution (site_gemm_cpu.h). setup.py compiles
// the sources ending in _avx2.cc with -mavx2 -mfma; the callers check the CPU (CpuProducts).
// Everything here has internal linkage and nothing comes from a header but intrinsics:
// the linker keeps one copy of an inline function shared between translation units, and
// an AVX2 copy of, say, a standard-library template would then run on CPUs without AVX2.
#include <immintrin.h>

#include <cstdint>

#include "site/conv/site_gemm_cpu.h"

namespace tf_sparseconv {
namespace {

constexpr int kTileRows = 4;  // rows of a register tile; 16 columns = two 8-float vectors

// Forward: row i of the product is in_rows[i] (length cin) times w; it lands on out_rows[i].
struct ForwardOperands {
  const float* const* in_rows;
  const float* w;
  float* const* out_rows;
  int64_t cout;
  float A(int64_t i, int64_t k) const { return in_rows[i][k]; }
  const float* B(int64_t k, int64_t col) const { return w + k * cout + col; }
  float* C(int64_t i, int64_t col) const { return out_rows[i] + col; }
};

// Filter gradient: row i of dw (input channel i) sums x_rows[k][i] * g_rows[k] over pairs k.
struct FilterGradOperands {
  const float* const* x_rows;
  const float* const* g_rows;
  float* dw;
  int64_t cout;
  float A(int64_t i, int64_t k) const { return x_rows[k][i]; }
  const float* B(int64_t k, int64_t col) const { return g_rows[k] + col; }
  float* C(int64_t i, int64_t col) const { return dw + i * cout + col; }
};

// Rows i0 .. i0 + R, columns col .. col + 8 V (the last vector masked if kMasked):
// C += sum over k < depth of A(i, k) * B(k).
template <int R, int V, bool kMasked, typename Operands>
void Tile(const Operands& op, int64_t i0, int64_t col, int64_t depth, __m256i mask) {
  __m256 acc[R][V];
  for (int i = 0; i < R; ++i) {
    for (int v = 0; v < V; ++v) acc[i][v] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < depth; ++k) {
    const float* b_row = op.B(k, col);
    __m256 b[V];
    for (int v = 0; v < V; ++v) {
      b[v] = kMasked && v == V - 1 ? _mm256_maskload_ps(b_row + 8 * v, mask) : _mm256_loadu_ps(b_row + 8 * v);
    }
    for (int i = 0; i < R; ++i) {
      const __m256 a = _mm256_set1_ps(op.A(i0 + i, k));
      for (int v = 0; v < V; ++v) acc[i][v] = _mm256_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
  for (int i = 0; i < R; ++i) {
    float* c = op.C(i0 + i, col);
    for (int v = 0; v < V; ++v) {
      if (kMasked && v == V - 1) {
        _mm256_maskstore_ps(c + 8 * v, mask, _mm256_add_ps(_mm256_maskload_ps(c + 8 * v, mask), acc[i][v]));
      } else {
        _mm256_storeu_ps(c + 8 * v, _mm256_add_ps(_mm256_loadu_ps(c + 8 * v), acc[i][v]));
      }
    }
  }
}

template <int V, bool kMasked, typename Operands>
void RowsOfPanel(const Operands& op, int64_t m, int64_t col, int64_t depth, __m256i mask) {
  int64_t i = 0;
  for (; i + kTileRows <= m; i += kTileRows) Tile<kTileRows, V, kMasked>(op, i, col, depth, mask);
  switch (m - i) {
    case 3:
      Tile<3, V, kMasked>(op, i, col, depth, mask);
      break;
    case 2:
      Tile<2, V, kMasked>(op, i, col, depth, mask);
      break;
    case 1:
      Tile<1, V, kMasked>(op, i, col, depth, mask);
      break;
    default:
      break;
  }
}

// C[m, n] += A[m, depth] B[depth, n]: 16-column panels (B's panel stays in L1 while the
// rows pass), then an 8-column one, then the last < 8 columns masked.
template <typename Operands>
void Product(const Operands& op, int64_t m, int64_t n, int64_t depth) {
  const __m256i all = _mm256_set1_epi32(-1);
  int64_t col = 0;
  for (; col + 16 <= n; col += 16) RowsOfPanel<2, false>(op, m, col, depth, all);
  if (col + 8 <= n) {
    RowsOfPanel<1, false>(op, m, col, depth, all);
    col += 8;
  }
  if (col < n) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - col)), lanes);
    RowsOfPanel<1, true>(op, m, col, depth, mask);
  }
}

}  // namespace

void GatherGemmScatterAvx2(int64_t rows, int64_t cin, int64_t cout, const float* const* in_rows, const float* w,
                           float* const* out_rows) {
  Product(ForwardOperands{in_rows, w, out_rows, cout}, rows, cout, cin);
}

void OuterProductSumAvx2(int64_t rows, int64_t cin, int64_t cout, const float* const* x_rows,
                         const float* const* g_rows, float* dw) {
  Product(FilterGradOperands{x_rows, g_rows, dw, cout}, cin, cout, rows);
}

}  // namespace tf_sparseconv
