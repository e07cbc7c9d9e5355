"""TRL's generation-backend keys set the real rollout engine (rollout.engine, rollout.vllm.*), and under
rollout.engine vllm the rollout correction is on by default as in TRL, whichever way the engine was chosen."""

import pytest

from grpo.api.inputs import resolve_config
from grpo.config import build_config
from grpo.config.trl import from_trl
from grpo.config.trl_vllm import TRL_VLLM_DEFAULTS, VLLM_KEYS

RECIPE = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.5,
          "vllm_tensor_parallel_size": 2, "vllm_enable_sleep_mode": True, "vllm_max_model_length": 2048,
          "vllm_model_impl": "vllm", "learning_rate": 1e-6, "temperature": 0.9}


def test_a_vllm_recipe_builds_the_vllm_engine_with_its_settings():
    cfg = resolve_config(RECIPE)
    vllm = cfg.rollout.vllm
    assert cfg.rollout.engine == "vllm"
    assert (vllm.mode, vllm.gpu_memory_utilization, vllm.tensor_parallel_size) == ("colocate", 0.5, 2)
    assert (vllm.enable_sleep_mode, vllm.max_model_length, vllm.model_impl) == (True, 2048, "vllm")
    assert (cfg.optim.lr, cfg.rollout.temperature) == (1e-6, 0.9)
    # TRL's vllm_importance_sampling_correction (true), _mode (sequence_mask), _clip_max (3.0), _clip_min (None)
    assert cfg.algorithm.rollout_correction.as_dict() == {"name": "sequence_mask", "min": None, "max": 3.0}


def test_server_mode_keys():
    cfg = resolve_config({"use_vllm": True, "vllm_mode": "server", "vllm_server_host": "10.1.2.3",
                          "vllm_server_port": 8123, "vllm_server_timeout": 30})
    vllm = cfg.rollout.vllm
    assert (vllm.mode, vllm.server_base_url, vllm.server_host, vllm.server_port, vllm.server_timeout) == (
        "server", None, "10.1.2.3", 8123, 30.0)
    cfg = resolve_config({"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": "http://gen:9000"})
    assert cfg.rollout.vllm.server_base_url == "http://gen:9000"


def test_mapping_lines_name_the_engine_keys():
    overrides, lines = from_trl({"use_vllm": True, "vllm_mode": "server", "vllm_group_port": 51217})
    assert overrides == {"rollout.vllm.mode": "server", "rollout.engine": "vllm"}
    assert lines == ["vllm_mode -> rollout.vllm.mode", "vllm_group_port ignored (the NCCL port through which TRL's "
                     "trainer sends weights to its own `trl vllm-serve`; grpo's server mode talks to `grpo vllm-serve` "
                     "at rollout.vllm.server_base_url (or server_host:server_port) and opens no such group)",
                     "use_vllm -> rollout.engine"]


def test_use_vllm_false_is_the_native_engine_and_absent_keeps_the_configured_one():
    overrides, lines = from_trl({"use_vllm": False})
    assert overrides == {"rollout.engine": "native"} and lines == ["use_vllm -> rollout.engine"]
    assert resolve_config({"use_vllm": False}).rollout.engine == "native"          # no vLLM, as the user said
    assert resolve_config({"learning_rate": 1e-6}).rollout.engine == "auto"
    cfg = resolve_config({"use_vllm": False, "rollout": {"engine": "native"}})
    assert (cfg.rollout.engine, cfg.algorithm.rollout_correction) == ("native", "none")


@pytest.mark.parametrize("given, correction", [
    ({"use_vllm": True, "vllm_importance_sampling_correction": False}, "none"),      # TRL's switch off
    ({"use_vllm": True, "vllm_importance_sampling_correction": True}, "sequence_mask"),
    ({"use_vllm": True, "vllm_importance_sampling_mode": "token_truncate"}, "token_truncate"),
    ({"use_vllm": True, "algorithm.rollout_correction": "token_mask"}, "token_mask"),
    ({"use_vllm": True, "algorithm.rollout_correction": "none"}, "none"),           # explicit none wins
    ({"rollout.engine": "vllm"}, "sequence_mask"),                                  # grpo's own key
    ({"rollout": {"engine": "vllm"}}, "sequence_mask"),                            # a YAML section
    ({"rollout": {"engine": "vllm"}, "algorithm": {"rollout_correction": "none"}}, "none"),
    ({"rollout.engine": "auto"}, "none"),            # auto may pick vLLM at run time: the default stays off
    ({"rollout.engine": "native"}, "none"),
    ({"rollout.engine": "transformers"}, "none"),
    ({"vllm_importance_sampling_mode": "sequence_truncate"}, "sequence_truncate"),  # asked for: kept (any engine)
    ({}, "none"),
])
def test_rollout_correction_is_on_by_default_under_the_vllm_engine(given, correction):
    assert resolve_config(given).algorithm.rollout_correction == correction


def test_the_default_applies_to_flags_and_overrides_too():
    assert build_config(overrides={"rollout.engine": "vllm"}).algorithm.rollout_correction == "sequence_mask"
    assert build_config({"rollout": {"engine": "vllm"}}, {"algorithm.rollout_correction": "token_mask"}
                        ).algorithm.rollout_correction == "token_mask"
    bounds = build_config(overrides={"rollout.engine": "vllm", "algorithm.rollout_correction_max": 2.0,
                                     "algorithm.rollout_correction_min": 0.5}).algorithm
    assert bounds.rollout_correction.as_dict() == {"name": "sequence_mask", "min": 0.5, "max": 2.0}
    from grpo.cli.common import resolve_given

    cfg = resolve_given(None, ["--use_vllm", "--vllm_mode", "server", "--vllm_server_port", "8011"], {})
    assert (cfg.rollout.engine, cfg.rollout.vllm.mode, cfg.rollout.vllm.server_port) == ("vllm", "server", 8011)
    assert cfg.algorithm.rollout_correction == "sequence_mask"
    cfg = resolve_given(None, ["--rollout.engine", "vllm", "--no_vllm_importance_sampling_correction"], {})
    assert (cfg.rollout.engine, cfg.algorithm.rollout_correction) == ("vllm", "none")


def test_trl_defaults_of_the_vllm_keys_are_ours_or_change_no_result():
    """TRL_VLLM_DEFAULTS mapped give grpo's defaults but for model_impl, server_host and max_model_length (sized
    here), as trl_vllm.py's docstring and trl_object.py's note say."""
    given = {k: v for k, v in TRL_VLLM_DEFAULTS.items() if k in VLLM_KEYS}
    differ = {k for k, v in from_trl(given)[0].items()
              if v != getattr(build_config().rollout.vllm, k.rpartition(".")[2])}
    assert differ == {"rollout.vllm.model_impl", "rollout.vllm.server_host"}
