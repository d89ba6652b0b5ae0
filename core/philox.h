/* Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11), shared by the
 * CPU and CUDA kernels so that a (seed, offset) gives the same bits on every device.
 * Element e of a random op at offset o: uniform uses counter o/4 + e/4, lane e%4;
 * normal uses counter o/4 + e/2, lanes 2(e%2) and 2(e%2)+1 (Box-Muller). An op
 * advances the generator by rm_philox_advance(numel), whatever its kind. */
#ifndef REMAT_PHILOX_H
#define REMAT_PHILOX_H

#include <stdint.h>
#include <math.h>

#ifdef __CUDACC__
#define RM_HD __host__ __device__ static inline
#else
#define RM_HD static inline
#endif

RM_HD void rm_philox(uint64_t counter, uint64_t key, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* How far a random op of n elements advances the generator's offset (in 32-bit words):
 * a normal draw takes 2 words per element and a uniform one 1; every op advances by
 * the larger, 2n, so that both kinds leave the same state, rounded up to a whole
 * counter (4 words), so that the next op starts on a fresh counter and shares no word
 * with this one. */
RM_HD uint64_t rm_philox_advance(int64_t n) { return (uint64_t)((2 * n + 3) / 4) * 4; }

/* Uniform in (0, 1]. */
RM_HD double rm_rand_uniform(uint64_t seed, uint64_t offset, int64_t e) {
  uint32_t r[4];
  rm_philox(offset / 4 + (uint64_t)e / 4, seed, r);
  return ((double)r[e % 4] + 1.0) * (1.0 / 4294967296.0);
}

RM_HD double rm_rand_normal(uint64_t seed, uint64_t offset, int64_t e) {
  uint32_t r[4];
  rm_philox(offset / 4 + (uint64_t)e / 2, seed, r);
  int l = (int)(e % 2) * 2;
  double u1 = ((double)r[l] + 1.0) * (1.0 / 4294967296.0);
  double u2 = (double)r[l + 1] * (1.0 / 4294967296.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
