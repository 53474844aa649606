// ---- torch_htam expert: the batch sizes a ranged conv plans (conv.py pastes it; runtime.py mirrors it) --
// A conv whose batch is a served range runs a batch of n as slices of sizes 2^k and 3 * 2^k, the
// largest first: 63 = 48 + 12 + 3, 37 = 32 + 4 + 1, at most 2 log2(n) of them. So a range up to 64
// plans 12 cuDNN entries per shape, where one entry per batch size planned up to 64: cuDNN's
// runtime-fusion engines compile a kernel per plan, and ResNet-50's costliest convs paid 348-454 ms
// (median) on the first call of each new batch size, against 0.06-0.08 ms sliced once
// runtime.preplan has planned the 12 sizes (0.68-0.97 s per kernel, at load): bench/slice_plans.py,
// H100, bf16. The price: a batch of several slices is several launches, measured up to 1.2-1.9x the
// one-plan kernel at 37 and 63 there (a noisy run: 0.041 against 0.055 ms at 32, one slice either
// way); per-bucket timing drops a bucket where that loses to Inductor. Slices of 2^k and 3 * 2^k
// rather than powers of two alone (63 = 32 + 16 + 8 + 4 + 2 + 1): fewer, bigger launches.
#include <cstdint>

// The largest slice size (2^k or 3 * 2^k) that is at most n; n >= 1.
static inline int64_t batch_slice(int64_t n) {
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p >= 2 && p + p / 2 <= n ? p + p / 2 : p;
}
