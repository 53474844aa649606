"""Which cuDNN backend engine matches eager PyTorch's conv, and which pass the float64 judgement.

    python3 scripts/conv_engines.py [task stem] [n algos]     # on the GPU machine

For a conv task (default conv_bn_add_relu_fp32, under its own precision policy) this builds the
expert's graph-path kernel at algo = 0..n-1 and reports per engine:
  same-as-eager  the raw conv (batch norm set to the identity, residual 0) within 1e-6 relative of
                 F.conv2d's (the fold's rounding), i.e. cuDNN ran the engine PyTorch runs
  max rel |d| eager   the largest difference from eager there
  judge          verify.judge on the task's own inputs ("normal" and "outliers"), as verification does
  ms             the kernel's time (timing.time_fn)
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, ".")
from torch_htam import build, launcher, timing  # noqa: E402
from torch_htam.policy import policy_for  # noqa: E402
from torch_htam.proposers.expert.proposer import match_task  # noqa: E402
from torch_htam.task import load_reference, task_from_source  # noqa: E402
from torch_htam.verify import _fresh_outputs, judge, make_input, reference_outputs, tf32_switches  # noqa: E402


def identity_bn(task, ins):
    """The task's inputs with batch norm made the identity and other inputs after w zeroed: the
    kernel's output is then relu(conv(x, w)) exactly (scale 1, shift 0)."""
    x, w = ins[0], ins[1]
    out = [x, w]
    for s, t in zip(task.inputs[2:], ins[2:]):
        out.append(torch.zeros_like(t))
    # gamma=1 beta=0 mean=0 var=1-eps: positions follow the task's forward(x, w, gamma, beta, mean, var, ...)
    out[2] = torch.ones_like(out[2])
    out[5] = torch.full_like(out[5], 1.0 - 1e-5)
    return out


def worst(out, own, r64, pol, ins):
    """Prints the element furthest past the float64 judgement's bound, with its channel's BN inputs."""
    from torch_htam.verify import FP32_ERR_FACTOR, error_scale
    fin = torch.isfinite(own.double()) & torch.isfinite(r64)
    a, r32, r = (torch.where(fin, t.double(), torch.zeros_like(r64)) for t in (out, own, r64))
    e_ref, e_out = (r32 - r).abs(), (a - r).abs()
    scale = error_scale(e_ref)
    bound = pol.atol + pol.rtol * r.abs() + FP32_ERR_FACTOR * scale
    over = e_out - bound
    i = int(over.argmax())
    idx = list(torch.unravel_index(torch.tensor(i), out.shape))
    idx = [int(j) for j in idx]
    k = idx[1]
    print(f"  worst at {idx}: ours {float(a.flatten()[i]):.6g} torch {float(r32.flatten()[i]):.6g} "
          f"float64 {float(r.flatten()[i]):.6g}; |e_ours| {float(e_out.flatten()[i]):.3g} |e_torch| "
          f"{float(e_ref.flatten()[i]):.3g} error scale {float(scale.flatten()[i]):.3g} bound "
          f"{float(bound.flatten()[i]):.3g}; {int((over > 0).sum())} over; channel {k}: "
          f"gamma {float(ins[2][k]):.4g} beta {float(ins[3][k]):.4g} mean {float(ins[4][k]):.4g} "
          f"var {float(ins[5][k]):.4g}", flush=True)


def main(stem="conv_bn_add_relu_fp32", n=10):
    task = task_from_source(Path(f"bench/tasks/{stem}.py").read_text(), stem)
    pol = policy_for(task)
    tg = match_task(task, pol)
    ref = load_reference(task).cuda().eval()
    g = torch.Generator().manual_seed(0)
    sets = {d: [make_input(s, s.shape, d, g, "cuda") for s in task.inputs] for d in ("normal", "outliers")}
    print(f"{stem}: policy {pol.name}, defaults {tg.defaults}", flush=True)
    with torch.no_grad(), tf32_switches(pol.allow_tf32):
        raw_in = identity_bn(task, sets["normal"])
        eager_raw = ref(*raw_in)     # relu(conv(x, w)) up to the identity batch norm's rounding
        refs = {d: reference_outputs(ref, ins, pol) for d, ins in sets.items()}
    print("| algo | same-as-eager | max rel |d| eager | judge normal | judge outliers | ms |")
    print("|---|---|---|---|---|---|")
    for algo in range(n):
        p = dict(tg.defaults, algo=algo)
        res = build.build(tg.render(p), arch=build.default_arch())
        if not res.ok:
            print(f"| {algo} | build failed | | | | |")
            continue
        k = launcher.Kernel(res.so_path)
        outs = _fresh_outputs(task.outputs, [s.shape for s in task.outputs], 0, "cuda")
        rc = k(raw_in, outs)
        torch.cuda.synchronize()
        if rc:
            print(f"| {algo} | rc={rc} | | | | |")
            continue
        # NOTE: the fold's scale rsqrt(var + eps) may be 1 - 1ulp, so the same engine shows a relative
        # difference near 1e-7 where another engine's TF32 rounding shows ~1e-4 or more
        d = ((outs[0] - eager_raw).abs().max() / eager_raw.abs().max()).item()
        same = d < 1e-6
        verdicts = []
        for dist, ins in sets.items():
            o = _fresh_outputs(task.outputs, [s.shape for s in task.outputs], 0, "cuda")
            k(ins, o)
            torch.cuda.synchronize()
            want, want64, own = refs[dist]
            reason, detail, _ = judge(0, o[0], want[0], pol, want64, own)
            verdicts.append(reason if reason == "ok" else f"{reason}: {detail.split('; against')[-1][:300]}")
            if reason != "ok" and algo == 0:
                worst(o[0], own()[0] if own else want[0], want64()[0], pol, ins)
        ms = timing.time_fn(lambda s: k(s, outs), lambda: sets["normal"], n_sets=1).median_ms
        print(f"| {algo} | {'yes' if same else 'no'} | {d:.3g} | {verdicts[0]} | {verdicts[1]} | {ms:.4f} |",
              flush=True)
    with torch.no_grad(), tf32_switches(pol.allow_tf32):
        ms = timing.time_fn(lambda s: ref(*s), lambda: sets["normal"], n_sets=1).median_ms
    print(f"eager: {ms:.4f} ms")


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["conv_bn_add_relu_fp32"]), *([int(sys.argv[2])] if len(sys.argv) > 2 else []))
