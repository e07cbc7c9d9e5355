"""grpo.cli.sft: `grpo sft --help` shows both modes' options (the dataset mode's and the cold start's), whatever
else is on the command line."""

import re

from grpo.cli.main import main


def test_help_shows_the_dataset_mode_and_the_cold_start_options(capsys):
    assert main(["sft", "--help"]) == 0
    out = capsys.readouterr().out
    dataset, _, cold = out.partition("without a dataset (the embedded cold start")
    for flag in ("--model MODEL", "--dataset DATASET", "--output-dir OUTPUT_DIR", "--max-steps MAX_STEPS", "--resume",
                 "--config CONFIG", "--section.key VALUE"):
        assert re.search(rf"^  {re.escape(flag)}", dataset, re.M), flag
    for flag in ("--out OUT", "--steps STEPS", "--batch-size BATCH_SIZE", "--lr LR", "--task {arithmetic,calculator}",
                 "--num-examples NUM_EXAMPLES", "--threads THREADS", "-h, --help"):
        assert re.search(rf"^  {re.escape(flag)}", cold, re.M), flag
    assert out.count("-h, --help") == 1 and "(default: 1000)" in cold
    assert out.startswith("usage: grpo sft --dataset FILE [--model DIR]")
    assert "grpo sft --out ./cold-start --steps 1000" in out


def test_the_same_help_with_either_mode_s_flags(capsys):
    main(["sft", "--help"])
    plain = capsys.readouterr().out
    for argv in (["sft", "--dataset", "x.jsonl", "--help"], ["sft", "--out", "x", "-h"]):
        assert main(argv) == 0
        assert capsys.readouterr().out == plain
