"""The committed sample_traces/ are exactly what the generator writes today."""

from __future__ import annotations

from pathlib import Path

from traceanalyzer.synth.samples import SAMPLES, default_dest, regenerate

COMMITTED = Path(__file__).resolve().parents[1] / "sample_traces"
MAX_TOTAL_BYTES = 6 * 1024 * 1024


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_default_dest_is_the_repo_folder() -> None:
    assert default_dest() == COMMITTED


def test_samples_have_not_drifted(tmp_path: Path) -> None:
    regenerate(tmp_path)
    for sample in SAMPLES:
        fresh = _files(tmp_path / sample.name)
        committed = _files(COMMITTED / sample.name)
        assert fresh.keys() == committed.keys(), (
            f"{sample.name}: file set drifted; run python -m traceanalyzer.synth.samples"
        )
        for name, data in fresh.items():
            assert committed[name] == data, (
                f"{sample.name}/{name} drifted; run python -m traceanalyzer.synth.samples"
            )


def test_samples_are_small_and_documented() -> None:
    total = sum(p.stat().st_size for p in COMMITTED.rglob("*") if p.is_file())
    assert total <= MAX_TOTAL_BYTES
    readme = (COMMITTED / "README.md").read_text(encoding="utf-8")
    for sample in SAMPLES:
        assert sample.name in readme, f"{sample.name} is not described in sample_traces/README.md"
