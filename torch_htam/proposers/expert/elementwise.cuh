// ---- elementwise: the flat kernel (elementwise.py) ----
// The flat kernel's body: one thread computes VEC consecutive elements per vector, UNROLL vectors
// per loop trip (a grid apart), nvec vectors in all. Space entries: the accesses, the coordinates,
// then the outputs stored through strides. R, emitted per region, holds the kernel's pointers and
// references to one trip's arrays (per access x<i>[UNROLL][VEC], per output y<k>, per coordinate
// k<c>, the strided outputs' element offsets so[UNROLL][*]) and has
//   load(sp, u, off)      vector u's reads; off[a]: the vector's first element along entry a
//   compute(u, e)         element e of vector u: the outputs y from the reads x
//   store(sp, u, lin)     vector u's outputs; lin: its first element in the contiguous outputs
// NOTE: the kernel (emitted per region) declares every array of the trip, these three included:
// declared here, or as members of one struct, they are promoted to registers in another order,
// and ptxas allocates and schedules differently.
template <int VEC, int UNROLL, int N, class IDX, class R>
__device__ __forceinline__ void ew_flat(const Space<N>& sp, IDX nvec, IDX (&lin)[UNROLL], bool (&ok)[UNROLL],
                                        IDX (&off)[N], const R& r) {
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX g0 = (IDX)blockIdx.x * blockDim.x + threadIdx.x; g0 < nvec; g0 += step * UNROLL) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const IDX g = g0 + (IDX)u * step;
      ok[u] = g < nvec;
      lin[u] = (ok[u] ? g : (IDX)0) * VEC;   // out-of-range lanes read element 0 and store nothing
      if (sp.ndim == 1) {
#pragma unroll
        for (int a = 0; a < N; ++a) off[a] = lin[u] * (IDX)sp.st[a][0];
      } else {
        IDX rem = lin[u];
#pragma unroll
        for (int a = 0; a < N; ++a) off[a] = 0;
        for (int d = sp.ndim - 1; d > 0; --d) {
          const IDX sz = (IDX)sp.size[d], i = rem % sz;
          rem /= sz;
#pragma unroll
          for (int a = 0; a < N; ++a) off[a] += i * (IDX)sp.st[a][d];
        }
#pragma unroll
        for (int a = 0; a < N; ++a) off[a] += rem * (IDX)sp.st[a][0];
      }
      r.load(sp, u, off);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) r.compute(u, e);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (!ok[u]) continue;
      r.store(sp, u, lin[u]);
    }
  }
}

// Host: blocks of BLOCK threads, each UNROLL vectors of v elements a trip, for n elements; WAVES > 0
// caps the grid at WAVES blocks per SM (the grid-stride loop covers the rest).
template <int BLOCK, int UNROLL, int WAVES>
static inline int64_t ew_blocks(int64_t n, int v) {
  const int64_t per_block = (int64_t)BLOCK * UNROLL * v;
  int64_t blocks = (n + per_block - 1) / per_block;
  if (WAVES > 0) blocks = std::min<int64_t>(blocks, (int64_t)htam_sm_count() * WAVES);
  return std::max<int64_t>(1, std::min<int64_t>(blocks, (int64_t)1 << 30));
}

// ---- end elementwise ----
