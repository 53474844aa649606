"""HTG: prior contents, selection (transitions, exploration, position weights, short-term memory),
retrieval, ablation modes, and persistence (round trip, prior upgrade, corrupt files)."""
import json
import shutil

import pytest

from torch_htam.evaluation import Evaluation
from torch_htam.htg import (ALL, HTG, KINDS, MODES, PRIOR_DIR, START, Outcome, SelectConfig, Stats,
                            Trail, outcome_of)
from torch_htam.gpu import GpuInfo
from torch_htam.state import KernelState, failure_class, headroom_tier, state_of
from torch_htam.task import Task, TensorSpec

# Strategy ids the expert proposer implements: they must exist, under these directions.
EXPERT_IDS = {
    "memory_access": ["vectorized_16b_access", "read_only_cache_loads"],
    "data_reuse": ["row_in_registers", "smem_tiling"],
    "parallel_mapping": ["warp_per_row", "block_per_row", "grid_stride_loop", "persistent_grid"],
    "fusion": ["fuse_elementwise_chain", "fuse_row_prologue_epilogue", "cublaslt_epilogue",
               "gemm_plus_epilogue_kernel", "fold_batchnorm"],
    "reduction_strategy": ["warp_shuffle_reduction", "online_softmax", "welford_statistics"],
    "compute_precision": ["tf32_tensor_cores", "bf16_tensor_cores"],
    "instruction_throughput": ["ilp_unroll", "fast_math_intrinsics"],
    "launch_overhead": ["single_kernel_launch"],
    "algebraic_simplification": ["drop_noop_ops"],
}

ROW = KernelState(bound="memory", has_reduction=True, kind="rowwise", headroom="high")
EW = KernelState(bound="memory", kind="elementwise", headroom="medium")
WIN = Outcome("ok", 1.5, True, 0.405)
FLAT = Outcome("ok", 1.0, False, 0.0)
FAIL = Outcome("compile_error", None, False, -0.2)


def train(htg, state, prev, direction, outcome, times, tags=()):
    for _ in range(times):
        htg.record(state, prev, direction, tags, outcome)


def eligible_directions(htg, state):
    return sorted({s.direction for s in htg.eligible(state)})


# --- state --------------------------------------------------------------------------------------

H100 = GpuInfo("H100", "sm_90a", 132, 50 << 20, 227 << 10, 3.35e12, 67e12, 989e12)


def _task(kind, ops, dtype="float32", flops=0.0, nbytes=1.0):
    x = TensorSpec((64, 64), dtype, (64, 1))
    return Task("t", kind, "", [x], [x], "s", list(ops), flops=flops, bytes=nbytes)


def test_state_of_classifies_work_bound_and_headroom():
    norm = _task("rowwise", ["aten.layer_norm.default"], flops=8 * 4096, nbytes=2 * 4 * 4096)
    assert state_of(norm).key() == "unknown|red|fp32|unknown|ok"   # no GPU: bound unknown
    ok = Evaluation(True, "ok", speedup=1.3, roofline_fraction=0.7)
    s = state_of(norm, ok, H100)
    assert (s.bound, s.has_reduction, s.has_gemm, s.headroom) == ("memory", True, False, "medium")
    # 1024^3 GEMM: 2.1 GFLOP over 12 MB = 171 FLOP/B, above the fp32 ridge (67e12 / 3.35e12 = 20)
    gemm = _task("gemm", ["aten.linear.default", "aten.gelu.default"], 2 * 1024 ** 3, 12 * 2 ** 20)
    assert state_of(gemm, None, H100).key() == "compute|gemm|fp32|unknown|ok"
    half = state_of(_task("elementwise", ["aten.add.Tensor"], dtype="bfloat16"), None, H100,
                    last_failure="partial_write")
    assert half.key() == "memory|ew|half|unknown|wrong" and half.tensor_cores
    assert [headroom_tier(f) for f in (0.3, 0.7, 0.9, None)] == ["high", "medium", "low", "unknown"]
    assert [failure_class(r) for r in ("compile_error", "crash", "mismatch", None)] == \
        ["build", "crash", "wrong", "ok"]


# --- prior --------------------------------------------------------------------------------------

def test_prior_has_the_expert_ids_and_complete_skill_fields():
    htg = HTG.from_prior()
    assert len(htg.directions) >= 7 and len(htg.strategies) >= 30
    for direction, ids in EXPERT_IDS.items():
        for sid in ids:
            assert htg.strategies[sid].direction == direction, sid
    for s in htg.strategies.values():
        assert s.title and len(s.text) > 80 and s.intent and s.expected and s.example, s.id
        assert s.forbidden and s.applies_to and set(s.applies_to) <= set(KINDS), s.id
        assert set(s.preconditions) <= {"bound", "headroom", "last_failure", "has_reduction",
                                        "has_gemm", "has_conv", "dtype_class", "tf32_allowed",
                                        "tensor_cores"}, s.id
    for d in htg.directions:
        assert htg.strategies_under(d), f"direction {d} has no strategy"


def test_structural_preconditions_filter_strategies():
    htg = HTG.from_prior()
    gemm = KernelState(bound="compute", has_gemm=True, kind="gemm")
    ids = {s.id for s in htg.eligible(gemm)}
    assert "cublaslt_epilogue" in ids and "tf32_tensor_cores" not in ids   # policy: strict fp32
    assert "tensor_core_tile_mma" not in ids
    assert "tf32_tensor_cores" in {s.id for s in htg.eligible(KernelState(
        has_gemm=True, kind="gemm", tf32_allowed=True))}
    ew_ids = {s.id for s in htg.eligible(EW)}
    assert "online_softmax" not in ew_ids and "bf16_tensor_cores" not in ew_ids
    assert "fuse_elementwise_chain" in ew_ids


def test_bad_prior_is_a_clear_error(tmp_path):
    shutil.copytree(PRIOR_DIR, tmp_path / "p")
    data = json.loads((tmp_path / "p" / "strategies.json").read_text())
    data["strategies"][0]["direction"] = "nowhere"
    (tmp_path / "p" / "strategies.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="unknown direction 'nowhere'"):
        HTG.from_prior(tmp_path / "p")


# --- selection ----------------------------------------------------------------------------------

def test_selection_follows_recorded_transitions():
    htg = HTG.from_prior()
    dirs = eligible_directions(htg, ROW)
    for prev in ("memory_access", "fusion"):
        for d in dirs:   # every move tried equally often, so exploration terms are equal
            train(htg, ROW, prev, d, FLAT, 6)
    train(htg, ROW, "memory_access", "reduction_strategy", WIN, 6)
    train(htg, ROW, "fusion", "data_reuse", WIN, 6)
    assert htg.select(ROW, Trail("t", directions=["memory_access"], improved=[True])).direction \
        == "reduction_strategy"
    assert htg.select(ROW, Trail("t", directions=["fusion"], improved=[True])).direction == "data_reuse"


def test_experience_is_conditioned_on_state_with_backoff():
    htg = HTG.from_prior()
    train(htg, ROW, "fusion", "data_reuse", WIN, 10)
    other = KernelState(bound="compute", has_reduction=True, kind="rowwise", headroom="low")
    q_here, q_other, q_new = (htg.q("fusion", "data_reuse", s.key()) for s in
                              (ROW, other, KernelState(kind="rowwise", has_reduction=True)))
    assert q_here > q_other > htg.q("fusion", "launch_overhead", other.key())
    assert q_other == pytest.approx(q_new)   # unseen states share the all-state estimate
    assert htg.edge_stats("fusion", "data_reuse", ROW.key()).attempts == 10
    assert htg.edge_stats("fusion", "data_reuse", ALL).attempts == 10


def test_exploration_tries_every_untried_direction():
    htg = HTG.from_prior()
    dirs = eligible_directions(htg, ROW)
    chosen = []
    for i in range(len(dirs)):   # each a new task: no short-term memory, only the UCB term moves
        d = htg.select(ROW, Trail(f"task{i}")).direction
        chosen.append(d)
        train(htg, ROW, START, d, FLAT, 4)
    assert sorted(chosen) == dirs


def test_untried_direction_beats_a_tried_one_of_equal_value():
    htg = HTG(list(HTG.from_prior().directions.values()), list(HTG.from_prior().strategies.values()),
              edges=[])   # no prior edges: every Q starts at 0
    train(htg, ROW, START, "memory_access", FLAT, 8)
    scores = htg.scores(ROW, Trail("t"), ["memory_access", "parallel_mapping"])
    assert scores["parallel_mapping"] > scores["memory_access"]


def test_position_weights_make_newer_history_weigh_more():
    htg = HTG.from_prior()
    train(htg, ROW, "memory_access", "data_reuse", WIN, 8)        # older history entry's favourite
    train(htg, ROW, "parallel_mapping", "instruction_throughput", WIN, 8)   # newest entry's
    trail = Trail("t", directions=["memory_access", "parallel_mapping"], improved=[True, True])
    s = htg.scores(ROW, trail, ["data_reuse", "instruction_throughput"])
    assert s["instruction_throughput"] > s["data_reuse"]
    assert htg.position_weights(3) == [0.25, 0.5, 1.0]
    flat = HTG.from_prior(config=SelectConfig(position_weights=False))
    assert flat.position_weights(3) == [1.0, 1.0, 1.0]


def test_short_term_memory_damps_a_direction_that_did_not_pay():
    htg = HTG.from_prior()
    fresh = htg.scores(ROW, Trail("t", directions=["fusion"], improved=[True]), ["memory_access"])
    stuck = htg.scores(ROW, Trail("t", directions=["memory_access", "fusion"], improved=[False, True]),
                       ["memory_access"])
    assert stuck["memory_access"] < fresh["memory_access"]
    paid = htg.scores(ROW, Trail("t", directions=["memory_access", "fusion"], improved=[True, True]),
                      ["memory_access"])
    # same history, so the whole difference is the tabu term for the step that did not pay
    assert paid["memory_access"] - stuck["memory_access"] == pytest.approx(
        htg.config.tabu * htg.config.tabu_decay)   # one step old


def test_retrieval_ranks_by_outcome_and_precondition_match():
    htg = HTG.from_prior()
    ids = [s.id for s in htg.retrieve("memory_access", EW)]
    assert ids[0] == "coalesced_layout_access"   # its bound=memory precondition holds; no stats yet
    for _ in range(5):
        htg.record(EW, "fusion", "memory_access", ["read_only_cache_loads"], WIN)
    top = htg.retrieve("memory_access", EW)[0]
    assert top.id == "read_only_cache_loads" and top.stats["faster"] == 5
    failing = Trail("t", strategy_fails={"read_only_cache_loads": 3})
    assert htg.retrieve("memory_access", EW, failing)[0].id != "read_only_cache_loads"


def test_outcome_of_evaluation():
    assert outcome_of(Evaluation(True, "ok", speedup=1.5), 1.2).gain == pytest.approx(1.25)
    assert outcome_of(Evaluation(True, "ok", speedup=1.5), 1.2).success
    assert not outcome_of(Evaluation(True, "ok", speedup=1.205), 1.2).success   # within min_gain
    bad = outcome_of(Evaluation(False, "mismatch", speedup=9.0), 1.0)
    assert bad.gain is None and bad.reward < 0 and bad.reason == "mismatch"
    assert outcome_of(Evaluation(True, "ok", speedup=1000.0), 1.0).reward == 1.0   # clipped


# --- ablation modes -----------------------------------------------------------------------------

def test_flat_mode_ranks_one_pool_by_own_stats_only():
    htg = HTG.from_prior()
    for _ in range(6):
        htg.record(ROW, "fusion", "reduction_strategy", ["welford_statistics"], WIN, mode="flat")
    assert htg.edge_stats("fusion", "reduction_strategy").attempts == 0   # no transitions learned
    other = KernelState(bound="compute", has_reduction=True, kind="rowwise", headroom="low")
    c = htg.select(other, Trail("t"), mode="flat")   # a different state: flat ignores it
    assert c.strategies[0].id == "welford_statistics" and c.direction == "reduction_strategy"
    assert c.scores == {}
    assert len({s.direction for s in c.strategies}) > 1   # one pool, not one direction


def test_none_mode_is_seeded_and_learns_nothing():
    htg = HTG.from_prior()
    picks = [[s.id for s in htg.select(ROW, Trail("t", seed=1), "none", step).strategies]
             for step in range(4)]
    again = [[s.id for s in htg.select(ROW, Trail("t", seed=1), "none", step).strategies]
             for step in range(4)]
    other = [[s.id for s in htg.select(ROW, Trail("t", seed=2), "none", step).strategies]
             for step in range(4)]
    assert picks == again and picks != other
    before = htg.experience_json()
    htg.record(ROW, START, "fusion", ["fuse_elementwise_chain"], WIN, mode="none")
    assert htg.experience_json()["edges"] == before["edges"] == {}
    assert htg.experience_json()["strategies"] == {}
    with pytest.raises(ValueError, match="memory mode"):
        htg.select(ROW, Trail("t"), "random")
    assert MODES == ("htg", "flat", "none")


# --- persistence --------------------------------------------------------------------------------

def test_save_load_round_trip(tmp_path):
    htg = HTG.from_prior()
    train(htg, ROW, START, "fusion", WIN, 3, tags=["fuse_row_prologue_epilogue"])
    train(htg, ROW, "fusion", "memory_access", FAIL, 2, tags=["vectorized_16b_access"])
    path = htg.save(tmp_path / "sub" / "htg.json")
    assert [p.name for p in path.parent.iterdir()] == ["htg.json"]   # no temp file left behind
    data = json.loads(path.read_text())
    assert "text" not in json.dumps(data)   # experience only, never prior text
    back = HTG.load(path)
    for a, b in ((START, "fusion"), ("fusion", "memory_access")):
        assert back.edge_stats(a, b, ROW.key()) == htg.edge_stats(a, b, ROW.key())
    assert back.strategy_stats("vectorized_16b_access").failures == {"compile_error": 2}
    trail = Trail("t", directions=["fusion"], improved=[True])
    assert back.select(ROW, trail).direction == htg.select(ROW, trail).direction
    train(back, ROW, START, "fusion", WIN, 1)   # experience accumulates across runs
    back.save(path)
    assert HTG.load(path).edge_stats(START, "fusion").attempts == 4


def test_prior_upgrade_keeps_experience(tmp_path):
    htg = HTG.from_prior()
    train(htg, ROW, START, "fusion", WIN, 2, tags=["online_softmax", "welford_statistics"])
    htg.save(tmp_path / "htg.json")
    new = tmp_path / "prior2"
    shutil.copytree(PRIOR_DIR, new)
    data = json.loads((new / "strategies.json").read_text())
    data["strategies"] = [s for s in data["strategies"] if s["id"] != "welford_statistics"]
    next(s for s in data["strategies"] if s["id"] == "online_softmax")["text"] += " Revised."
    (new / "strategies.json").write_text(json.dumps(data))
    up = HTG.load(tmp_path / "htg.json", prior_dir=new)
    assert up.strategies["online_softmax"].text.endswith("Revised.")
    assert up.strategy_stats("online_softmax").attempts == 2
    up.save(tmp_path / "htg.json")   # the dropped strategy's record survives for a later prior
    assert json.loads((tmp_path / "htg.json").read_text())["strategies"]["welford_statistics"]


def test_a_file_from_before_fair_step0_rewards_loads_without_its_start_edges(tmp_path):
    """Start edges written when step 0 was rewarded against eager hold the defaults' speedup,
    whatever the direction: an old file still loads, every other record kept, those dropped."""
    htg = HTG.from_prior()
    train(htg, ROW, START, "fusion", WIN, 3, tags=["fuse_row_prologue_epilogue"])
    train(htg, ROW, "fusion", "memory_access", FAIL, 2, tags=["vectorized_16b_access"])
    data = htg.experience_json()
    data.pop("reward")                              # as the code before the mark wrote it
    path = tmp_path / "htg.json"
    path.write_text(json.dumps(data))
    old = HTG.load(path)
    assert old.edge_stats(START, "fusion").attempts == 0
    assert old.edge_stats("fusion", "memory_access").failures == {"compile_error": 2}
    assert old.strategy_stats("fuse_row_prologue_epilogue").attempts == 3
    old.save(path)                                  # saved again: marked, nothing more is dropped
    train(old, ROW, START, "fusion", WIN, 1)
    old.save(path)
    assert HTG.load(path).edge_stats(START, "fusion").attempts == 1


@pytest.mark.parametrize("content", ['{"format": "htg-memory", "version": 1, "edges": {"a',
                                     '{"format": "something-else"}',
                                     '{"format": "htg-memory", "version": 1, "edges": '
                                     '{"start->fusion": {"*": {"attempts": "x"}}}, "strategies": {}}',
                                     "\x00\x01garbage"])
def test_corrupt_memory_is_survived(tmp_path, content):
    path = tmp_path / "htg.json"
    path.write_text(content)
    with pytest.warns(RuntimeWarning, match=str(path)):
        htg = HTG.load(path)
    assert htg.experience_json()["edges"] == {} and len(htg.strategies) >= 30
    assert not path.exists() and (tmp_path / "htg.json.corrupt").read_text() == content
    htg.save(path)   # and the next save writes a good file
    assert HTG.load(path).experience_json()["edges"] == {}


def test_stats_json_round_trip_and_summary():
    s = Stats()
    for o in (WIN, FLAT, FAIL):
        s.add(o)
    assert Stats.from_json(s.to_json()) == s
    assert s.summary()["failures"] == {"compile_error": 1} and s.summary()["correct"] == 2


# --- the proposer's supported strategies --------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_selection_stays_inside_the_supported_strategies(mode):
    """A proposer that supports a subset: over many steps, with exploration, failures, tabu and a
    rewarded direction outside the subset, no direction or strategy outside it is ever chosen."""
    htg = HTG.from_prior()
    supported = {"online_softmax", "warp_per_row", "vectorized_16b_access"}
    allowed = {htg.strategies[s].direction for s in supported}
    train(htg, ROW, START, "fusion", WIN, 20, ["fuse_row_prologue_epilogue"])   # pays, unsupported
    trail, chosen = Trail("t", seed=7), set()
    for step in range(60):
        c = htg.select(ROW, trail, mode, step, supported=supported)
        assert c.direction in allowed and c.strategies, (step, c)
        assert {s.id for s in c.strategies} <= supported, (step, c)
        chosen.add(c.direction)
        outcome = (WIN, FAIL, FLAT)[step % 3]
        # the step's candidate applies its top strategy (crediting every retrieved one alike would
        # leave flat mode's ranking tied on the prior order for ever)
        htg.record(ROW, c.previous, c.direction, [c.strategies[0].id], outcome, mode)
        trail.push(c.direction, outcome.success)
    # every mode still reaches each supported direction: htg and flat by exploration, none by chance
    assert chosen == allowed, (mode, chosen)
    with pytest.raises(ValueError, match="supported"):
        htg.select(ROW, Trail("t"), mode, supported={"cublaslt_epilogue"})   # a GEMM id on a row


# --- where the memory lives ---------------------------------------------------------------------

def test_memory_is_kept_across_a_toolchain_change(tmp_path, monkeypatch):
    """Keyed by arch and proposer: a torch/CUDA upgrade (another toolchain key) loads what was saved
    before, and each proposer has its own experience."""
    from torch_htam import paths
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(paths, "toolchain_key", lambda: "torch2.9.0-cu12.8-nvcc12.8-f1")
    htg = HTG.from_prior()
    train(htg, ROW, START, "reduction_strategy", WIN, 3, ["online_softmax"])
    before = paths.memory_path("sm_90a", "expert")
    htg.save(before)
    assert paths.arch_dir("sm_90a") not in before.parents
    monkeypatch.setattr(paths, "toolchain_key", lambda: "torch2.11.0-cu13.0-nvcc13.0-f1")
    after = paths.memory_path("sm_90a", "expert")
    assert after == before
    assert HTG.load(after).edge_stats(START, "reduction_strategy").attempts == 3
    assert not paths.memory_path("sm_90a", "llm").exists()          # per proposer
    assert paths.memory_path("sm_90", "expert") != before           # per arch


def test_memory_under_the_old_toolchain_dir_is_copied_on_first_use(tmp_path, monkeypatch):
    from torch_htam import paths
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(paths, "toolchain_key", lambda: "torch2.9.0-cu12.8-nvcc12.8-f1")
    htg = HTG.from_prior()
    train(htg, ROW, START, "memory_access", WIN, 2)
    old = htg.save(paths.arch_dir("sm_90a") / "htg.json")          # where it was kept before
    HTG.from_prior().save(tmp_path / "sm_90-torch2.9.0-cu12.8-nvcc12.8-f1" / "htg.json")   # other arch
    monkeypatch.setattr(paths, "toolchain_key", lambda: "torch2.11.0-cu13.0-nvcc13.0-f1")
    new = paths.memory_path("sm_90a", "expert")
    assert new.read_bytes() == old.read_bytes() and old.exists()    # copied, not moved
    assert HTG.load(new).edge_stats(START, "memory_access").attempts == 2
    assert not paths.memory_path("sm_90", "expert").read_text().count("memory_access")
    train(htg, ROW, START, "memory_access", WIN, 1)
    htg.save(new)
    assert HTG.load(paths.memory_path("sm_90a", "expert")).edge_stats(START, "memory_access").attempts == 3
