"""Static check of a candidate source, before anything is compiled: the kernel ABI's rules as data.

Each Rule is a regex over the source with comments and string literals stripped, a message for the
proposer and the reason it exists (most are known ways generated kernels fooled an evaluator:
other streams, syncs, timer patching, threads, host timers). Launches are checked for the stream
argument separately, since `<<<grid, block>>>` needs parsing, not a regex.

    >>> static_check.check_source(src)
    ['line 12: kernel launch without a stream: pass `stream` as the 4th <<<...>>> argument']
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# --------------------------------------------------------------------------------------------
# Static check: what a candidate may not do, as data. Each rule is (name, regex, message, reason);
# `message` is what the proposer reads, `reason` is why the rule exists.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: str
    message: str
    reason: str


# csrc libraries a candidate may link by including their header (build.library builds each once;
# the candidate's hash covers the library's: build._flags)
LIBRARIES = ("cudnn_sdpa", "cutlass_conv", "cutlass_gemm")

RULES: tuple[Rule, ...] = (
    Rule("torch_headers", r"^[ \t]*#[ \t]*include[ \t]*[<\"][^>\"\n]*\b(?:torch|ATen|c10|pybind11|caffe2)/",
         "includes a torch/ATen/c10/pybind11 header: use only CUDA headers and \"htam_abi.h\"",
         "torch headers make one build take ~56 s instead of ~2 s, and tie the .so to one torch"),
    Rule("python_header", r"^[ \t]*#[ \t]*include[ \t]*[<\"][^>\"\n]*\bPython\.h",
         "includes Python.h: the kernel is called from C++, never from Python",
         "the ABI is plain C; Python objects have no place in a kernel .so"),
    Rule("local_include", r"^[ \t]*#[ \t]*include[ \t]*\"(?!(?:htam_abi|" + "|".join(LIBRARIES) + r")\.h\")",
         "#include \"...\" of a file other than htam_abi.h or a library's (" + ", ".join(f"{n}.h" for n in LIBRARIES)
         + "): a candidate is one self-contained source (use <...> for CUDA toolkit headers)",
         "the content hash covers the source, htam_abi.h and the libraries it links; any other local file"
         " would be compiled without being hashed, and could be anything on disk"),
    Rule("other_streams", r"\bcu(?:da)?Stream(?:Create\w*|Destroy)\b",
         "creates or destroys a CUDA stream: launch everything on the `stream` argument",
         "work on another stream escapes the caller's stream order, CUDA-graph capture and timing"),
    Rule("host_sync", r"\bcuda(?:Device|Stream|Event|Thread)Synchronize\b|\bcu(?:Ctx|Stream|Event)Synchronize\b",
         "synchronizes the host with the device: return after enqueuing work on `stream`",
         "syncs break CUDA-graph capture and stall the caller's pipeline"),
    Rule("events", r"\bcu(?:da)?Event(?!\w*Synchronize)\w+|\bcudaStreamWaitEvent\b",
         "uses CUDA events: timing is the harness's job",
         "events inside a candidate can patch or skew the timer around it"),
    Rule("threads", r"\bstd::j?thread\b|\bpthread_\w+|\bfork\s*\(|\bstd::async\b|#[ \t]*pragma[ \t]+omp\b"
                    r"|\bomp_\w+\s*\(",
         "starts host threads or processes: htam_run must do its work on the calling thread",
         "work left running on a host thread escapes timing and outlives the call"),
    Rule("dynamic_loading", r"\bdl(?:m?open|v?sym)\b|\bLD_PRELOAD\b",
         "loads libraries at run time (dlopen/dlsym/LD_PRELOAD): link what you need",
         "run-time loading can interpose on CUDA or the harness"),
    Rule("environment", r"\b(?:secure_)?getenv\b|\b(?:setenv|putenv|unsetenv)\b",
         "reads or sets environment variables: a kernel must depend only on its inputs",
         "environment lookups make a kernel behave differently under the harness and in the model"),
    Rule("processes", r"\bsystem\s*\(|\bpopen\s*\(|\bexec[lv]p?e?\s*\(",
         "runs other programs: a kernel only computes",
         "a candidate may come from an LLM; it must not reach outside its own computation"),
    Rule("sleep", r"\b(?:sleep|usleep|nanosleep)\s*\(|\bsleep_(?:for|until)\b",
         "sleeps on the host: a kernel only enqueues work",
         "host sleeps can be used to game wall-clock measurements"),
    Rule("host_timers", r"\bclock_gettime\b|\bgettimeofday\b|\bchrono\b|\b__rdtsc\b|\bQueryPerformanceCounter\b",
         "reads a host timer: timing is the harness's job",
         "a kernel that sees time can behave differently while it is being timed"),
    Rule("sync_copies", r"\bcu(?:da)?Mem(?:cpy|set)\w*(?<!Async)\s*\(",
         "uses a synchronous cudaMemcpy/cudaMemset: use cudaMemcpyAsync/cudaMemsetAsync on `stream`",
         "the synchronous forms run on the legacy stream and block the host"),
    Rule("managed_memory", r"\bcudaMallocManaged\b|\b__managed__\b",
         "uses managed (unified) memory: use the device pointers you are given",
         "page migration makes timing depend on where memory happened to be"),
    Rule("free", r"\bcudaFree\s*\(|\bcudaDeviceReset\b|\bcudaSetDevice\b",
         "calls cudaFree/cudaDeviceReset/cudaSetDevice: use cudaFreeAsync on `stream` or a static"
         " workspace, and the current device",
         "cudaFree synchronizes the device and is illegal during CUDA-graph capture"),
    Rule("files", r"\b(?:fopen|freopen|fdopen|open|creat|mmap)\s*\(|\b(?:std::)?[io]?fstream\b|\bofstream\b",
         "opens files: a kernel must not touch the filesystem",
         "a candidate may come from an LLM; it must not read or write files"),
)

# Calls that take a stream: name -> index of the stream argument. A missing or null stream there
# means the legacy default stream.
STREAM_ARGS: dict[str, int] = {
    "cudaLaunchKernel": 5, "cudaLaunchCooperativeKernel": 5, "cuLaunchKernel": 8,
    "cudaMemcpyAsync": 4, "cudaMemsetAsync": 3, "cudaMemcpy2DAsync": 7, "cudaMemset2DAsync": 5,
    "cudaMemcpyToSymbolAsync": 5, "cudaMemcpyFromSymbolAsync": 5, "cudaMemcpy3DAsync": 1,
    "cudaMallocAsync": 2, "cudaFreeAsync": 1, "cudaMemPrefetchAsync": 3, "cudaGraphLaunch": 1,
    "cublasSetStream": 1, "cudnnSetStream": 1, "cublasLtMatmul": 15,
}
# Handles and launch configs that run on the legacy stream unless their stream is set.
REQUIRES: tuple[tuple[str, str, str], ...] = (
    (r"\bcublasCreate\w*\s*\(", r"\bcublasSetStream\w*\s*\(",
     "creates a cuBLAS handle without cublasSetStream(handle, stream): cuBLAS would run on the"
     " legacy default stream"),
    (r"\bcudnnCreate\s*\(", r"\bcudnnSetStream\s*\(",
     "creates a cuDNN handle without cudnnSetStream(handle, stream): cuDNN would run on the legacy"
     " default stream"),
    (r"\bcudaLaunchKernelEx\w*\s*\(",
     r"\.\s*stream\s*=\s*(?!0\b|nullptr\b|NULL\b|cudaStreamLegacy\b|cudaStreamPerThread\b)\w",
     "launches with cudaLaunchKernelEx without setting config.stream = stream"),
)
NULL_STREAMS = {"0", "0x0", "0l", "0u", "nullptr", "null", "cudastreamlegacy", "cudastreamperthread",
                "cu_stream_legacy", "cu_stream_per_thread", "cudastreamdefault"}
_ENTRY_DEF = re.compile(r"\bhtam_run\s*\([^;{}]*\)\s*\{")
_ENTRY_DECL = re.compile(r"HTAM_ENTRY\s+htam_run\s*\(|extern\s+\"C\"")


def _strip(source: str) -> str:
    """Comments → spaces and string/char literals → empty, keeping newlines (for line numbers),
    #include paths and the "C" of extern "C" (syntax, not data)."""
    token = re.compile(r'//[^\n]*|/\*.*?\*/|R"([^(\s]{0,16})\(.*?\)\1"|"(?:\\.|[^"\\\n])*"'
                       r"|'(?:\\.|[^'\\\n]){1,8}'", re.S)

    def repl(m: re.Match) -> str:
        text = m.group(0)
        if text.startswith("/"):
            return re.sub(r"[^\n]", " ", text)
        line = source[source.rfind("\n", 0, m.start()) + 1:m.start()]
        if re.match(r"\s*#\s*include\b", line) or (text == '"C"' and re.search(r"\bextern\s*$", line)):
            return text
        quote = text[-1]
        return quote + "\n" * text.count("\n") + quote

    return token.sub(repl, source)


def _line(code: str, pos: int) -> int:
    return code.count("\n", 0, pos) + 1


def _split_args(text: str) -> list[str]:
    """Top-level comma split: 'a, f(b, c), d[1,2]' -> ['a', 'f(b, c)', 'd[1,2]']."""
    args, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    last = "".join(cur).strip()
    return args + [last] if last or args else args


def _call_args(code: str, open_paren: int) -> str | None:
    """Text between the parenthesis at `open_paren` and its match, or None if unbalanced."""
    depth = 0
    for i in range(open_paren, len(code)):
        depth += code[i] == "("
        depth -= code[i] == ")"
        if depth == 0:
            return code[open_paren + 1:i]
    return None


def _is_null_stream(arg: str) -> bool:
    # Drop casts: (cudaStream_t)0, static_cast<cudaStream_t>(0), cudaStream_t(nullptr), (CUstream)0.
    a = re.sub(r"\s+", "", arg)
    a = re.sub(r"static_cast<\w+>|reinterpret_cast<\w+>|\((?:cudaStream_t|CUstream)\)|cudaStream_t|CUstream",
               "", a)
    return a.strip("()").lower() in NULL_STREAMS


def _check_launches(code: str) -> list[str]:
    problems = []
    for m in re.finditer(r"<<<(.*?)>>>", code, re.S):
        cfg, line = _split_args(m.group(1)), _line(code, m.start())
        if len(cfg) < 4:
            problems.append(f"line {line}: kernel launch <<<{m.group(1).strip()}>>> has no stream: "
                            "write <<<grid, block, smem, stream>>> with the `stream` passed to htam_run")
        elif _is_null_stream(cfg[3]):
            problems.append(f"line {line}: kernel launch passes `{cfg[3]}` as its stream (the legacy "
                            "default stream): launch on the `stream` passed to htam_run")
    for name, idx in STREAM_ARGS.items():
        for m in re.finditer(rf"\b{name}\s*(?:<[^;()]*>)?\s*\(", code):
            body = _call_args(code, m.end() - 1)
            args = _split_args(body) if body is not None else []
            line = _line(code, m.start())
            if len(args) <= idx:
                problems.append(f"line {line}: {name}(...) is called without its stream argument: "
                                "pass the `stream` given to htam_run")
            elif _is_null_stream(args[idx]):
                problems.append(f"line {line}: {name}(...) passes `{args[idx]}` as its stream: pass "
                                "the `stream` given to htam_run")
    return problems


def check_source(source: str) -> list[str]:
    """Static check of a candidate before compiling: each problem as one readable sentence.

    Comments and string literals are ignored, so `// no cudaDeviceSynchronize here` is fine.

        >>> build.check_source('#include "htam_abi.h"\\nHTAM_ENTRY htam_run(...) { k<<<1, 32>>>(); }')
        ['line 2: kernel launch <<<1, 32>>> has no stream: write <<<grid, block, smem, stream>>> ...']
    """
    code = _strip(source)
    problems = []
    if not (_ENTRY_DEF.search(code) and _ENTRY_DECL.search(code)):
        problems.append('no entry point: define `HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, '
                        'HtamTensor* out, int n_out, cudaStream_t stream) { ... }` (extern "C")')
    for rule in RULES:
        m = re.search(rule.pattern, code, re.M)
        if m:
            problems.append(f"line {_line(code, m.start())}: {rule.message}")
    problems += _check_launches(code)
    for trigger, required, message in REQUIRES:
        m = re.search(trigger, code)
        if m and not re.search(required, code):
            problems.append(f"line {_line(code, m.start())}: {message}")
    return problems
