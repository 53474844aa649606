// ---- row kernels' host launch (rowwise.py; pasted after row_kernel) ----
// The row held in registers (regs: NV chunks of V values a thread, NVS of one value on the scalar
// path) or streamed, with vector accesses where the row length and the pointers allow them (vec_ok):
// four instantiations, one launched per call. a: row_kernel's arguments.
template <int V, int NV, int NVS, class... A>
static void row_launch(bool regs, bool vec_ok, int64_t blocks, cudaStream_t stream, A... a) {
  if (regs && vec_ok) row_kernel<V, NV><<<blocks, BLOCK, 0, stream>>>(a...);
  else if (regs) row_kernel<1, NVS><<<blocks, BLOCK, 0, stream>>>(a...);
  else if (vec_ok) row_kernel<V, 0><<<blocks, BLOCK, 0, stream>>>(a...);
  else row_kernel<1, 0><<<blocks, BLOCK, 0, stream>>>(a...);
}
