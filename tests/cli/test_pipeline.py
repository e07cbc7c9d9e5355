"""`grpo pipeline`: stages in order with ${stage.output} references, a status file, skipped finished
stages on a rerun, the eval table, and one-line errors for a bad recipe."""

import json

import pytest
import yaml

from grpo.cli.main import main
from grpo.cli.pipeline import flags
from tests.run_helpers import make_micro_dir


def test_args_become_flags_with_references_filled_in():
    assert flags({"model": "${a.output}", "reward": ["x", "y"], "maj": True, "dedupe": False, "k": 4},
                 {"a": "runs/a/checkpoint-3"}) == ["--model", "runs/a/checkpoint-3", "--reward", "x", "--reward", "y",
                                                   "--maj", "--k", "4"]


def test_sft_grpo_eval_pipeline_runs_then_skips_finished_stages(tmp_path, capsys):
    model = make_micro_dir(tmp_path / "micro")
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"prompt": f"{a}+1=", "completion": f"<think></think><answer>{a + 1}</answer>"})
                           + "\n" for a in range(8)))
    small = {"cpu.num_threads": 1, "log.progress_bar": "false"}
    recipe = {"output_dir": str(tmp_path / "run"), "stages": [
        {"name": "cold", "kind": "sft", "args": {"model": str(model), "dataset": str(sft), "max-steps": 2, **small}},
        {"name": "rl", "kind": "grpo", "args": {"model": "${cold.output}", "max-steps": 1,
                                                 "rollout.num_generations": 2, "train.prompts_per_step": 2,
                                                 "rollout.max_new_tokens": 4, **small}},
        {"name": "test", "kind": "eval", "args": {"model": "${rl.output}", "problems": 2, "max-new-tokens": 4}},
    ]}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["pipeline", str(path)]) == 0
    status = json.loads((tmp_path / "run" / "pipeline.json").read_text())["stages"]
    assert [s["status"] for s in status.values()] == ["done"] * 3
    assert status["cold"]["output"].endswith("cold/checkpoint-2") and status["rl"]["output"].endswith("rl/checkpoint-1")
    argv = status["rl"]["argv"]
    assert argv[0] == "train" and argv[argv.index("--model") + 1] == status["cold"]["output"]
    out = capsys.readouterr().out
    assert "| stage | pass@1 |" in out and "| test |" in out
    assert main(["pipeline", str(path)]) == 0                                  # everything done: all skipped
    assert capsys.readouterr().out.count("done, skipped") == 3


@pytest.mark.parametrize("stages,message", [
    ([{"name": "a", "kind": "eval", "args": {"model": "${b.output}"}}, {"name": "b", "kind": "sft"}],
     "stage 1 'a': refers to 'b', which is not an earlier stage"),
    ([{"name": "a", "kind": "eval", "args": {"model": "${zz.output}"}}], "refers to 'zz', which is not an earlier stage"),
    ([{"name": "a", "kind": "train"}], "stage 1 'a': kind must be one of sft | grpo | sample | eval | reward_model"),
    ([{"name": "a", "kind": "eval"}, {"name": "a", "kind": "eval"}], "stage 2 'a': the name is used twice"),
    ([], "'stages' must be a non-empty list"),
])
def test_a_bad_recipe_is_one_line_exit_2(tmp_path, capsys, stages, message):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "o"), "stages": stages}))
    assert main(["pipeline", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}:") and message in err and len(err.splitlines()) == 1


def test_an_interrupted_stage_resumes_from_its_checkpoint(tmp_path, capsys):
    """A stage left `running` in pipeline.json (the process died) is rerun with --resume: a grpo stage
    continues from its newest checkpoint instead of starting again."""
    model = make_micro_dir(tmp_path / "micro")
    small = {"cpu.num_threads": 1, "log.progress_bar": "false", "rollout.num_generations": 2,
             "train.prompts_per_step": 2, "rollout.max_new_tokens": 4, "train.save_steps": 1}
    run = tmp_path / "run"
    assert main(["train", "--model", str(model), "--max-steps", "1", "--output-dir", str(run / "rl"),
                 *[x for k, v in small.items() for x in (f"--{k}", str(v))]]) == 0      # step 1 done, then "killed"
    (run / "pipeline.json").write_text(json.dumps({"stages": {"rl": {"kind": "grpo", "status": "running"}}}))
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(run), "stages": [
        {"name": "rl", "kind": "grpo", "args": {"model": str(model), "max-steps": 2, **small}}]}))
    assert main(["pipeline", str(path)]) == 0
    assert "stage rl (grpo) resumed" in capsys.readouterr().out
    steps = [json.loads(x)["step"] for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2] and (run / "rl" / "checkpoint-2").is_dir()


def test_task_data_and_merge_stages_write_jsonl_without_a_model(tmp_path, capsys):
    from grpo.data.tasks import strings

    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "run"), "stages": [
        {"name": "a", "kind": "task_data", "args": {"task": "arithmetic", "rows": 30, "worked_fraction": 1.0}},
        {"name": "s", "kind": "task_data", "args": {"task": "strings", "rows": 20, "worked_fraction": 0.0, "seed": 3}},
        {"name": "mix", "kind": "merge", "args": {"inputs": ["${a.output}", "${s.output}"], "seed": 1}}]}))
    assert main(["pipeline", str(path)]) == 0
    run = tmp_path / "run"
    rows = [json.loads(x) for x in (run / "s" / "rows.jsonl").read_text().splitlines()]
    assert rows == strings.sft_examples(20, seed=3, worked_fraction=0.0)
    assert all(r["completion"].startswith("<think></think>") for r in rows)
    merged = [json.loads(x) for x in (run / "mix" / "merged.jsonl").read_text().splitlines()]
    arith = [json.loads(x) for x in (run / "a" / "rows.jsonl").read_text().splitlines()]
    assert len(merged) == 50 and merged != arith + rows                        # shuffled ...
    key = lambda r: json.dumps(r, sort_keys=True)                              # noqa: E731
    assert sorted(map(key, merged)) == sorted(map(key, arith + rows))          # ... and nothing lost
    status = json.loads((run / "pipeline.json").read_text())["stages"]
    assert status["mix"] == {"kind": "merge", "status": "done", "output": str(run / "mix" / "merged.jsonl"),
                             "spec": {"kind": "merge", "args": {"inputs": ["${a.output}", "${s.output}"], "seed": 1}}}


def test_the_domain_table_puts_each_model_on_a_row_and_each_domain_in_a_column(tmp_path):
    from grpo.cli.pipeline import domain_table

    stages = [{"name": f"e_{m}_{d}", "kind": "eval", "args": {"model": "${%s.output}" % m, "task": d}}
              for m in ("cold", "rl") for d in ("arithmetic", "strings")]
    for i, s in enumerate(stages):
        (tmp_path / s["name"]).mkdir()
        (tmp_path / s["name"] / "summary.json").write_text(json.dumps({"pass@1": i / 10}))
    assert domain_table(tmp_path, stages).splitlines()[2:] == ["| cold | 0.000 | 0.100 |", "| rl | 0.200 | 0.300 |"]
    assert domain_table(tmp_path, stages[:1]) is None                          # one domain: no pivot


def test_the_r1_preset_prints_a_recipe_that_passes_the_checks(tmp_path, capsys):
    from grpo.cli.pipeline import check_recipe

    assert main(["pipeline", "--preset", "r1", "--out", str(tmp_path / "r1"), "--print-recipe"]) == 0
    recipe = yaml.safe_load(capsys.readouterr().out)
    out, stages = check_recipe(recipe, "printed")
    kinds = [s["kind"] for s in stages]
    assert out == tmp_path / "r1" and kinds.count("grpo") == 3 and kinds.count("eval") == 10
    rl = [s["args"].get("data.task") for s in stages if s["kind"] == "grpo"]
    assert rl == ["arithmetic", "strings", None]                   # GRPO per domain, then on the mixed prompts
    distill = next(s for s in stages if s["name"] == "distill")
    assert distill["args"]["model"] == "${cold.output}" and distill["args"]["dataset"] == "${distill_data.output}"
    names = [s["name"] for s in stages]
    assert names.index("eval_cold_strings") < names.index("rl_arithmetic")     # each model evaluated once trained
    assert main(["pipeline", "--preset", "r2"]) == 2
    assert "unknown pipeline preset 'r2'; choose from r1" in capsys.readouterr().err
    assert main(["pipeline"]) == 2 and "give a recipe file or --preset" in capsys.readouterr().err


@pytest.mark.slow
def test_the_r1_preset_runs_end_to_end_at_the_small_size(tmp_path, capsys):
    """`grpo pipeline --preset r1 --size small`: every stage runs, the per-domain table is printed and
    written; a rerun skips everything. (The full size's numbers: docs/results.md.)"""
    out = tmp_path / "r1"
    assert main(["pipeline", "--preset", "r1", "--size", "small", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    status = json.loads((out / "pipeline.json").read_text())["stages"]
    assert len(status) == 22 and all(s["status"] == "done" for s in status.values())
    table = (out / "domains.md").read_text().splitlines()
    assert table[0] == "| model (pass@1, held-out) | arithmetic | strings |"
    assert [row.split("|")[1].strip() for row in table[2:]] == ["cold", "rl_arithmetic", "rl_strings", "distill", "rl_all"]
    assert "| distill |" in printed
    samples = [json.loads(x) for x in (out / "distill_data" / "merged.jsonl").read_text().splitlines()]
    assert samples and all(set(r) <= {"prompt", "completion", "answer"} for r in samples)
    assert main(["pipeline", "--preset", "r1", "--size", "small", "--out", str(out)]) == 0
    assert capsys.readouterr().out.count("done, skipped") == 22
