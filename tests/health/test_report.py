"""grpo/health/report.py and `grpo report`: one self-contained HTML file with every section, curves of several
runs overlaid, bad run directories as one-line errors; the slow test renders it in headless Chromium."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from grpo.cli.main import main
from grpo.health.report import ReportError, write_report
from tests.health.test_rules import DEMO, healthy

IMG = re.compile(r'<img alt="([^"]*)"(?: title="([^"]*)")? src="data:image/png;base64,([^"]+)">')


def make_run(directory: Path, records: list[dict], alerts: list[dict] | None = None, samples=True) -> Path:
    directory.mkdir(parents=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if alerts is not None:
        (directory / "alerts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in alerts))
    (directory / "config.yaml").write_text(yaml.safe_dump({"optim": {"lr": 3e-5}, "rollout": {"num_generations": 16}}))
    if samples:
        rows = [{"step": s, "group": 0, "kind": kind, "prompt": "1+2=", "completion": f"<answer>{3 if kind == 'best' else 4}"
                 "</answer>", "total": 1.0 if kind == "best" else 0.0, "rewards": {"accuracy": 1.0}, "advantage": 0.7}
                for s in (1, 2, 3) for kind in ("best", "worst")]
        (directory / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


def demo_records() -> list[dict]:
    return [json.loads(line) for line in DEMO.read_text().splitlines()]


def test_a_report_holds_every_section_with_images_inline(tmp_path):
    alert = {"step": 42, "rule": "truncation", "severity": "warn", "message": "20% of completions hit the cap",
             "advice": "raise rollout.max_new_tokens", "keys": ["rollout.max_new_tokens"], "value": 0.2}
    run = make_run(tmp_path / "demo", demo_records(), [alert])
    page = write_report([run]).read_text()
    assert (run / "report.html").is_file()
    images = IMG.findall(page)
    assert len(images) == 11 == page.count("<img")   # 9 curve panels (no eval in the demo), time split, alert timeline
    for _, _, data in images:
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r'(src|href)="(http|//)', page)             # nothing fetched: opens offline
    for text in ("20% of completions hit the cap", "raise rollout.max_new_tokens", "optim.lr", "3e-05",
                 "rollout.num_generations", "&lt;answer&gt;3&lt;/answer&gt;", "policy update", "reward/accuracy/mean"):
        assert text in page, text
    assert {"step 1", "step 2", "step 3"} <= set(re.findall(r"step \d+", page))


def test_two_runs_are_overlaid_in_one_report(tmp_path):
    a = make_run(tmp_path / "a" / "run", demo_records())
    b = make_run(tmp_path / "b" / "run", healthy(60).records, samples=False)
    out = tmp_path / "cmp.html"
    assert main(["report", str(a), str(b), "--out", str(out)]) == 0
    titles = {alt: title for alt, title, _ in IMG.findall(out.read_text())}
    lines = titles["completion length"].split("; ")
    assert lines == [f"{a}: completion/length_mean", f"{b}: completion/length_mean"]    # one line per run, overlaid
    assert not (a / "report.html").exists()


def test_a_run_without_alerts_file_is_checked_afresh(tmp_path):
    records = healthy(60, **{"advantages/zero_std_frac": 0.9}).records
    page = write_report([make_run(tmp_path / "old", records, alerts=None)]).read_text()
    assert "dead_groups" in page and "critical" in page


def test_bad_run_directories_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(ReportError, match="metrics.jsonl: no such file"):
        write_report([tmp_path])
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'missing'}: not a run directory\n"
    run = make_run(tmp_path / "torn", demo_records()[:3])
    (run / "metrics.jsonl").open("a").write("{not json\n")
    assert main(["report", str(run)]) == 2
    assert capsys.readouterr().err == f"error: {run / 'metrics.jsonl'}:4: not valid JSON\n"
    assert main(["report", str(run), "--sample-steps", "a,b"]) == 2


@pytest.mark.slow
def test_the_report_renders_in_headless_chromium_with_every_image(tmp_path):
    """Debian's chromium (installed by .ci/run) loads the file offline; the page's script counts decoded images."""
    browser = shutil.which("chromium")
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing on CI (.ci/run installs Debian's chromium package)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    alert = {"step": 40, "rule": "dead_groups", "severity": "critical", "message": "m", "advice": "a", "keys": []}
    a = make_run(tmp_path / "a", demo_records(), [alert])
    b = make_run(tmp_path / "b", healthy(60).records)
    page = write_report([a, b])
    total = page.read_text().count("<img")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert f'data-images-ok="{total}/{total}"' in dom, dom[:300]
    shot = tmp_path / "report.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,2000",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 20_000          # a page with pictures, not a blank one
