"""`run` output: findings table, where the report is, --quiet, --format json, vllm bench TTFT/TPOT."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner
from report_support import SAMPLES

from traceanalyzer.cli import main


def test_run_ends_with_report_location(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main, ["run", str(SAMPLES / "store_stall_2rank_rank1_sick"), "--out", str(out), "-j", "1"]
    )
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == f"report: {out / 'report.html'}"
    assert any(line.startswith("error      store-transfer-stall") for line in lines)
    assert "\x1b[" not in res.stdout  # no colours when stdout is not a TTY
    for name in ("report.html", "report.md", "findings.sarif", "annotations.json"):
        assert (out / name).is_file()
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporaries


def test_quiet_and_json(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main, ["run", str(SAMPLES / "store_healthy"), "--out", str(out), "-q", "-j", "1"]
    )
    assert res.exit_code == 0
    assert "store:" not in res.stdout and "report:" in res.stdout
    res = CliRunner().invoke(
        main, ["run", str(SAMPLES / "store_healthy"), "--out", str(out), "--format", "json"]
    )
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert doc["summary"]["findings"] == 0
    assert (out / "report.html").is_file()


def test_bench_results_show_beside_findings(tmp_path: Path) -> None:
    root = tmp_path / "arm-0.18"
    shutil.copytree(SAMPLES / "store_stall_session_marked", root)
    bench = {"completed": 50, "num_prompts": 50, "mean_ttft_ms": 60939.4, "p99_ttft_ms": 71000.5,
             "mean_tpot_ms": 41.2, "p99_tpot_ms": 55.0}  # fmt: skip
    (root / "bench_result.json").write_text(json.dumps(bench))
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["run", str(root), "--out", str(out), "-q", "-j", "1"])
    assert res.exit_code == 0, res.output
    assert "mean TTFT" in res.stdout and "60939.4" in res.stdout
    html = (out / "report.html").read_text()
    assert "mean TTFT" in html and "60,939.4 ms" in html
    assert "60,939.4" in (out / "report.md").read_text()
