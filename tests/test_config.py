"""OptimizeConfig: every field validated when the config is made, in one line naming the field,
the bad value and what is allowed."""
import dataclasses
import math

import pytest

from torch_htam.config import OptimizeConfig


@pytest.mark.parametrize("kw", [
    dict(time_budget_s=-5), dict(time_budget_s=math.inf), dict(max_tasks=-3), dict(max_tasks=2.0),
    dict(task_time_s=0), dict(steps=-1), dict(steps=2.5), dict(steps="3"), dict(steps=True),
    dict(candidates_per_step=0), dict(compile="no"), dict(use_llm=1), dict(search=None),
    dict(progress="yes"), dict(check_end_to_end=0), dict(min_speedup=math.nan),
    dict(min_speedup=0.9), dict(min_speedup="1.1"), dict(mode="fast"), dict(memory="graph"),
    dict(trajectory_dir=3), dict(extra=None),
    dict(dynamic={0: {0: (0, 64)}}), dict(dynamic={0: {0: (65, 64)}}), dict(dynamic={0: {0: (1.0, 64)}}),
    dict(dynamic={0: (1, 64)}), dict(dynamic={-1: {0: (1, 64)}}), dict(dynamic={"x": {0: (1, 64)}}),
    dict(dynamic={0: {0: (1, 64, 2)}}), dict(dynamic=[(1, 64)]),
], ids=lambda kw: "{}={!r}".format(*next(iter(kw.items()))))
def test_a_bad_value_is_one_line_naming_field_value_and_what_is_allowed(kw):
    (name, value), = kw.items()
    with pytest.raises(ValueError) as info:
        OptimizeConfig(**kw)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"OptimizeConfig.{name}={value!r}: must be ")
    assert info.value.field == name and info.value.value is value   # for the CLI to name its flag


def test_the_allowed_mode_list_is_torch_compiles():
    from torch_htam.inductor import MODES
    with pytest.raises(ValueError) as info:
        OptimizeConfig(mode="fast")
    assert all(repr(m) in str(info.value) for m in MODES)


@pytest.mark.parametrize("kw", [
    dict(), dict(steps=0), dict(time_budget_s=300), dict(time_budget_s=0.5), dict(task_time_s=None),
    dict(max_tasks=1), dict(min_speedup=1), dict(mode="reduce-overhead"), dict(memory="none"),
    dict(trajectory_dir="/tmp/t"), dict(compile=False, search=False, use_llm=True),
    dict(dynamic=None), dict(dynamic={0: {0: (1, 64), 1: [1, 2048]}, 2: {0: (8, 8)}}),
])
def test_good_values_pass(kw):
    cfg = OptimizeConfig(**kw)
    assert dataclasses.replace(cfg) == cfg   # replace() validates again and agrees


def test_numpy_numbers_are_numbers():
    np = pytest.importorskip("numpy")
    OptimizeConfig(steps=np.int64(2), time_budget_s=np.float64(30.0))
    with pytest.raises(ValueError, match="steps"):
        OptimizeConfig(steps=np.float64(2.0))


def test_every_field_has_a_rule():
    """A field added without a row in RULES would pass unchecked."""
    from torch_htam.config import RULES
    assert {f.name for f in dataclasses.fields(OptimizeConfig)} == set(RULES)


def test_a_bad_value_set_later_is_caught_by_replace():
    cfg = OptimizeConfig()
    with pytest.raises(ValueError, match="steps"):
        dataclasses.replace(cfg, steps=-1)
