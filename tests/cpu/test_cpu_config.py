"""The `cpu` config section: the CPU runtime's keys, their old names as aliases, and old runs' saved configs."""

import pytest
import yaml

from grpo.config import ConfigError, build_config, to_dict
from grpo.config.build import load_yaml, valid_keys
from grpo.config import aliases
from grpo.config.cpu import OLD_KEYS

MOVED = ["train.num_threads", "model.cpu_matmul", "rollout.decode_kernel", "train.grad_in_place", "train.grad_kernel",
         "train.elementwise_kernel", "train.attention_kernel", "train.mmap_threshold_mb", "train.malloc_trim",
         "train.huge_pages", "train.grad_buffer"]


def test_the_section_holds_the_eleven_keys_and_the_old_ones_are_gone():
    keys = valid_keys()
    assert [k for k in keys if k.startswith("cpu.")] == [f"cpu.{k.split('.')[1]}" for k in MOVED]
    assert sorted(OLD_KEYS) == sorted(MOVED) and not set(MOVED) & set(keys)
    assert all(aliases.RENAMED[old] == new for old, new in OLD_KEYS.items())   # grpo.config.aliases renames them
    cfg = build_config()
    assert (cfg.cpu.num_threads, cfg.cpu.cpu_matmul, cfg.cpu.decode_kernel, cfg.cpu.mmap_threshold_mb) == \
        (0, "auto", "auto", 0.0)                                            # the old keys' defaults
    assert cfg.cpu.grad_in_place is cfg.cpu.malloc_trim is cfg.cpu.huge_pages is cfg.cpu.grad_buffer is True


def test_an_old_name_sets_the_new_key_and_says_so_once(capsys, monkeypatch):
    monkeypatch.setattr(aliases, "PRINTED", set())                        # each pointer is printed once per process
    cfg = build_config(overrides={"train.num_threads": 3, "model.cpu_matmul": "aten"})
    assert cfg.cpu.num_threads == 3 and cfg.cpu.cpu_matmul == "aten"
    err = capsys.readouterr().err.splitlines()
    assert err == ["grpo: train.num_threads is now cpu.num_threads", "grpo: model.cpu_matmul is now cpu.cpu_matmul"]
    assert build_config(overrides={"cpu.num_threads": 2, "train.num_threads": 4}).cpu.num_threads == 4   # later wins
    assert build_config(overrides={"cpu.num_threads": 2}).cpu.num_threads == 2
    assert capsys.readouterr().err == ""                                   # the new name, or a pointer given before


def test_old_names_in_a_yaml_file_and_the_new_key_winning(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(aliases, "PRINTED", set())
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"train": {"max_steps": 3, "grad_kernel": "onednn", "mmap_threshold_mb": 0.25},
                                    "rollout": {"decode_kernel": "onednn"}, "cpu": {"mmap_threshold_mb": 1.0}},
                                   sort_keys=False))
    cfg = build_config(load_yaml(path), {"train.huge_pages": False})
    assert (cfg.train.max_steps, cfg.cpu.grad_kernel, cfg.cpu.decode_kernel) == (3, "onednn", "onednn")
    assert cfg.cpu.mmap_threshold_mb == 1.0                                # its new name, given later, wins
    assert cfg.cpu.huge_pages is False
    assert sorted(capsys.readouterr().err.splitlines()) == sorted(
        f"grpo: {old} is now {OLD_KEYS[old]}" for old in ("train.grad_kernel", "train.mmap_threshold_mb",
                                                          "rollout.decode_kernel", "train.huge_pages"))


def test_values_are_checked_under_the_new_names():
    with pytest.raises(ConfigError, match="cpu.num_threads must be >= 0"):
        build_config(overrides={"train.num_threads": -1})
    with pytest.raises(ConfigError, match=r"cpu.cpu_matmul must be auto \| onednn \| aten"):
        build_config(overrides={"cpu.cpu_matmul": "mkl"})
    with pytest.raises(ConfigError, match="unknown config key 'cpu.threads'"):
        build_config(overrides={"cpu.threads": 1})


def test_an_old_runs_saved_config_compares_equal_after_the_move(tmp_path):
    """A checkpoint's config written before the move (old names) resumes with no change and no refusal; a real
    change of a moved key is still reported, under its new name."""
    from grpo.state.resume import config_changes
    from grpo.state.resume_config import flat_config, refused_change

    cfg = build_config(overrides={"cpu.num_threads": 2, "cpu.grad_kernel": "onednn"})
    saved = to_dict(cfg)
    old = {section: dict(values) for section, values in saved.items() if isinstance(values, dict)}
    for dotted in MOVED:                                                   # as an older run wrote config.yaml
        section, key = dotted.split(".")
        old[section][key] = old["cpu"][key]
    del old["cpu"]
    upgraded = aliases.rewrite_tree(old, quiet=True)
    assert upgraded["cpu"] == saved["cpu"] and "num_threads" not in upgraded["train"]
    assert flat_config(old) == flat_config(saved)
    assert config_changes(old, cfg) == [] and refused_change(old, cfg, tmp_path) is None
    old["train"]["num_threads"] = 1
    assert config_changes(old, cfg) == ["cpu.num_threads: 1 -> 2"]
