"""torch-htam: the command line.

    torch-htam plan examples/gpt_block.py [--export DIR]      regions of a model, as tasks
    torch-htam optimize examples/gpt_block.py [--llm]         search kernels, fill the cache, report
    torch-htam precompile examples/gpt_block.py --out DIR     a deployable bundle for this GPU arch
    torch-htam bench examples/gpt_block.py                    eager vs torch.compile vs torch_htam
    torch-htam cache ls|show SIG|clear|verify                 the per-arch kernel cache

MODEL_SPEC is a Python file or `module:function` returning (model, example_inputs).
Imports are lazy so `--help` is instant and the CLI works without a GPU.
"""
from __future__ import annotations

import argparse
import sys


def _add_search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="where the model runs (default: cuda if present)")
    p.add_argument("--steps", type=int, default=None, help="evolution steps per task (default 6)")
    p.add_argument("--candidates", type=int, default=None, help="candidates per step (default 4)")
    p.add_argument("--memory", choices=("htg", "flat", "none"), default="htg",
                   help="experience memory (ablation switch)")
    p.add_argument("--time-budget", type=float, default=None, help="seconds for the whole search")
    p.add_argument("--max-tasks", type=int, default=None, help="search only the N costliest tasks")
    p.add_argument("--llm", action="store_true",
                   help="use an OpenAI-compatible endpoint (OPENAI_API_KEY / OPENAI_BASE_URL / HTAM_MODEL)")
    p.add_argument("--no-search", action="store_true", help="use cached kernels only")
    p.add_argument("--llm-timeout", type=float, default=None,
                   help="seconds per LLM request (reasoning models may need more than 120)")


def _config(args):
    from torch_htam.pipeline import OptimizeConfig
    cfg = OptimizeConfig(memory=args.memory, use_llm=args.llm, search=not args.no_search,
                         max_tasks=args.max_tasks, time_budget_s=args.time_budget)
    if args.llm_timeout is not None:
        from torch_htam.proposers.llm import LLMConfig
        cfg.llm = LLMConfig.from_env(timeout_s=args.llm_timeout)
    if args.steps is not None:
        cfg.steps = args.steps
    if args.candidates is not None:
        cfg.candidates_per_step = args.candidates
    return cfg


def _cmd_plan(args) -> int:
    from torch_htam.plan import run_plan
    return run_plan(args.model, export_dir=args.export, device=args.device)


def _device(args) -> str:
    """--device, else cuda when there is one: the kernels run on a GPU, so the model goes there."""
    import torch
    return args.device or ("cuda" if torch.cuda.is_available() else "cpu")


def _cmd_optimize(args) -> int:
    from torch_htam.modelspec import load_model_spec
    from torch_htam.pipeline import optimize
    model, inputs = load_model_spec(args.model, device=_device(args))
    model = optimize(model, inputs, _config(args))
    print(model.htam_report.format())
    return 0


def _cmd_precompile(args) -> int:
    from torch_htam.pipeline import precompile
    from torch_htam.modelspec import load_model_spec
    model, inputs = load_model_spec(args.model, device=_device(args))
    out = precompile(model, inputs, args.out, _config(args))
    print(f"bundle written to {out}")
    return 0


def _cmd_bench(args) -> int:
    from torch_htam.benchmark import run_bench
    return run_bench(args.model, _config(args), out_dir=args.out, iters=args.iters, device=_device(args))


def _cmd_cache(args) -> int:
    from torch_htam.cache import cli_main
    return cli_main(args.rest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="torch-htam", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="show a model's regions as KernelBench-style tasks")
    p.add_argument("model")
    p.add_argument("--export", metavar="DIR", help="write each task as a KernelBench file")
    p.add_argument("--device", default=None, help="where to run the model (default: cuda if present)")
    p.set_defaults(fn=_cmd_plan)
    p = sub.add_parser("optimize", help="search verified kernels for a model and cache them")
    p.add_argument("model")
    _add_search_args(p)
    p.set_defaults(fn=_cmd_optimize)
    p = sub.add_parser("precompile", help="write a deployable kernel bundle for this GPU arch")
    p.add_argument("model")
    p.add_argument("--out", required=True, metavar="DIR")
    _add_search_args(p)
    p.set_defaults(fn=_cmd_precompile)
    p = sub.add_parser("bench", help="time eager, torch.compile and torch_htam side by side")
    p.add_argument("model")
    p.add_argument("--out", metavar="DIR", default="htam_bench", help="JSON and PNG go here")
    p.add_argument("--iters", type=int, default=50)
    _add_search_args(p)
    p.set_defaults(fn=_cmd_bench)
    p = sub.add_parser("cache", help="ls | show SIG | clear | verify the kernel cache")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=_cmd_cache)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("interrupted: nothing was swapped or cached past the last finished task", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
