"""torch-htam: the command line.

    torch-htam plan examples/gpt_block.py [--export DIR]      regions of a model, as tasks
    torch-htam optimize examples/gpt_block.py [--llm]         search kernels, fill the cache, report
    torch-htam precompile examples/gpt_block.py --out DIR     a deployable bundle for a GPU arch
    torch-htam precompile A.py B.py --out DIR --ray auto      one bundle per model, searched on Ray
    torch-htam bench examples/gpt_block.py                    eager vs torch.compile vs torch_htam
    torch-htam cache ls|show SIG|rm SIG|clear|verify          the per-arch kernel cache
    torch-htam libraries ls|build [NAME ...]                  our CUDA libraries: built? build now

MODEL_SPEC is a Python file or `module:function` returning (model, example_inputs).
Imports are lazy so `--help` is instant and the CLI works without a GPU.
What the user must fix (a bad spec or device, an unknown cache entry, an empty bundle) is printed
as one `error: ...` line on stderr, never a traceback; the exit codes are in EXIT_CODES.
"""
from __future__ import annotations

import argparse
import sys


def _add_search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None,
                   help="where the model runs (default: cuda if present, else cpu)")
    p.add_argument("--steps", type=int, default=None, help="evolution steps per task after the first (default 3: 16 candidates)")
    p.add_argument("--candidates", type=int, default=None, help="candidates per step (default 4)")
    p.add_argument("--memory", choices=("htg", "flat", "none"), default="htg",
                   help="experience memory (ablation switch)")
    p.add_argument("--time-budget", type=float, default=None, help="seconds for the whole call (default 300; 0: no limit but the steps)")
    p.add_argument("--max-tasks", type=int, default=None, help="search only the N costliest tasks")
    p.add_argument("--llm", action="store_true",
                   help="use an OpenAI-compatible endpoint (OPENAI_API_KEY / OPENAI_BASE_URL / HTAM_MODEL)")
    p.add_argument("--no-search", action="store_true", help="use cached kernels only")
    p.add_argument("--llm-timeout", type=float, default=None,
                   help="seconds per LLM request (reasoning models may need more than 120)")
    p.add_argument("--dynamic", action="append", default=None, metavar="IN:DIM=LOW-HIGH",
                   help="a size that changes between calls, served without a recompile: input IN's "
                        "dim DIM over LOW..HIGH (0:0=1-64: a batch of 1 to 64); repeat for more")


# The OptimizeConfig field each search flag sets, so a bad value is named as the user typed it.
FLAGS = {"steps": "--steps", "candidates_per_step": "--candidates", "time_budget_s": "--time-budget",
         "max_tasks": "--max-tasks", "memory": "--memory", "dynamic": "--dynamic"}


def _dynamic(values: list[str] | None) -> dict | None:
    """--dynamic IN:DIM=LOW-HIGH values as OptimizeConfig.dynamic ({IN: {DIM: (LOW, HIGH)}})."""
    import re
    out: dict[int, dict[int, tuple[int, int]]] = {}
    for v in values or ():
        m = re.fullmatch(r"\s*(\d+):(\d+)=(\d+)-(\d+)\s*", v)
        if m is None:
            raise CliError(f"--dynamic {v}: must be IN:DIM=LOW-HIGH, e.g. 0:0=1-64 (input 0's dim 0, 1 to 64)")
        i, d, low, high = map(int, m.groups())
        out.setdefault(i, {})[d] = (low, high)
    return out or None


def _config(args):
    """The OptimizeConfig of the search flags, validated by OptimizeConfig itself (CliError)."""
    import math
    from torch_htam.config import DEFAULT_TIME_BUDGET_S, ConfigError, OptimizeConfig
    given = {"steps": args.steps, "candidates_per_step": args.candidates}
    budget = (DEFAULT_TIME_BUDGET_S if args.time_budget is None else
              None if args.time_budget == 0 else args.time_budget)
    try:
        cfg = OptimizeConfig(memory=args.memory, use_llm=args.llm, search=not args.no_search,
                             max_tasks=args.max_tasks, time_budget_s=budget,
                             dynamic=_dynamic(getattr(args, "dynamic", None)),
                             **{k: v for k, v in given.items() if v is not None})
    except ConfigError as e:
        raise CliError(f"{FLAGS[e.field]} {e.value}: must be {e.allowed}" if e.field in FLAGS
                       else str(e)) from None
    if args.llm_timeout is not None:
        if not (math.isfinite(args.llm_timeout) and args.llm_timeout > 0):
            raise CliError(f"--llm-timeout {args.llm_timeout}: must be a finite number of seconds > 0")
        from torch_htam.proposers.llm import LLMConfig
        cfg.llm = LLMConfig.from_env(timeout_s=args.llm_timeout)
    return cfg


EXIT_CODES = """\
exit codes:
  0    success; for optimize: the optimized model has at least one swapped region
  1    error, printed as one `error: ...` line on stderr: the model spec (missing file, syntax or
       import error, get_model() raising), the model raising on its example inputs, a bad option
       value (--steps -1, ...), a --device this machine lacks, no --arch without a GPU, an --arch
       that is not a GPU arch, an --export folder that cannot be written, an unknown or ambiguous
       cache entry, an empty bundle; cache verify: an entry has a problem
  2    a command line argparse rejects (unknown option, missing or non-numeric argument: its usage
       message); plan: no region captured; bench: no CUDA GPU
  3    optimize ran but swapped nothing (no GPU, no kernel faster, ...): the report printed says why
  130  interrupted (Ctrl-C)
"""
OK, ERROR, NOTHING_SWAPPED, INTERRUPTED = 0, 1, 3, 130


class CliError(Exception):
    """Something the user must fix; main() prints `error: <message>` and returns ERROR."""


def _load_model(args):
    """The model and example inputs of args.model on args.device (checked; default cuda if there
    is one, else cpu). Every command that loads a model comes here or to the same two modelspec
    functions (plan, bench); every failure is a ModelSpecError that main() reports in one line."""
    from torch_htam.modelspec import load_model
    model, inputs, _ = load_model(args.model, args.device)
    return model, inputs


def _cmd_plan(args) -> int:
    from torch_htam.plan import run_plan
    return run_plan(args.model, export_dir=args.export, device=args.device, json_out=args.json)


def _cmd_optimize(args) -> int:
    from torch_htam.pipeline import optimize
    cfg = _config(args)   # a bad flag is said before the model loads
    model, inputs = _load_model(args)
    model = optimize(model, inputs, cfg)
    report = model.htam_report
    print(report.format())
    return OK if report.swapped > 0 else NOTHING_SWAPPED


def _cmd_precompile(args) -> int:
    import os
    from torch_htam import gpu, paths
    from torch_htam.modelspec import default_device
    from torch_htam.pipeline import precompile
    cfg = _config(args)
    default_device(args.device)   # a --device this machine lacks is said first
    arch = args.arch or os.environ.get("HTAM_ARCH")
    if arch is None and gpu.detect() is None:
        raise CliError("no CUDA GPU detected: pass --arch (e.g. sm_90a) to bundle kernels already "
                       "cached for that arch")
    if arch is not None:
        try:
            paths.check_arch(arch, "--arch" if args.arch else "$HTAM_ARCH")
        except ValueError as e:
            raise CliError(str(e)) from None
    if len(args.model) > 1 or args.ray:
        return _precompile_fleet(args, cfg, arch)
    args.model = args.model[0]
    model, inputs = _load_model(args)
    out = precompile(model, inputs, args.out, cfg, arch=args.arch)
    print(f"bundle written to {out}")
    return OK


def _precompile_fleet(args, cfg, arch: str | None) -> int:
    """Several models (each shared task searched once) and/or a Ray cluster's GPUs: one bundle per
    model under --out, progress in --out/fleet-progress.json (run again to resume)."""
    from torch_htam import fleet, gpu
    info = gpu.detect()
    arch = arch or (info.arch if info else None)
    if arch is None:
        raise CliError("precompile over several models or --ray needs --arch without a local GPU")
    pool = search = None
    if args.ray:
        from torch_htam.ray_pool import import_ray
        try:
            import_ray()
        except ImportError as e:
            raise CliError(str(e)) from None
    elif info is None or not cfg.search:   # nothing to search on: bundle what the cache has
        search = fleet.cached_only(arch, "no GPU here: not searched" if info is None else "--no-search")
    else:               # no cluster: this host's GPUs, one worker process each
        from torch_htam.worker import WorkerPool
        pool = WorkerPool()
    try:
        prog = fleet.precompile_specs(args.model, args.out, arch, cfg, address=args.ray,
                                      pool=pool, device=args.device, search=search)
    finally:
        if pool is not None:
            pool.close()
    print(prog.line())
    bundles = prog.data["bundles"]
    for model, b in sorted(bundles.items()):
        print(f"  {model}: {b.get('path') or 'no bundle: ' + b.get('error', '?')}")
    return OK if all("path" in b for b in bundles.values()) else ERROR


def _cmd_bench(args) -> int:
    from torch_htam.benchmark import run_bench
    from torch_htam.modelspec import default_device
    # run_bench loads the model with modelspec.load_model_spec: its errors are ModelSpecErrors too
    cfg = _config(args)
    return run_bench(args.model, cfg, out_dir=args.out, iters=args.iters,
                     device=default_device(args.device))


def _cmd_cache(args) -> int:
    from torch_htam.cache import run_cli
    return run_cli(args)


def _cmd_libraries(args) -> int:
    """`libraries ls`: each library of ours, its state for the arch and what stops its build.
    `libraries build [NAME ...]`: build them now (default: every one buildable for the arch), so
    that optimize neither waits for them nor searches without them."""
    import time
    from concurrent.futures import ThreadPoolExecutor, as_completed
    from torch_htam import build
    arch = _library_arch(args.arch)
    unknown = sorted(set(args.names or ()) - set(build.OUR_LIBRARIES))
    if unknown:
        raise CliError(f"no library named {', '.join(unknown)}; ours: {', '.join(build.OUR_LIBRARIES)}")
    if args.lib_cmd == "ls":
        for name in build.OUR_LIBRARIES:
            state, why = build.library_state(name, arch)
            where = (build.library_path(name, arch) if state is build.LibraryState.BUILT else
                     why or f"torch-htam libraries build {name} --arch {arch}")
            print(f"{name:14s} {arch:8s} {state.value:22s} {where}")
        return OK
    failed, todo = 0, []
    for name in args.names or build.OUR_LIBRARIES:
        state, why = build.library_state(name, arch)
        if state is build.LibraryState.NOT_BUILT:
            todo.append(name)
            continue
        failed += bool(args.names) and state is not build.LibraryState.BUILT
        print(f"{name}: {state.value}{': ' + why if why else ''}", file=sys.stderr)
    if todo:
        print(f"building {', '.join(todo)} for {arch} (a minute or more each; as many at once as the "
              "cores allow) ...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(len(todo), 1)) as pool:
        futures = {pool.submit(build.library, name, arch): name for name in todo}
        for fut in as_completed(futures):
            so, err = fut.result()
            failed += so is None
            print(f"{futures[fut]}: {'built at %.0f s: %s' % (time.monotonic() - t0, so) if so else err}",
                  file=sys.stderr, flush=True)
    return ERROR if failed else OK


def _library_arch(arch: str | None) -> str:
    """--arch, else this GPU's arch, else $HTAM_ARCH (cache.command_arch); else a CliError naming --arch."""
    from torch_htam.cache import command_arch
    try:
        return command_arch(arch)
    except ValueError as e:
        raise CliError(str(e)) from None
    except RuntimeError:
        raise CliError("no CUDA GPU detected and $HTAM_ARCH is not set: pass --arch (e.g. --arch sm_90a)") from None


def _user_error(e: Exception) -> str | None:
    """The one-line message of an error the user must fix, else None (a bug: let it raise)."""
    # NOTE: looked up in sys.modules, not imported: an exception of a class is raised only after
    # its module was imported, and importing modelspec here would load torch for nothing.
    kinds = [("torch_htam.modelspec", "ModelSpecError"), ("torch_htam.cache", "CacheCliError"),
             ("torch_htam.errors", "EmptyBundleError"), ("torch_htam.plan", "PlanError"),
             ("torch_htam.config", "ConfigError")]
    classes = tuple(getattr(sys.modules[m], c) for m, c in kinds if m in sys.modules)
    return str(e) if isinstance(e, (CliError, *classes)) else None


def _description() -> str:
    """The module docstring's command table and its MODEL_SPEC line, for `--help`."""
    import textwrap
    paras = __doc__.split("\n\n")
    return textwrap.dedent(paras[1]) + "\n\n" + paras[2].splitlines()[0]


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    ap = argparse.ArgumentParser(prog="torch-htam", description=_description(),
                                 epilog=EXIT_CODES, formatter_class=fmt)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    p = sub.add_parser("plan", help="show a model's regions as KernelBench-style tasks",
                       epilog=EXIT_CODES, formatter_class=fmt)
    p.add_argument("model", metavar="MODEL_SPEC", help="FILE.py, FILE.py:FUNCTION or module:FUNCTION")
    p.add_argument("--export", metavar="DIR", help="write each task as a KernelBench file")
    p.add_argument("--device", default=None, help="where to run the model (default: cuda if present, else cpu)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (tasks, built-in proposer coverage, problems) instead of the table")
    p.set_defaults(fn=_cmd_plan)
    p = sub.add_parser("optimize", help="search verified kernels for a model and cache them",
                       epilog=EXIT_CODES, formatter_class=fmt)
    p.add_argument("model", metavar="MODEL_SPEC", help="FILE.py, FILE.py:FUNCTION or module:FUNCTION")
    _add_search_args(p)
    p.set_defaults(fn=_cmd_optimize)
    p = sub.add_parser("precompile", help="write a deployable kernel bundle for a GPU arch",
                       epilog=EXIT_CODES, formatter_class=fmt)
    p.add_argument("model", metavar="MODEL_SPEC", nargs="+",
                   help="FILE.py, FILE.py:FUNCTION or module:FUNCTION; several: one bundle each in "
                        "DIR/<model>/, every task they share searched once")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="search on a Ray cluster's GPUs of the arch (auto, or ray://HEAD:10001); "
                        "needs pip install torch_htam[ray]")
    p.add_argument("--arch", default=None, metavar="ARCH",
                   help="GPU arch to bundle for, e.g. sm_90a (default: this GPU's, else $HTAM_ARCH); "
                        "without a GPU, kernels already cached for that arch are bundled")
    _add_search_args(p)
    p.set_defaults(fn=_cmd_precompile)
    p = sub.add_parser("bench", help="time eager, torch.compile and torch_htam side by side",
                       epilog=EXIT_CODES, formatter_class=fmt)
    p.add_argument("model", metavar="MODEL_SPEC", help="FILE.py, FILE.py:FUNCTION or module:FUNCTION")
    p.add_argument("--out", metavar="DIR", default="htam_bench", help="JSON and PNG go here")
    p.add_argument("--iters", type=int, default=50)
    _add_search_args(p)
    p.set_defaults(fn=_cmd_bench)
    _add_cache_parser(sub)
    _add_libraries_parser(sub)
    return ap


def _add_libraries_parser(sub) -> None:
    p = sub.add_parser("libraries", help="our CUDA libraries (CUTLASS GEMM and conv, cuDNN attention): "
                                         "ls, build",
                       description="Libraries of ours that kernels link (CUTLASS's Hopper GEMM and conv "
                                   "epilogues, cuDNN's fused attention), built once per GPU arch and "
                                   "toolchain, in a minute or more each. optimize starts their build "
                                   "itself and waits part of its budget; build them here once per "
                                   "machine (or cache folder) and it does not wait.")
    p.set_defaults(fn=_cmd_libraries)
    lsub = p.add_subparsers(dest="lib_cmd", required=True, metavar="{ls,build}")
    for cmd, help_ in (("ls", "each library: built, buildable, or what it needs"),
                       ("build", "build the named libraries, or every one buildable for the arch")):
        c = lsub.add_parser(cmd, help=help_)
        c.add_argument("names", nargs="*", metavar="NAME", help="cudnn_sdpa, cutlass_conv, cutlass_gemm")
        c.add_argument("--arch", default=None, metavar="ARCH",
                       help="GPU arch, e.g. sm_90a (default: this GPU's, else $HTAM_ARCH)")


def _add_cache_parser(sub) -> None:
    p = sub.add_parser("cache", help="the per-arch kernel cache: ls, show, rm, clear, verify",
                       description="The kernel cache of one GPU arch and toolchain (verified kernels "
                                   "by task signature). --arch defaults to this GPU's arch, else "
                                   "$HTAM_ARCH; without either, pass --arch.")
    p.set_defaults(fn=_cmd_cache)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--arch", default=None, metavar="ARCH",
                        help="GPU arch whose cache to use, e.g. sm_90a (default: this GPU's, else $HTAM_ARCH)")
    csub = p.add_subparsers(dest="cache_cmd", required=True, metavar="{ls,show,rm,clear,verify}")
    csub.add_parser("ls", parents=[common], help="list the cached kernels: signature, task, speedup, "
                                                  "precision policy, date, size, integrity")
    c = csub.add_parser("show", parents=[common], help="print one kernel's record (task, evaluation, provenance)")
    c.add_argument("signature", metavar="SIG", help="a signature or a unique prefix of one")
    c = csub.add_parser("rm", parents=[common], help="remove one kernel (e.g. one that verify flags)")
    c.add_argument("signature", metavar="SIG", help="a signature or a unique prefix of one")
    c = csub.add_parser("clear", parents=[common], help="remove every cached kernel of the arch")
    c.add_argument("--yes", "-y", action="store_true", help="do not ask (it asks only on a terminal)")
    csub.add_parser("verify", parents=[common], help="check every entry's integrity hashes (exit 1 if "
                                                      "one is corrupt)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("interrupted: nothing was swapped or cached past the last finished task", file=sys.stderr)
        return INTERRUPTED
    except Exception as e:
        msg = _user_error(e)
        if msg is None:
            raise
        print(f"error: {msg}", file=sys.stderr)
        return ERROR


if __name__ == "__main__":
    sys.exit(main())
