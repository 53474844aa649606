// ---- elementwise: the tiled kernel's dims (elementwise.py) ----
// w: the last dim where output 0 (entry out0) steps by one; r: a dim other than w where a
// stageable access (bit a of `stageable`) steps by one and along w neither by one nor by zero (a
// read broadcast along w is one address per warp). staged: those accesses.
// false: no such pair, the flat kernel runs.
template <int N>
static inline bool htam_tile_dims(const Space<N>& s, int out0, unsigned stageable, int nacc, int* r,
                                  int* w, unsigned* staged) {
  *w = -1; *r = -1; *staged = 0;
  for (int d = s.ndim - 1; d >= 0 && *w < 0; --d) if (s.size[d] > 1 && s.st[out0][d] == 1) *w = d;
  if (*w < 0) return false;
  for (int a = 0; a < nacc; ++a) {
    if (!(stageable >> a & 1u) || s.st[a][*w] == 1 || s.st[a][*w] == 0) continue;
    for (int d = s.ndim - 1; d >= 0; --d) {
      if (d == *w || s.size[d] <= 1 || s.st[a][d] != 1) continue;
      if (*r < 0) *r = d;
      if (d == *r) *staged |= 1u << a;
      break;
    }
  }
  return *r >= 0;
}
