"""LLM proposer against a real local OpenAI-compatible server (tests/llm_server.py); no mocks.

Every test runs on CPU in well under a second or two: short client timeouts and backoffs.
"""
import logging
import os
import shutil
import subprocess
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llm_server import Fail, Reply, ScriptedServer, Stall
from torch_htam.gpu import GpuInfo
from torch_htam.policy import make
from torch_htam.proposers.base import Attempt, Candidate, Parent, Proposal, ProposalRequest
from torch_htam.proposers.fallback import FallbackProposer, make_proposer
from torch_htam.proposers.llm import EndpointError, LLMClient, LLMConfig, LLMProposer
from torch_htam.proposers.reply import parse_reply
from torch_htam.task import Task, TensorSpec

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-test-7f3a9c1e5b2d4f6a8c0e"

KERNEL = r'''#include "htam_abi.h"
__global__ void gelu_bias(const float* x, const float* b, float* y, int64_t n, int64_t h) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) { float v = x[i] + b[i % h]; y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678f)); }
}
HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  if (n_in != 2 || n_out != 1) return HTAM_ERR_SHAPE;
  int64_t n = htam_numel(&in[0]), h = in[1].sizes[0];
  gelu_bias<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
      (const float*)in[0].data, (const float*)in[1].data, (float*)out[0].data, n, h);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
'''
FIXED = KERNEL.replace("erff(v * 0.70710678f)", "erff(v * 0.7071067811865476f)")


def answer(source=KERNEL, tags="vec_loads"):
    return f"Here is the kernel.\n\n```cuda\n{source}```\n\nSTRATEGIES: {tags}\n"


@dataclass
class Strat:   # the fields htg.Strategy exposes; the proposer reads them with getattr
    id: str
    title: str
    text: str
    stats: dict = field(default_factory=dict)


STRATS = [Strat("vec_loads", "Aligned 16-byte vectorized loads",
                "Load float4 when the row length is a multiple of 4; scalar tail otherwise.",
                {"tries": 7, "successes": 5, "mean_speedup": 1.31}),
          Strat("grid_stride", "Grid-stride loop", "Cap the grid at a few waves of SMs.")]

SOURCE = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, b):
        return (torch.nn.functional.gelu(x + b),)

def get_inputs():
    return [torch.randn(4096, 1024), torch.randn(1024)]

def get_init_inputs():
    return []
'''


def make_task():
    x, b, y = TensorSpec((4096, 1024), "float32", (1024, 1), (0,)), \
        TensorSpec((1024,), "float32", (1,)), TensorSpec((4096, 1024), "float32", (1024, 1), (0,))
    return Task("gelu_bias", "elementwise", SOURCE, [x, b], [y], "0" * 16,
                ["aten.add.Tensor", "aten.gelu.default"], flops=4096 * 1024 * 9.0,
                bytes=(2 * 4096 * 1024 + 1024) * 4.0)


H100 = GpuInfo("NVIDIA H100 80GB HBM3", "sm_90a", 132, 50 << 20, 232448, 3.35e12, 67e12, 989e12)


def request(**kw):
    base = dict(task=make_task(), direction="memory_access", strategies=STRATS, n=1,
                transition=("launch_overhead", "memory_access"), gpu=H100, policy=make("fp32"))
    base.update(kw)
    return ProposalRequest(**base)


def config(srv, **kw):
    base = dict(model="test-model", base_url=srv.base_url, api_key=KEY, timeout_s=5.0,
                max_retries=2, backoff_s=0.01, backoff_max_s=2.0,
                price_in_per_m=0.5, price_out_per_m=2.0)
    base.update(kw)
    return LLMConfig(**base)


def user_prompt(srv, i=-1):
    return srv.requests[i]["messages"][1]["content"]


class FakeExpert:
    name = "expert"

    def __init__(self):
        self.calls = 0

    def propose(self, req):
        self.calls += 1
        return Proposal([Candidate(KERNEL, ["grid_stride"], origin="expert")], note="expert: 1 variant")


# --- end to end against the server --------------------------------------------------------------

def test_good_kernel_prompt_and_usage():
    with ScriptedServer([answer(tags="vec_loads, made_up_id")]) as srv:
        prop = LLMProposer(config(srv)).propose(request())
    assert [c.source for c in prop.candidates] == [KERNEL]
    c = prop.candidates[0]
    assert c.origin == "llm" and c.tags == ["vec_loads"]
    assert "unknown strategy ids dropped: made_up_id" in prop.note

    body = srv.requests[0]
    assert body["model"] == "test-model" and body["temperature"] == 0.7
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    abi = (ROOT / "torch_htam/csrc/htam_abi.h").read_text().strip()
    assert abi in system and "relu_kernel<<<blocks, threads, 0, stream>>>" in system
    assert "STRATEGIES: id1, id2" in system
    for needle in ("Global direction: **Memory access** (`memory_access`). Make every global load",
                   "The previous step followed **Launch overhead**; the search moves on to **Memory access**", "`vec_loads`", "Aligned 16-byte vectorized loads",
                   "tries=7, successes=5, mean_speedup=1.31", "`grid_stride`", "no record yet",
                   "def get_inputs():", "in[1]: float32 [1024], contiguous",
                   "dynamic dims [0]", "NVIDIA H100 80GB HBM3 (sm_90a): 132 SMs", "memory bandwidth 3.35 TB/s",
                   "fp32 strict", "atol=0.0001", "None yet: this is the first kernel",
                   "Roofline lower bound on this GPU: 10.0 us (memory-bound)"):
        assert needle in user, needle

    # usage: the server's counts; cost from the configured prices
    u = prop.usage
    prompt_chars = sum(len(m["content"]) for m in body["messages"])
    assert u["prompt_tokens"] == prompt_chars // 4 and u["completion_tokens"] > 0
    assert u["cost_usd"] == pytest.approx((u["prompt_tokens"] * 0.5 + u["completion_tokens"] * 2.0) / 1e6)
    assert u["estimated"] == 0.0 and u["cost_known"] == 1.0


def test_compile_error_then_fix_feedback_reaches_prompt():
    with ScriptedServer([answer(), answer(FIXED)]) as srv:
        llm = LLMProposer(config(srv))
        first = llm.propose(request())
        # What the search loop would hand back after compiling the first candidate.
        err = "kernel.cu(4): error: identifier \"erff\" is undefined\n" + "\n".join(
            f"  note: candidate {i}" for i in range(100))
        attempt = Attempt("abc123", first.candidates[0].tags, "compile_error", detail=err)
        second = llm.propose(request(feedback=[attempt]))
    assert second.candidates[0].source == FIXED
    prompt = user_prompt(srv, 1)
    assert "- compile_error (strategies: vec_loads; speedup: not measured" in prompt
    assert 'error: identifier "erff" is undefined' in prompt
    assert "candidate 20" in prompt and "candidate 90" not in prompt and "[... trimmed]" in prompt
    assert "None yet." not in prompt.split("## Feedback")[1]
    assert llm.usage.requests == 2
    assert llm.usage.prompt_tokens == first.usage["prompt_tokens"] + second.usage["prompt_tokens"]


def test_wrong_result_feedback_and_parent_reach_prompt():
    parent = Parent(KERNEL, ["vec_loads"], 1.42, 0.0213, 0.71)
    mismatch = Attempt("def456", ["grid_stride"], "mismatch",
                       detail="out[0]: 1532 of 4194304 elements off, max abs err 3.1e-02 at [17, 1023]")
    with ScriptedServer([answer(FIXED)]) as srv:
        LLMProposer(config(srv)).propose(request(parent=parent, feedback=[mismatch]))
    prompt = user_prompt(srv)
    assert "- mismatch (strategies: grid_stride" in prompt
    assert "max abs err 3.1e-02 at [17, 1023]" in prompt
    assert "Speedup over the reference: 1.42x; kernel time: 0.0213 ms; fraction of roofline: 71%" in prompt
    assert "Strategies it applies: vec_loads." in prompt and "gelu_bias<<<" in prompt


def test_prose_without_code_gives_empty_proposal_with_reason():
    prose = "To speed this up, fuse the bias add into the GELU and use vectorized loads.\nSTRATEGIES: vec_loads"
    with ScriptedServer([prose]) as srv:
        prop = LLMProposer(config(srv)).propose(request())
    assert prop.candidates == []
    assert "reply 0: no_code" in prop.note and prop.usage["requests"] == 1.0


def test_reasoning_block_is_stripped():
    draft = KERNEL.replace("HTAM_OK;\n}", "HTAM_OK; } // draft")
    reply = f"<think>\nFirst try:\n```cuda\n{draft}```\nSTRATEGIES: grid_stride\n</think>\n{answer()}"
    with ScriptedServer([reply, "<think>\nstill thinking about ```cuda\n" + KERNEL]) as srv:
        llm = LLMProposer(config(srv))
        good = llm.propose(request())
        cut = llm.propose(request())
    assert good.candidates[0].source == KERNEL and good.candidates[0].tags == ["vec_loads"]
    assert cut.candidates == [] and "no_code (reply ended inside <think>" in cut.note


def test_429_then_success_honours_retry_after():
    with ScriptedServer([Fail(429, retry_after="1"), answer()]) as srv:
        prop = LLMProposer(config(srv, backoff_s=0.01)).propose(request())
    assert len(prop.candidates) == 1 and len(srv.requests) == 2
    assert srv.times[1] - srv.times[0] >= 0.95   # waited Retry-After, not the 10 ms backoff


def test_500_storm_gives_up_then_fallback_switches_to_expert():
    with ScriptedServer([], default=Fail(500)) as srv:
        cfg = config(srv, max_retries=2)
        with pytest.raises(EndpointError, match="HTTP 500.*gave up after 3 tries"):
            LLMClient(cfg).complete([{"role": "user", "content": "hi"}])
        assert len(srv.requests) == 3

        prop = LLMProposer(cfg).propose(request())
        assert prop.candidates == [] and prop.note.startswith("endpoint_error: HTTP 500")

        expert = FakeExpert()
        fb = FallbackProposer(LLMProposer(cfg), expert, max_failures=2, baseline_parent=False)
        first = fb.propose(request())
        assert first.candidates == [] and "(1/2 before switching to the expert)" in first.note
        second = fb.propose(request())
        assert [c.origin for c in second.candidates] == ["expert"]
        assert "using the expert proposer for the rest of the run" in second.note
        seen = len(srv.requests)
        third = fb.propose(request())
        assert third.candidates and third.note.startswith("expert (LLM endpoint failed 2 time(s)")
        assert len(srv.requests) == seen and expert.calls == 2   # endpoint no longer called


def test_fallback_resets_on_success_and_seeds_parent_from_expert():
    with ScriptedServer([Fail(500), answer(), Fail(500)]) as srv:
        expert = FakeExpert()
        fb = FallbackProposer(LLMProposer(config(srv, max_retries=0)), expert, max_failures=2)
        assert fb.propose(request()).candidates == []          # failure 1
        assert fb.propose(request()).candidates[0].origin == "llm"   # success resets the count
        assert fb.propose(request()).candidates == [] and fb.switched is None
    # The seeded parent is the expert's kernel, shown as not measured (no invented numbers).
    assert "Speedup over the reference: not measured" in user_prompt(srv, 1)
    assert "Strategies it applies: grid_stride." in user_prompt(srv, 1)


def test_unauthorized_is_not_retried_and_switches_at_once():
    with ScriptedServer([], default=Fail(401, message="Incorrect API key provided")) as srv:
        fb = FallbackProposer(LLMProposer(config(srv)), FakeExpert(), max_failures=5, baseline_parent=False)
        prop = fb.propose(request())
    assert len(srv.requests) == 1
    assert "HTTP 401" in prop.note and "not retried" in prop.note and prop.candidates


def test_rejected_parameters_are_adapted_not_counted_as_failures():
    # The messages OpenAI sends for reasoning models (o-series, gpt-5).
    script = [Fail(400, message="Unsupported parameter: 'max_tokens' is not supported with this model. "
                                "Use 'max_completion_tokens' instead."),
              Fail(400, message="Unsupported value: 'temperature' does not support 0.7 with this model. "
                                "Only the default (1) value is supported."),
              answer(), answer()]
    with ScriptedServer(script) as srv:
        llm = LLMProposer(config(srv, max_retries=0))
        assert len(llm.propose(request()).candidates) == 1
        assert len(llm.propose(request()).candidates) == 1
    sent = [{k for k in ("max_tokens", "max_completion_tokens", "temperature") if k in r} for r in srv.requests]
    assert sent == [{"max_tokens", "temperature"}, {"max_completion_tokens", "temperature"},
                    {"max_completion_tokens"}, {"max_completion_tokens"}]
    assert srv.requests[-1]["max_completion_tokens"] == 16384


def test_stalled_connection_times_out_in_bounded_time():
    with ScriptedServer([], default=Stall(30.0)) as srv:
        t0 = time.monotonic()
        prop = LLMProposer(config(srv, timeout_s=0.3, max_retries=1)).propose(request())
        elapsed = time.monotonic() - t0
    assert prop.candidates == [] and "timeout after 0.3 s; gave up after 2 tries" in prop.note
    assert len(srv.requests) == 2 and elapsed < 3.0


def test_n_candidates_are_separate_bounded_completions_and_outcomes_are_recorded():
    # Replies arrive in any order; the set of outcomes is what the loop and HTG record.
    script = [answer(tags="vec_loads"), "No code, sorry.", "```cuda\n__global__ void k() {}\n```",
              answer(FIXED, tags="grid_stride, vec_loads")]
    with ScriptedServer(script, delay=0.2) as srv:
        prop = LLMProposer(config(srv, concurrency=2)).propose(request(n=4))
    assert len(srv.requests) == 4 and srv.max_active == 2
    assert all(r["messages"] == srv.requests[0]["messages"] for r in srv.requests)
    assert sorted(c.source for c in prop.candidates) == sorted([KERNEL, FIXED])
    assert sorted(map(tuple, (c.tags for c in prop.candidates))) == [("grid_stride", "vec_loads"),
                                                                   ("vec_loads",)]
    assert prop.note.startswith("llm test-model: 2 candidate(s) from 4 completion(s)")
    reasons = sorted(part.split(": ", 1)[1] for part in prop.note.split("; ")[1:])
    assert reasons == ["no_code", "no_entry_point"]
    assert prop.usage["requests"] == 4.0


def test_missing_usage_is_estimated_and_unknown_price_costs_nothing():
    with ScriptedServer([Reply(answer(), usage=None)]) as srv:
        llm = LLMProposer(config(srv, price_in_per_m=None, price_out_per_m=None))
        prop = llm.propose(request())
    chars = sum(len(m["content"]) for m in srv.requests[0]["messages"])
    assert prop.usage["prompt_tokens"] == chars // 4
    assert prop.usage["completion_tokens"] == len(answer()) // 4
    assert prop.usage["estimated"] == 1.0 and prop.usage["cost_known"] == 0.0
    assert prop.usage["cost_usd"] == 0.0 and llm.usage.estimated


def test_api_key_never_logged_printed_or_written(caplog, tmp_path, capsys):
    caplog.set_level(logging.DEBUG)   # openai and httpx debug logs included
    script = [Fail(429, retry_after="0"), Fail(400, message=f"bad request for key {KEY}")]
    with ScriptedServer(script) as srv:
        cfg = config(srv)
        prop = LLMProposer(cfg).propose(request())
    assert srv.headers[0]["authorization"] == f"Bearer {KEY}"   # it was sent, and only there
    assert "HTTP 400" in prop.note and "***" in prop.note
    print(cfg, [cfg])
    env = dict(os.environ, OPENAI_API_KEY=KEY, HTAM_MODEL="test-model")
    out = tmp_path / "prompt.md"
    subprocess.run([sys.executable, str(ROOT / "docs/render_prompt.py"), str(out)], env=env,
                   check=True, cwd=tmp_path)
    texts = [caplog.text, capsys.readouterr().out, repr(cfg), str(cfg.to_json()), prop.note]
    texts += [p.read_text() for p in tmp_path.rglob("*") if p.is_file()]
    assert out.exists() and all(KEY not in t for t in texts)
    # The committed example is what the code renders now.
    assert out.read_text() == (ROOT / "docs/PROMPT_EXAMPLE.md").read_text(), \
        "docs/PROMPT_EXAMPLE.md is stale: run python docs/render_prompt.py"


# --- configuration -------------------------------------------------------------------------------

def test_config_from_env_check_and_local_key(monkeypatch):
    for k in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "HTAM_MODEL", "HTAM_PRICE_IN", "HTAM_PRICE_OUT"):
        monkeypatch.delenv(k, raising=False)
    msg = LLMConfig.from_env().check()
    assert "OPENAI_API_KEY" in msg and "OPENAI_BASE_URL=http://localhost:8000/v1" in msg and "HTAM_MODEL" in msg
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    msg = LLMConfig.from_env().check()
    assert "HTAM_MODEL" in msg and "OPENAI_API_KEY" not in msg
    monkeypatch.setenv("HTAM_MODEL", "qwen")
    monkeypatch.setenv("HTAM_PRICE_IN", "0.27")
    cfg = LLMConfig.from_env(timeout_s=9)
    assert cfg.check() is None and cfg.key() == "local" and cfg.timeout_s == 9
    assert cfg.price_in_per_m == 0.27 and cfg.price_out_per_m is None
    hosted = LLMConfig(model="m", base_url="https://api.deepseek.com/v1")
    assert not hosted.local and "OPENAI_API_KEY" in hosted.check()
    assert LLMConfig(model="m", base_url="http://[::1]:8000/v1").check() is None


def test_make_proposer_explains_missing_config(monkeypatch):
    for k in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "HTAM_MODEL"):
        monkeypatch.delenv(k, raising=False)
    expert = FakeExpert()
    p, msg = make_proposer(True, None, expert)
    assert p is expert and "OPENAI_API_KEY" in msg and "HTAM_MODEL" in msg and "expert" in msg
    assert make_proposer(False, None, expert)[0] is expert
    p, msg = make_proposer(True, LLMConfig(model="m", base_url="http://localhost:1/v1"), expert)
    assert isinstance(p, FallbackProposer) and "llm m at http://localhost:1/v1" in msg


def test_package_import_does_not_need_openai():
    code = ("import sys; import torch_htam, torch_htam.proposers.llm, torch_htam.proposers.fallback; "
            "assert 'openai' not in sys.modules, 'openai imported at package import'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_strategies_as_dicts_or_ids_render_defensively():
    from torch_htam.proposers.prompts import render_step, strategy_id
    strats = [{"id": "vec_loads", "title": "Vector loads", "text": "float4.", "stats": {"tries": 2}},
              "grid_stride"]
    text = render_step(request(strategies=strats, gpu=None, transition=None))
    assert "- `vec_loads`: Vector loads. float4.\n  Recorded: tries=2" in text
    assert "- `grid_stride`: grid stride." in text and "GPU\n\nUnknown." in text
    assert "This is the first step of the search." in text
    assert [strategy_id(s) for s in strats] == ["vec_loads", "grid_stride"]


# --- reply parsing -------------------------------------------------------------------------------

def test_reply_prefers_tagged_block_that_defines_the_entry():
    decl = 'extern "C" int htam_run(const HtamTensor*, int, HtamTensor*, int, cudaStream_t);'
    text = (f"```cuda\n{decl}\n```\n```\n{KERNEL}// padding so this block is larger\n```\n"
            f"```cuda\n{FIXED}```\nSTRATEGIES: `vec_loads`, none")
    r = parse_reply(text, {"vec_loads"}, static_check=False)
    assert r.source == FIXED and r.tags == ["vec_loads"] and r.dropped == []
    assert parse_reply(f"```cuda\n{decl}\n```", static_check=False).reason == "no_entry_point"
    unexported = KERNEL.replace("HTAM_ENTRY htam_run", "int htam_run")
    assert parse_reply(f"```cuda\n{unexported}```", static_check=False).reason == "no_entry_point"
    lone_close = f"reasoning without the opening tag ```cuda\n{decl}\n```</think>{answer(FIXED)}"
    assert parse_reply(lone_close, static_check=False).source == FIXED


def test_static_check_rejection_is_reported(monkeypatch):
    fake = types.ModuleType("torch_htam.build")
    fake.check_source = lambda src: ["launch without a stream: kernel<<<g, b>>>"] if "<<<1, 1>>>" in src else []
    monkeypatch.setitem(sys.modules, "torch_htam.build", fake)
    bad = KERNEL.replace("HTAM_OK;\n}", "k<<<1, 1>>>(); return HTAM_OK;\n}")
    assert parse_reply(answer(bad)).reason == "static_check: launch without a stream: kernel<<<g, b>>>"
    assert parse_reply(answer()).source == KERNEL


def test_real_static_check_rejects_a_launch_without_stream():
    pytest.importorskip("torch_htam.build")
    bad = KERNEL.replace("256, 0, stream>>>", "256>>>")
    reason = parse_reply(answer(bad)).reason
    assert reason.startswith("static_check: line ") and "stream" in reason
    assert parse_reply(answer()).source == KERNEL


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="needs nvcc")
def test_abi_example_in_the_prompt_compiles(tmp_path):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    src = ROOT / "torch_htam/proposers/prompts/abi_example.cu"
    subprocess.run([nvcc, "-std=c++17", "-I", str(ROOT / "torch_htam/csrc"), "-c", str(src),
                    "-o", str(tmp_path / "ex.o")], check=True, capture_output=True)


def test_search_with_the_llm_records_every_outcome_in_the_htg():
    """The loop end to end against the server: step 0 gets a kernel (evaluated: a success recorded
    on the start transition and on the strategy the reply named), the next step gets prose (no
    candidate: unrealized, nothing recorded on the transition that was tried)."""
    from torch_htam.evaluation import Evaluation
    from torch_htam.htg import ALL, HTG, START
    from torch_htam.search import SearchConfig, search

    class Judge:                       # stands in for the GPU: every built candidate is 1.3x
        gpu = H100

        def evaluate_many(self, task, sources):
            return [Evaluation(True, "ok", speedup=1.3, ref_ms=1.3, kernel_ms=1.0,
                               roofline_fraction=0.5) for _ in sources]

    prose = "Fuse the bias into the GELU; I will not write the code.\nSTRATEGIES: vectorized_16b_access"
    htg = HTG.from_prior()
    cfg = SearchConfig(steps=1, candidates_per_step=1, stagnation=0, roofline_stop=None)
    with ScriptedServer([answer(tags="vectorized_16b_access"), prose]) as srv:
        res = search(make_task(), LLMProposer(config(srv)), Judge(), htg, cfg)
    assert res.candidates == 1 and res.best is not None and res.steps == 1
    strategy = htg.graph.nodes["vectorized_16b_access"]["exp"][ALL]
    assert strategy.attempts == 1 and strategy.correct == 1
    recorded = {(a, b): d["exp"][ALL] for a, b, d in htg.graph.edges(data=True)
                if d.get("kind") == "transition" and ALL in d["exp"]}
    assert list(recorded) == [(START, res.directions[0])] and len(res.directions) == 2
    assert recorded[START, res.directions[0]].correct == 1 and recorded[START, res.directions[0]].attempts == 1


def test_llm_supports_every_strategy_for_the_kind_and_the_fallback_its_union():
    from torch_htam.htg import HTG
    prior = HTG.from_prior().strategies
    llm = LLMProposer(LLMConfig(model="m", base_url="http://localhost:1/v1"), client=object())
    ew = llm.supports(make_task())
    assert ew == {s for s, x in prior.items() if not x.applies_to or "elementwise" in x.applies_to}
    assert "fuse_elementwise_chain" in ew and "online_softmax" not in ew   # a row strategy

    class Some(FakeExpert):
        def supports(self, task):
            return {"ilp_unroll", "not_in_the_prior"}
    fb = FallbackProposer(llm, Some())
    assert fb.supports(make_task()) == ew | {"not_in_the_prior"}
    fb.switched = "endpoint gone"
    assert fb.supports(make_task()) == {"ilp_unroll", "not_in_the_prior"}   # the expert's alone


# --- what the prompt carries besides the task ---------------------------------------------------

def test_the_newest_failed_sources_reach_the_prompt_cut_to_their_head():
    from torch_htam.proposers.prompts import render_step
    from torch_htam.search import SearchAttempt
    long = "\n".join(f"// line {i} of the broken kernel" for i in range(300))
    failed = [SearchAttempt(f"h{i}", ["vec_loads"], "mismatch", "max abs err 1", source=f"// FAILED_{i}\n" + long)
              for i in range(3)]
    ok = SearchAttempt("h9", ["grid_stride"], "ok", speedup=1.2, kernel_ms=0.1)   # keeps no source
    text = render_step(request(feedback=failed + [ok]))
    feedback = text.split("## Feedback")[1]
    assert "FAILED_2" in feedback and "FAILED_1" in feedback     # the newest failures' code
    assert "FAILED_0" not in feedback                            # bounded: older ones left out
    assert "line 10 of the broken kernel" in feedback and "line 250 of the broken kernel" not in feedback
    assert len(feedback.splitlines()) < 2 * 100 + 40


def test_a_failed_candidate_s_source_reaches_the_next_prompt_in_the_search():
    from torch_htam.evaluation import Evaluation
    from torch_htam.htg import HTG
    from torch_htam.search import SearchConfig, search

    class Judge:                       # the first kernel is wrong, the fix is right
        gpu = H100

        def evaluate_many(self, task, sources):
            return [Evaluation(False, "mismatch", "out[0] max abs err 3e-2") if s == KERNEL else
                    Evaluation(True, "ok", speedup=1.3, ref_ms=1.3, kernel_ms=1.0, roofline_fraction=0.5)
                    for s in sources]

    cfg = SearchConfig(steps=1, candidates_per_step=1, stagnation=0, roofline_stop=None)
    with ScriptedServer([answer(tags="vectorized_16b_access"), answer(FIXED)]) as srv:
        search(make_task(), LLMProposer(config(srv)), Judge(), HTG.from_prior(), cfg)
    feedback = user_prompt(srv, 1).split("## Feedback")[1]
    assert "erff(v * 0.70710678f)" in feedback      # the code that failed, not only its hash


def test_inductor_s_time_is_the_bar_in_the_prompt_when_known():
    from torch_htam.proposers.prompts import render_step
    from torch_htam.search import MeasuredParent
    timed = MeasuredParent(KERNEL, ["vec_loads"], 1.42, 0.0213, 0.71, compile_ms=0.0187,
                           compile_speedup=0.0187 / 0.0213)
    text = render_step(request(parent=timed))
    assert "0.0187 ms" in text and "Inductor" in text and "0.88x" in text
    plain = render_step(request(parent=Parent(KERNEL, ["vec_loads"], 1.42, 0.0213, 0.71)))
    assert "Inductor" not in plain                  # not measured: no bar made up


def test_inductor_s_code_for_the_region_reaches_the_prompt_with_its_time():
    from torch_htam.proposers.prompts import render_step
    from torch_htam.search import MeasuredParent
    code = "def call(args):\n    buf0 = extern_kernels.mm(arg0_1, arg1_1)\n    return (buf0, )"
    timed = MeasuredParent(KERNEL, ["vec_loads"], 1.42, 0.0213, 0.71, compile_ms=0.0187,
                           compile_speedup=0.0187 / 0.0213, inductor_code=code)
    text = render_step(request(parent=timed))
    assert code in text and "0.0187 ms" in text
    untimed = MeasuredParent(KERNEL, ["vec_loads"], 1.42, 0.0213, 0.71, compile_ms=0.0187)
    assert "extern_kernels" not in render_step(request(parent=untimed))   # no code: none shown


def test_the_prior_s_strategy_fields_reach_the_prompt():
    from torch_htam.htg import HTG
    from torch_htam.proposers.prompts import render_step
    s = HTG.from_prior().strategies["online_softmax"]
    text = render_step(request(strategies=[s]))
    for value in (s.intent, s.example, s.expected, *s.forbidden):
        assert " ".join(value.split()) in text, value


def test_ptxas_resources_of_the_parent_and_the_attempts_reach_the_prompt():
    """The registers and spills ptxas reported for the parent's and each attempt's build
    (Evaluation.ptxas) are in the prompt; unknown ones are not made up."""
    from torch_htam.evaluation import Evaluation
    from torch_htam.proposers.prompts import render_step
    spilled = Evaluation(True, "ok", registers=255, spill_bytes=1700)
    assert spilled.ptxas() == "255 registers, 1700 bytes spilled"
    assert Evaluation(True, "ok").ptxas() == ""
    parent = Parent(KERNEL, ["vec_loads"], 1.42, 0.0213, 0.71, ptxas=spilled.ptxas())
    slow = Attempt("def456", ["register_blocking"], "ok", speedup=0.9, kernel_ms=0.03,
                   ptxas=Evaluation(True, "ok", registers=40, spill_bytes=0).ptxas())
    text = render_step(request(parent=parent, feedback=[slow]))
    assert "ptxas: 255 registers, 1700 bytes spilled" in text and "ptxas: 40 registers, no spills" in text
    plain = render_step(request(parent=Parent(KERNEL, ["vec_loads"], 1.42, 0.0213, 0.71)))
    assert "ptxas" not in plain
