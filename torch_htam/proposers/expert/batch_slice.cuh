// ---- torch_htam expert: the batch sizes a ranged conv plans (conv.py pastes it; runtime.py mirrors it) --
// A conv whose batch is a served range runs a batch of n as slices of sizes 2^k and 3 * 2^k, the
// largest first: 63 = 48 + 12 + 3, 37 = 32 + 4 + 1, at most 2 log2(n) of them. So a range up to 64
// plans 12 cuDNN entries per shape, where one entry per batch size planned up to 64: cuDNN's
// runtime-fusion engines compile a kernel per plan, 37-57 ms each for ResNet-50's convs (H100, bf16),
// which put 0.6-1 s on the first request of every new batch size. Fewer, bigger slices than powers
// of two alone (63 = 32 + 16 + 8 + 4 + 2 + 1): each slice is a launch, and a small one runs the
// tensor cores below their rate. runtime.planned_sizes lists the same sizes to plan them at load.
#include <cstdint>

// The largest slice size (2^k or 3 * 2^k) that is at most n; n >= 1.
static inline int64_t batch_slice(int64_t n) {
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p >= 2 && p + p / 2 <= n ? p + p / 2 : p;
}
