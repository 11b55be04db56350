// AVX-512 products of the CPU site convolution (site_gemm_cpu.h): site_gemm_avx2.cc's
// register tiles with 16-float vectors and native masks. setup.py compiles the sources
// ending in _avx512.cc with -mavx512f; the callers check the CPU (CpuProducts). Each output
// element sums its terms in the same order with the same fused multiply-adds as the AVX2
// tiles, so the two give the same bits.
// Everything here has internal linkage and nothing comes from a header but intrinsics:
// the linker keeps one copy of an inline function shared between translation units, and
// an AVX2 copy of, say, a standard-library template would then run on CPUs without AVX2.
#include <immintrin.h>

#include <cstdint>

#include "site/conv/site_gemm_cpu.h"

namespace tf_sparseconv {
namespace {

constexpr int kTileRows = 6;  // rows of a register tile; 32 columns = two 16-float vectors (12 accumulators)

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

// Rows i0 .. i0 + R, columns col .. col + 16 V (the last vector masked if kMasked):
// C += sum over k < depth of A(i, k) * B(k).
template <int R, int V, bool kMasked, typename Operands>
void Tile(const Operands& op, int64_t i0, int64_t col, int64_t depth, __mmask16 mask) {
  __m512 acc[R][V];
  for (int i = 0; i < R; ++i) {
    for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < depth; ++k) {
    const float* b_row = op.B(k, col);
    __m512 b[V];
    for (int v = 0; v < V; ++v) {
      b[v] = kMasked && v == V - 1 ? _mm512_maskz_loadu_ps(mask, b_row + 16 * v) : _mm512_loadu_ps(b_row + 16 * v);
    }
    for (int i = 0; i < R; ++i) {
      const __m512 a = _mm512_set1_ps(op.A(i0 + i, k));
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
  for (int i = 0; i < R; ++i) {
    float* c = op.C(i0 + i, col);
    for (int v = 0; v < V; ++v) {
      if (kMasked && v == V - 1) {
        _mm512_mask_storeu_ps(c + 16 * v, mask, _mm512_add_ps(_mm512_maskz_loadu_ps(mask, c + 16 * v), acc[i][v]));
      } else {
        _mm512_storeu_ps(c + 16 * v, _mm512_add_ps(_mm512_loadu_ps(c + 16 * v), acc[i][v]));
      }
    }
  }
}

template <int V, bool kMasked, typename Operands>
void RowsOfPanel(const Operands& op, int64_t m, int64_t col, int64_t depth, __mmask16 mask) {
  int64_t i = 0;
  for (; i + kTileRows <= m; i += kTileRows) Tile<kTileRows, V, kMasked>(op, i, col, depth, mask);
  switch (m - i) {
    case 5:
      Tile<5, V, kMasked>(op, i, col, depth, mask);
      break;
    case 4:
      Tile<4, V, kMasked>(op, i, col, depth, mask);
      break;
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

// C[m, n] += A[m, depth] B[depth, n]: 32-column panels (B's panel stays in L1 while the
// rows pass), then a 16-column one, then the last < 16 columns masked.
template <typename Operands>
void Product(const Operands& op, int64_t m, int64_t n, int64_t depth) {
  const __mmask16 all = 0xffff;
  int64_t col = 0;
  for (; col + 32 <= n; col += 32) RowsOfPanel<2, false>(op, m, col, depth, all);
  if (col + 16 <= n) {
    RowsOfPanel<1, false>(op, m, col, depth, all);
    col += 16;
  }
  if (col < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - col)) - 1u);
    RowsOfPanel<1, true>(op, m, col, depth, mask);
  }
}

}  // namespace

void GatherGemmScatterAvx512(int64_t rows, int64_t cin, int64_t cout, const float* const* in_rows, const float* w,
                           float* const* out_rows) {
  Product(ForwardOperands{in_rows, w, out_rows, cout}, rows, cout, cin);
}

void OuterProductSumAvx512(int64_t rows, int64_t cin, int64_t cout, const float* const* x_rows,
                         const float* const* g_rows, float* dw) {
  Product(FilterGradOperands{x_rows, g_rows, dw, cout}, cin, cout, rows);
}

}  // namespace tf_sparseconv
