import json

import pytest

from plateauscope.errors import ConfigError
from plateauscope.model.config import ModelConfig, TrainConfig
from plateauscope.runs.config import RunConfig
from plateauscope.runs.presets import PRESETS, get_preset
from plateauscope.tasks.selector_config import TaskConfig


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_round_trips_through_json(name):
    cfg = PRESETS[name]
    back = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg
    cfg.validate()


@pytest.mark.parametrize("cls", [TaskConfig, ModelConfig, TrainConfig])
def test_sub_configs_round_trip(cls):
    assert cls.from_dict(cls().to_dict()) == cls()


def test_unknown_field_is_one_clear_error():
    with pytest.raises(ConfigError, match="unknown field.*n_bases"):
        TaskConfig.from_dict({"n_bases": 3})


def test_replace_routes_flat_overrides():
    cfg = get_preset("ci").replace(K=3, lr=3e-3, seed=7)
    assert cfg.task.K == 3 and cfg.train.lr == 3e-3
    assert cfg.model.seed == 7 and cfg.train.seed == 7 and cfg.task.seed == get_preset("ci").task.seed
    with pytest.raises(ConfigError, match="no option named 'Kay': the selector task has n_b, K, "):
        cfg.replace(Kay=3)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        get_preset("nope")


def test_paper_preset_size():
    """The paper's code: 4 layers, d_model 128, 4 heads of 32, d_mlp 512 -> about 0.8M parameters."""
    from plateauscope.model.backend import build_model
    from plateauscope.tasks.selector import SelectorTask


    cfg = PRESETS["paper"]
    task = SelectorTask.generate(cfg.task)
    model = build_model(task.hooked_config(cfg.model), seed=0)
    n = sum(p.numel() for p in model.parameters())
    assert 0.75e6 < n < 0.85e6
