"""Probe: can a cuDNN fused conv (conv + bias + [add] + ReLU in one runtime-fusion kernel, NHWC) beat
Inductor's channels-last conv + Triton BN/add/ReLU on ResNet-50's conv regions?

For each distinct conv region of torchvision's ResNet-50 (batch 32, 224x224) times, as CUDA-graph
replays (device time, no host cost), with x and the residual channels-last as Inductor's layout
optimization runs them:
  compile   torch.compile of relu(bn(conv(x)) [+ z]) (weights as the module holds them, NCHW)
  fused     fold (w * scale -> channels-last, bias = beta - mean * scale) + torch.cudnn_convolution_[add_]relu
  conv      the fused call alone (the fold excluded)
and sums them over the network, each region weighted by how often it occurs.

    python3 scripts/probe_conv_fusion.py [--dtype bf16 fp32]
"""
import argparse
import collections

import torch
from torch import nn
from torchvision.models import resnet50

CL = torch.channels_last


def graph_ms(fn, reps=20, rounds=7) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / reps)
    return sorted(ts)[len(ts) // 2]


def regions(model):
    """(conv, bn, has_residual, relu) per conv region with its input shape."""
    out = []
    for blk in [m for m in model.modules() if type(m).__name__ == "Bottleneck"]:
        out += [(blk.conv1, blk.bn1, False, True), (blk.conv2, blk.bn2, False, True),
                (blk.conv3, blk.bn3, True, True)]
        if blk.downsample is not None:
            out.append((blk.downsample[0], blk.downsample[1], False, False))
    return [(model.conv1, model.bn1, False, True)] + out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", nargs="+", default=["bf16", "fp32"])
    a = ap.parse_args()
    for dname in a.dtype:
        dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dname]
        torch.manual_seed(0)
        model = resnet50().cuda().to(dt).eval()
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5); m.running_var.uniform_(0.5, 2.0)
                m.weight.data.uniform_(0.5, 1.5); m.bias.data.uniform_(-0.5, 0.5)
        shapes = {}
        def record(m, i, o):
            shapes.setdefault(m, (tuple(i[0].shape), tuple(o.shape)))

        hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, nn.Conv2d)]
        with torch.no_grad():
            model(torch.randn(32, 3, 224, 224, device="cuda", dtype=dt))
        for h in hooks:
            h.remove()
        groups = collections.OrderedDict()
        for conv, bn, res, relu in regions(model):
            key = (shapes[conv][0], conv.out_channels, conv.kernel_size, conv.stride, conv.padding, res, relu)
            groups.setdefault(key, []).append((conv, bn))
        tot = collections.Counter()
        print(f"{dname}: region                               n   compile   fused    conv   fused/compile  err")
        for key, members in groups.items():
            (xs, K, ks, st, pad, res, relu), (conv, bn) = key, members[0]
            x = torch.randn(xs, device="cuda", dtype=dt).to(memory_format=CL)
            ys = shapes[conv][1]
            z = torch.randn(ys, device="cuda", dtype=dt).to(memory_format=CL) if res else None

            def region(x, z):
                y = bn(conv(x))
                if z is not None:
                    y = y + z
                return torch.relu(y) if relu else y

            with torch.no_grad():
                ref = region(x, z).float()
                comp = torch.compile(region)
                comp(x, z)

                def fold():
                    s = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
                    w2 = (conv.weight * s.view(-1, 1, 1, 1)).contiguous(memory_format=CL)
                    return w2, bn.bias - bn.running_mean * s

                w2, b2 = fold()

                def fused_call(w2, b2):
                    if not relu:
                        return None
                    if z is not None:
                        return torch.cudnn_convolution_add_relu(x, w2, z, 1.0, b2, st, pad, (1, 1), 1)
                    return torch.cudnn_convolution_relu(x, w2, b2, st, pad, (1, 1), 1)

                row = {"compile": graph_ms(lambda: comp(x, z))}
                err = float("nan")
                try:
                    y = fused_call(w2, b2)
                    if y is not None:
                        err = ((y.float() - ref).norm() / ref.norm()).item()
                        row["fused"] = graph_ms(lambda: fused_call(*fold()))
                        row["conv"] = graph_ms(lambda: fused_call(w2, b2))
                except RuntimeError as e:
                    print(f"   fused failed: {str(e).splitlines()[0][:120]}")
                n = len(members)
                for k in ("compile", "fused", "conv"):
                    tot[k] += n * row.get(k, row["compile"])
                tag = f"{xs[1]}->{K} {ks[0]}x{ks[1]}/{st[0]} {xs[2]}px{' +z' if res else ''}{'' if relu else ' noact'}"
                print(f"  {tag:38} {n:2} {row['compile'] * 1e3:8.1f} {row.get('fused', 0) * 1e3:8.1f} "
                      f"{row.get('conv', 0) * 1e3:7.1f}   {row['compile'] / row.get('fused', row['compile']):5.2f}x"
                      f"  {err:.1e}", flush=True)
        print(f"{dname} total us: compile {tot['compile'] * 1e3:.0f}  fused {tot['fused'] * 1e3:.0f}  "
              f"conv-only {tot['conv'] * 1e3:.0f}  -> {tot['compile'] / tot['fused']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
