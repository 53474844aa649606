"""Can cuDNN's conv fuse batch norm from its raw vectors, with no fold launch before it? (#34)

Our cuDNN conv kernels run conv -> sub(center) -> mul(scale) -> add(beta) [-> add residual] ->
ReLU as one fused graph, and a small fold kernel before it computes scale = gamma * rsqrt(var + eps)
per channel on every call: on ResNet-18 bf16 under CUDA graphs 12 fold launches took 32 of 463 us
of GPU time (bench/results/arm_profile-20261130-053237.json), half of what the fused epilogues
saved. This asks cuDNN (frontend's Python graph API) for the graph with the fold inside:
rsqrt(var + eps) as pointwise ops on the [1, K, 1, 1] vectors, a side branch of the epilogue.
Per ResNet conv shape: whether cuDNN supports it, its error against eager conv + batch norm + ReLU,
and, replayed from CUDA graphs, its time against eager's and against the same graph fed a folded
scale (the fold launch left out, so a floor).

    python3 docs/experiments/cudnn_bn_in_graph/probe.py     # a row a shape, JSON last

Needs the frontend's Python module (pip install nvidia-cudnn-frontend); on the device machine it
is carried apart from the product's wheels, so that optimize there does not build the cudnn_sdpa
library: pip install --target /tmp/fe .whl/probe/*.whl, then PYTHONPATH=/tmp/fe:...
"""
import json
import sys

import torch
import torch.nn.functional as F

import cudnn

# (name, batch, C, H, K, R, stride): ResNet-50 bf16 convs at the zoo's batch 32
SHAPES = [("r50 s1 3x3", 32, 64, 56, 64, 3, 1), ("r50 s2 1x1", 32, 256, 28, 128, 1, 1),
          ("r50 s3 3x3", 32, 256, 14, 256, 3, 1), ("r50 s4 1x1", 32, 512, 7, 2048, 1, 1)]
EPS = 1e-5
BF16, FP32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT


def vec(g, t, name):
    return g.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=BF16)


def build(x, w, pad, stride, in_graph: bool):
    """(graph, its tensors by name) of conv -> batch norm -> ReLU; in_graph: from mean, var, gamma,
    beta (rsqrt(var + eps) a side branch), else from a folded scale and shift."""
    g = cudnn.pygraph(io_data_type=BF16, intermediate_data_type=FP32, compute_data_type=FP32)
    X = g.tensor(name="x", dim=list(x.shape), stride=list(x.stride()), data_type=BF16)
    W = g.tensor(name="w", dim=list(w.shape), stride=list(w.stride()), data_type=BF16)
    y = g.conv_fprop(image=X, weight=W, padding=[pad, pad], stride=[stride, stride], dilation=[1, 1],
                     compute_data_type=FP32)
    k = w.shape[0]
    v = torch.empty(1, k, 1, 1, dtype=torch.bfloat16, device="cuda")
    names = ("mean", "var", "gamma", "beta") if in_graph else ("scale", "shift")
    t = {n: vec(g, v, n) for n in names}
    if in_graph:
        eps = t["eps"] = g.tensor(name="eps", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=FP32)  # on the device
        inv = g.rsqrt(input=g.add(a=t["var"], b=eps, compute_data_type=FP32), compute_data_type=FP32)
        y = g.sub(a=y, b=t["mean"], compute_data_type=FP32)
        y = g.mul(a=y, b=g.mul(a=inv, b=t["gamma"], compute_data_type=FP32), compute_data_type=FP32)
        y = g.add(a=y, b=t["beta"], compute_data_type=FP32)
    else:
        y = g.add(a=g.mul(a=y, b=t["scale"], compute_data_type=FP32), b=t["shift"], compute_data_type=FP32)
    out = g.relu(input=y, compute_data_type=FP32)
    out.set_output(True).set_data_type(BF16)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g, dict(t, x=X, w=W, y=out)


def graphed_us(fn, reps=20, n=5):
    """fn captured reps times into one CUDA graph; the best of n replays, per call, in us."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    cg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cg):
        for _ in range(reps):
            fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(n):
        cg.replay()
        s.record()
        cg.replay()
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) * 1e3 / reps)
    return best


def row(name, n, c, h, k, r, stride):
    torch.manual_seed(0)
    x = torch.randn(n, c, h, h, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = (torch.randn(k, c, r, r, device="cuda", dtype=torch.bfloat16) * (c * r * r) ** -0.5).to(
        memory_format=torch.channels_last)
    mean, var = torch.randn(k, device="cuda") * 0.1, torch.rand(k, device="cuda") + 0.5
    gamma, beta = torch.rand(k, device="cuda") + 0.5, torch.randn(k, device="cuda") * 0.1
    pad = r // 2
    bf = {n_: t.to(torch.bfloat16).view(1, k, 1, 1) for n_, t in dict(mean=mean, var=var, gamma=gamma, beta=beta).items()}

    def eager():
        return F.relu(F.batch_norm(F.conv2d(x, w, padding=pad, stride=stride), *(bf[n_].view(k) for n_ in
                                   ("mean", "var", "gamma", "beta")), eps=EPS))
    ref = eager()
    out = {"shape": name, "eager_us": graphed_us(eager)}
    handle = cudnn.create_handle()
    for in_graph in (True, False):
        key = "in_graph" if in_graph else "folded"
        try:
            g, t = build(x, w, pad, stride, in_graph)
        except Exception as e:   # noqa: BLE001 - not supported is the answer
            out[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            continue
        y = torch.empty_like(ref)
        scale = (bf["gamma"].float() * torch.rsqrt(bf["var"].float() + EPS))
        data = {"eps": torch.full((1, 1, 1, 1), EPS, device="cuda"), "scale": scale.to(torch.bfloat16), "shift": (bf["beta"].float() - bf["mean"].float() * scale).to(torch.bfloat16),
                **bf}
        pack = {t["x"]: x, t["w"]: w, t["y"]: y, **{t[n_]: data[n_] for n_ in t if n_ in data}}
        ws = torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)

        def run(g=g, pack=pack, ws=ws):   # on the current stream: a CUDA graph captures on its own
            cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
            g.execute(pack, ws, handle=handle)
        run()
        torch.cuda.synchronize()
        out[f"{key}_err"] = (y.float() - ref.float()).abs().max().item()
        out[f"{key}_us"] = graphed_us(run)
    return out


def main():
    rows = []
    for shape in SHAPES:
        r = row(*shape)
        rows.append(r)
        print(json.dumps(r), flush=True)
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cudnn_frontend=cudnn.__version__,
                   cudnn=cudnn.backend_version() if hasattr(cudnn, "backend_version") else None, rows=rows), sys.stdout)
    print()


if __name__ == "__main__":
    main()
