"""Host-side C++ snippets shared by the generated kernels: argument checks and access binding.

Everything the kernel assumes is checked here at run time and answered with HTAM_ERR_SHAPE (the
runtime then runs the original PyTorch region): counts, dtypes, ranks, broadcast-compatible sizes,
contiguity where an access needs it, 16-byte alignment before any vector path.

    >>> print(prologue(prog))     # C++ lines for the top of htam_run
"""
from __future__ import annotations

from torch_htam.proposers.expert.cuda import DT, cuh
from torch_htam.proposers.expert.ir import ExprProgram


# channel_vec and extend_inputs in C++: no params in them (pasted once per source that uses them)
EPILOGUE_INPUTS = cuh("epilogue_inputs.cuh")


def extend_inputs(n_ext: int, bn: tuple[str, str] | None, indent: str = "  ", y: str = "Y") -> str:
    """C++ declaring ext[n_ext]: the task's inputs `in`, then the GEMM/conv result y and, with bn,
    the batch norm's (scale, center) channel vectors at those pointers, as the epilogue program
    reads them (EPILOGUE_INPUTS must be in the source). bn = ("Y.data", "Y.data"): bound for the
    program's checks, never read (pwconv.py folds batch norm in the kernel).

        >>> extend_inputs(9, ("scale", "shift"))
        '  HtamTensor ext[9];\n  extend_inputs(ext, in, n_in, Y, scale, shift, K);'
    """
    scale, center = bn if bn is not None else ("nullptr", "nullptr")
    lines = [f"HtamTensor ext[{n_ext}];",
             f"extend_inputs(ext, in, n_in, {y}, {scale}, {center}, {'K' if bn is not None else 0});"]
    return "\n".join(indent + ln for ln in lines)


def prologue(prog: ExprProgram) -> str:
    """Checks counts/dtypes, reads the iteration sizes into it[] / n (and rows / ncol for rows)."""
    lines = [f"  if (n_in != {len(prog.inputs)} || n_out != {len(prog.outputs)}) return HTAM_ERR_SHAPE;"]
    for i, (_, dt) in enumerate(prog.inputs):
        lines.append(f"  if (in[{i}].dtype != {DT[dt][1]} || in[{i}].data == nullptr) return HTAM_ERR_SHAPE;")
    for k, o in enumerate(prog.outputs):
        lines.append(f"  if (out[{k}].dtype != {DT[o.dtype][1]} || out[{k}].data == nullptr) return HTAM_ERR_SHAPE;")
    src, idx = prog.size_source[:2]
    # the size tensor's rank: a GroupNorm input's own, the merged output's, else the iteration's
    nd = prog.size_source[3] if src == "group" else len(prog.size_source[2]) if src == "split" else prog.ndim
    lines += [f"  const HtamTensor& szt = {'out' if src in ('out', 'split') else 'in'}[{idx}];",
              f"  if (szt.ndim != {nd}) return HTAM_ERR_SHAPE;",
              "  int64_t it[HTAM_MAX_DIMS];",
              "  int64_t n = 1;"]
    if src == "group":    # [N, C, *pixels] as (N, G, C / G, pixels)
        g = prog.size_source[2]
        lines.append(f"  if (szt.sizes[1] % {g} != 0) return HTAM_ERR_SHAPE;\n"
                     f"  it[0] = szt.sizes[0]; it[1] = {g}; it[2] = szt.sizes[1] / {g}; it[3] = 1;\n"
                     f"  for (int k = 2; k < {nd}; ++k) it[3] *= szt.sizes[k];\n"
                     f"  for (int d = 0; d < 4; ++d) n *= it[d];")
    elif src == "split":      # output dim j merges iteration dims g: the inner ones as captured
        _, _, groups, fine = prog.size_source
        for j, g in enumerate(groups):
            inner = 1
            for d in g[1:]:
                inner *= fine[d]
            lines.append(f"  if (szt.sizes[{j}] % {inner} != 0) return HTAM_ERR_SHAPE;\n"
                         f"  it[{g[0]}] = szt.sizes[{j}] / {inner};"
                         + "".join(f" it[{d}] = {fine[d]};" for d in g[1:]))
        lines.append(f"  for (int d = 0; d < {prog.ndim}; ++d) n *= it[d];")
    elif len(prog.size_source) == 2:
        lines.append(f"  for (int d = 0; d < {prog.ndim}; ++d) {{ it[d] = szt.sizes[d]; n *= it[d]; }}")
    else:   # the tensor's dim k is iteration dim dims[k] (a row program reduced over middle dims)
        dims = ", ".join(map(str, prog.size_source[2]))
        lines.append(f"  {{ static const int dm[] = {{{dims}}};\n"
                     f"    for (int k = 0; k < {prog.ndim}; ++k) {{ it[dm[k]] = szt.sizes[k]; n *= szt.sizes[k]; }} }}")
    return "\n".join(lines)


def bind_outputs(prog: ExprProgram) -> str:
    """Strides of the outputs stored through Output.dims, as Space entries after the accesses and
    the coordinates."""
    lines, base = [], len(prog.accesses) + len(prog.coords)
    for j, k in enumerate(prog.strided_outputs):
        dims = ", ".join(map(str, prog.outputs[k].dims))
        lines.append(f"  {{ static const int dm[] = {{{dims}}};\n"
                     f"    if (!htam_bind_dims(out[{k}], dm, {len(prog.outputs[k].dims)}, it, {prog.ndim}, "
                     f"sp.st[{base + j}])) return HTAM_ERR_SHAPE; }}")
    return "\n".join(lines)


def bind_accesses(prog: ExprProgram) -> str:
    """Fills sp (Space<NACC>) from it[] and each access; sets max_off."""
    D = prog.ndim
    lines = [f"  sp.ndim = {D};", f"  for (int d = 0; d < {D}; ++d) sp.size[d] = it[d];"]
    if any(a.starts for a in prog.accesses):    # element offsets of sliced accesses (access_ptr)
        lines.append(f"  int64_t aoff[{len(prog.accesses)}] = {{0}};")
    for i, a in enumerate(prog.accesses):
        t = f"in[{a.input}]"
        if a.view:     # the input seen reshaped (ir.Access.view)
            lines.append(f"  HtamTensor view{i} = {t};\n"
                         f"  {{ static const int64_t vs[] = {{{', '.join(map(str, a.view))}}};\n"
                         f"    if (!htam_reshape(view{i}, vs, {len(a.view)})) return HTAM_ERR_SHAPE; }}")
            t = f"view{i}"
        if a.window:
            wd, lo, hi, size = a.window
            lines.append(f"  {{ static const int dm[] = {{{', '.join(map(str, a.dims))}}};\n"
                         f"    static const int64_t s0[] = {{{', '.join(map(str, a.starts))}}}, s1[] = {{{', '.join(map(str, a.steps))}}};\n"
                         f"    if (!htam_bind_window({t}, dm, s0, s1, {len(a.dims)}, it, {D}, {wd}, {lo}, {hi}, {size}, "
                         f"sp.st[{i}], &aoff[{i}])) return HTAM_ERR_SHAPE; }}")
        elif a.starts:
            lines.append(f"  {{ static const int dm[] = {{{', '.join(map(str, a.dims))}}};\n"
                         f"    static const int64_t s0[] = {{{', '.join(map(str, a.starts))}}}, s1[] = {{{', '.join(map(str, a.steps))}}};\n"
                         f"    if (!htam_bind_slice({t}, dm, s0, s1, {len(a.dims)}, it, {D}, sp.st[{i}], &aoff[{i}])) return HTAM_ERR_SHAPE; }}")
        elif a.mode == "dims":
            dims = ", ".join(str(d) for d in a.dims) or "0"
            lines.append(f"  {{ static const int dm[] = {{{dims}}};\n"
                         f"    if (!htam_bind_dims({t}, dm, {len(a.dims)}, it, {D}, sp.st[{i}])) return HTAM_ERR_SHAPE; }}")
        elif a.mode == "span":
            lines.append(f"  if (!htam_bind_span(in[{a.input}], it, {D}, {a.dims[0]}, {a.dims[1]}, sp.st[{i}])) return HTAM_ERR_SHAPE;")
        else:
            suffix = "true" if a.mode == "suffix" else "false"
            lines.append(f"  if (!htam_bind_flat(in[{a.input}], it, {D}, {suffix}, sp.st[{i}])) return HTAM_ERR_SHAPE;")
    for c, d in enumerate(prog.coords):     # ("coord", d): a row stepping 1 along d (collapse keeps d)
        lines.append(f"  for (int d = 0; d < {D}; ++d) sp.st[{len(prog.accesses) + c}][d] = d == {d} ? 1 : 0;")
    lines.append(f"  const int64_t max_off = htam_max_off<NACC>(sp, {len(prog.accesses)});")
    return "\n".join(lines)


def access_ptr(prog: ExprProgram, i: int, const: bool = False) -> str:
    """The C++ pointer access i reads from: the input's data, past a sliced access' offset."""
    a = prog.accesses[i]
    t = f"{'const ' if const else ''}{DT[prog.inputs[a.input][1]][0]}::raw*"
    return f"({t})in[{a.input}].data" + (f" + aoff[{i}]" if a.starts else "")


def vector_checks(prog: ExprProgram, V: str, full_outputs_only: bool = False) -> str:
    """Clears vec_ok unless every access steps 0 or 1 along the last dim, every other stride is a
    multiple of V, and every pointer read or written with vectors is aligned to V elements."""
    lines = []
    for i, a in enumerate(prog.accesses):
        if a.window:      # read element by element, only inside its window (elementwise.py)
            continue
        size = DT[prog.inputs[a.input][1]][2]
        ptr = f"(const char*)in[{a.input}].data + aoff[{i}] * {size}" if a.starts else f"in[{a.input}].data"
        lines.append(
            f"  {{ const int64_t inner = sp.st[{i}][sp.ndim - 1];\n"
            f"    if (inner != 0 && (inner != 1 || !htam_aligned({ptr}, {V} * {size}))) vec_ok = false;\n"
            f"    if (inner == 1) for (int d = 0; d + 1 < sp.ndim; ++d) if (sp.st[{i}][d] % {V} != 0) vec_ok = false; }}")
    for j, k in enumerate(prog.strided_outputs):     # vector stores only where the row steps by 1
        i, size = len(prog.accesses) + j, DT[prog.outputs[k].dtype][2]
        lines.append(
            f"  {{ const int64_t inner = sp.st[{i}][sp.ndim - 1];\n"
            f"    if (inner == 1 && !htam_aligned(out[{k}].data, {V} * {size})) vec_ok = false;\n"
            f"    if (inner == 1) for (int d = 0; d + 1 < sp.ndim; ++d) if (sp.st[{i}][d] % {V} != 0) vec_ok = false; }}")
    for k, o in enumerate(prog.outputs):
        if (full_outputs_only and (o.row or o.total)) or o.dims is not None:
            continue
        lines.append(f"  if (!htam_aligned(out[{k}].data, {V} * {DT[o.dtype][2]})) vec_ok = false;")
    return "\n".join(lines)
