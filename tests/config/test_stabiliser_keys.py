"""Config keys of DeepSeek-V3.2's stabilisers and TIS / MIS (grpo/config/schema.py, checks.py)."""

import pytest

from grpo.config import ConfigError, build_config


def test_keys_build_with_their_values_and_defaults_are_off():
    default = build_config().algorithm
    assert (default.kl_ratio_correction, default.off_policy_mask.as_dict(), default.rollout_correction,
            default.beta_by_domain, default.domain_column) == (False, {"name": "kl", "threshold": None}, "none", {},
                                                               "domain")
    cfg = build_config({"algorithm": {"kl_ratio_correction": True, "off_policy_mask": {"name": "kl", "threshold": 0.5},
                                      "beta_by_domain": {"math": 0.04, "code": 0}, "domain_column": "kind",
                                      "rollout_correction": "sequence_mask", "rollout_correction_max": 2}}).algorithm
    assert (cfg.kl_ratio_correction, cfg.off_policy_mask.params.threshold, cfg.beta_by_domain, cfg.domain_column,
            cfg.rollout_correction.name, cfg.rollout_correction.params.max) == (True, 0.5, {"math": 0.04, "code": 0.0},
                                                                                "kind", "sequence_mask", 2.0)


@pytest.mark.parametrize("values, message", [
    ({"rollout_correction": "tis"}, "algorithm.rollout_correction must be one of \\['none', 'sequence_mask'"),
    ({"off_policy_mask_measure": "js"}, "algorithm.off_policy_mask must be one of \\['kl', 'ratio'\\], got 'js'"),
    ({"off_policy_mask_measure": "ratio", "off_policy_mask_threshold": 0.5},
     "algorithm.off_policy_mask.threshold must be > 1 \\(or empty\\) \\(ratio\\)"),
    ({"off_policy_mask": {"name": "kl", "delta": 0.5}},
     "unknown parameter 'algorithm.off_policy_mask.delta': algorithm.off_policy_mask kl takes threshold"),
    ({"rollout_correction": {"name": "token_mask", "min": 2.0, "max": 1.0}},
     "algorithm.rollout_correction.min must be >= 0 and below max \\(token_mask\\)"),
    ({"beta_by_domain": {"math": -0.1}}, "beta_by_domain values must be >= 0"),
    ({"beta_by_domain": {"math": 0.04}, "beta": 0.0}, "beta_by_domain needs algorithm.beta > 0"),
])
def test_bad_values_are_one_line_errors(values, message):
    with pytest.raises(ConfigError, match=message):
        build_config({"algorithm": values})


def test_dsv32_preset():
    cfg = build_config(overrides={"algorithm.preset": "dsv32"}).algorithm
    assert (cfg.kl_ratio_correction, cfg.off_policy_mask.as_dict(), cfg.advantage.params.scale_rewards) == \
        (True, {"name": "kl", "threshold": 0.5}, "none")
