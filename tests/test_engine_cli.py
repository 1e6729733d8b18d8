"""`traceanalyzer rules ...`: list, explain, new -> test round trip, docs/rules.md freshness."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from traceanalyzer.authoring.cli import rules_group
from traceanalyzer.authoring.docs import render_markdown
from traceanalyzer.engine.loader import builtin_rules_dir, load_rules

ROOT = Path(__file__).resolve().parents[1]


def invoke(*args):
    return CliRunner().invoke(rules_group, list(args), catch_exceptions=False)


def test_list_shows_builtin_rules():
    result = invoke("list")
    assert result.exit_code == 0
    assert "TA001  capture-memcpy-growth" in result.output
    assert "TA002  store-transfer-stall" in result.output


def test_explain_by_name_and_id():
    by_name = invoke("explain", "store-transfer-stall")
    assert by_name.exit_code == 0
    for text in ("What it detects", "How to fix", "span_source = 'auto'", "collect with"):
        assert text in by_name.output
    assert invoke("explain", "TA002").output == by_name.output
    missing = CliRunner().invoke(rules_group, ["explain", "nope"])
    assert missing.exit_code != 0 and "unknown rule 'nope'" in missing.output


def test_new_scaffold_passes_its_own_tests(tmp_path):
    folder = tmp_path / "myrules"
    created = invoke("new", "slow-sync", "--rules", str(folder))
    assert created.exit_code == 0, created.output
    assert (folder / "slow_sync.py").is_file() and (folder / "fixtures" / "slow_sync.py").is_file()
    tested = invoke("test", "slow-sync", "--rules", str(folder), "-v")
    assert tested.exit_code == 0, tested.output
    assert "PASS slow-sync::fire_one_slow_call" in tested.output
    assert (folder / "fixtures" / "snapshots" / "slow-sync" / "fire_one_slow_call.txt").is_file()
    again = CliRunner().invoke(rules_group, ["new", "slow-sync", "--rules", str(folder)])
    assert again.exit_code == 2 and "a rule named 'slow-sync' already exists" in again.output
    listed = invoke("list", "--rules", str(folder))
    assert "TA100  slow-sync" in listed.output


def test_rules_test_with_a_folder_tests_that_folder_unless_all(tmp_path, monkeypatch):
    folder = tmp_path / "myrules"
    invoke("new", "slow-sync", "--rules", str(folder))
    mine = invoke("test", "--rules", str(folder))
    assert mine.exit_code == 0 and "(1 rule(s))" in mine.output, mine.output
    # which rules --all hands to the fixture runner (the built-ins' fixtures run elsewhere)
    import traceanalyzer.authoring.cli as authoring_cli

    tested: list[str] = []

    def recorded(rules, **_):
        tested.extend(r.name for r in rules)
        return [], []

    monkeypatch.setattr(authoring_cli, "run_rule_fixtures", recorded)
    every = invoke("test", "--rules", str(folder), "--all")
    builtin = {r.name for r in load_rules(entry_points=False).rules}
    assert every.exit_code == 0, every.output
    assert set(tested) == builtin | {"slow-sync"}


def test_rules_test_fails_on_broken_fixture_and_snapshot_drift(tmp_path):
    folder = tmp_path / "r"
    invoke("new", "slow-sync", "--dir", str(folder))
    invoke("test", "slow-sync", "--rules", str(folder))  # writes snapshots
    snap = folder / "fixtures" / "snapshots" / "slow-sync" / "fire_one_slow_call.txt"
    snap.write_text("something else\n")
    drift = CliRunner().invoke(rules_group, ["test", "slow-sync", "--rules", str(folder)])
    assert drift.exit_code == 1 and "finding text differs" in drift.output
    accepted = invoke("test", "slow-sync", "--rules", str(folder), "--update-snapshots")
    assert accepted.exit_code == 0
    fixtures = folder / "fixtures" / "slow_sync.py"
    fixtures.write_text(fixtures.read_text().replace("[50, 60, 70]", "[50, 60_000, 70]"))
    silent_broken = CliRunner().invoke(rules_group, ["test", "slow-sync", "--rules", str(folder)])
    assert silent_broken.exit_code == 1
    assert "FAIL slow-sync::silent_all_fast" in silent_broken.output


def test_rules_test_requires_two_fire_and_two_silent(tmp_path):
    folder = tmp_path / "r"
    invoke("new", "thin-rule", "--dir", str(folder))
    fixtures = folder / "fixtures" / "thin_rule.py"
    fixtures.write_text(
        fixtures.read_text().replace(
            '@fixture(expect="silent")\ndef silent_all_fast', "def silent_all_fast"
        )
    )
    result = CliRunner().invoke(rules_group, ["test", "thin-rule", "--rules", str(folder)])
    assert result.exit_code == 1
    assert "thin-rule: 1 silent fixture(s), need at least 2" in result.output


def test_builtin_rules_are_found_in_the_checkout():
    assert builtin_rules_dir() == ROOT / "rules"


def test_docs_rules_md_is_current():
    expected = render_markdown(load_rules(entry_points=False).rules)
    current = (ROOT / "docs" / "rules.md").read_text("utf-8")
    assert current == expected, "regenerate: python -m traceanalyzer.authoring.docs > docs/rules.md"


def test_docs_serving_md_lists_every_step_parameter():
    from traceanalyzer.authoring.docs import serving_markdown

    current = (ROOT / "docs" / "serving.md").read_text("utf-8")
    assert current == serving_markdown(current), (
        "regenerate: python -m traceanalyzer.authoring.docs --serving"
    )


def test_rule_dirs_in_config_and_new_ids_that_collide_with_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def created_id(*args):
        result = invoke("new", *args)
        assert result.exit_code == 0, result.output
        (line,) = [
            x for x in result.output.splitlines() if x.startswith("created") and "fix" not in x
        ]
        rule_file = Path(line.split()[1])
        return rule_file.read_text().split('id="')[1].split('"')[0]

    assert created_id("first-rule", "--dir", "a") == "TA100"
    (tmp_path / "traceanalyzer.toml").write_text('rule_dirs = ["a"]\n')
    assert "TA100  first-rule" in invoke("list").output  # loaded from the config's rule_dirs
    assert created_id("second-rule", "--dir", "b") == "TA101"
    assert created_id("third-rule", "--dir", "c", "--rules", "b") == "TA102"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "broken.py").write_text('rule(id="TA103", name=  # does not load\n')
    assert created_id("fourth-rule", "--dir", "d", "--rules", "b", "--rules", "c") == "TA104"
    taken = CliRunner().invoke(rules_group, ["new", "fifth-rule", "--dir", "e", "--id", "TA100"])
    assert taken.exit_code == 2 and "--id TA100 is already used by rule TA100" in taken.output


def test_rules_show_severity_escalation() -> None:
    listed = invoke("list").output
    (line,) = [x for x in listed.splitlines() if "store-transfer-stall" in x]
    assert "warning -> error" in line
    assert "error when at least `error_share`" in listed
    explained = invoke("explain", "TA002").output
    assert "Severity: warning -> error (when at least `error_share`" in explained
    docs = render_markdown(load_rules().rules)
    assert (
        "| TA002 | [`store-transfer-stall`](#ta002-store-transfer-stall) | warning -> error |"
        in docs
    )


def test_rules_test_fails_an_undeclared_escalation() -> None:
    """`rules test` says when a finding is more severe than the rule declares."""
    from dataclasses import replace

    from traceanalyzer.authoring.ruletest import fixtures_for, run_fixture

    stall = load_rules().rules.get("store-transfer-stall")
    assert stall.undeclared("error") is None and stall.undeclared("warning") is None
    undeclared = replace(stall, escalates_to=None, escalation="")
    assert "declare escalates_to='error'" in (undeclared.undeclared("error") or "")
    fires = [f for f in fixtures_for(stall) if f.expect == "fire"]
    problems = [p for f in fires for p in run_fixture(undeclared, f).problems]
    assert any("declare escalates_to='error'" in p for p in problems)


def test_rules_new_then_rules_test_as_the_readme_says(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """From any folder: `rules new` writes ./traceanalyzer-rules and says so; the other `rules`
    commands read it."""
    monkeypatch.chdir(tmp_path)
    created = invoke("new", "my-rule")
    assert (tmp_path / "traceanalyzer-rules" / "my_rule.py").is_file()
    assert "traceanalyzer-rules/ is the default folder for your rules" in created.output
    assert "rules test my-rule`" in created.output
    assert "--rules traceanalyzer-rules" in created.output
    assert "my-rule" in invoke("list").output
    assert CliRunner().invoke(rules_group, ["test", "my-rule"]).exit_code == 0


def test_run_reads_the_rules_folder_rules_test_reads(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """`rules new my-rule` then `run`: the run loads ./traceanalyzer-rules as `rules list/test`
    do, and says so; a ./traceanalyzer-rules inside the analysed folder came with the data and
    is not loaded (said too)."""
    import json
    import shutil

    from traceanalyzer.cli import main

    monkeypatch.chdir(tmp_path)
    invoke("new", "my-rule")
    sample = ROOT / "sample_traces" / "inference_baseline"
    ran = CliRunner().invoke(main, ["run", str(sample), "--out", "out", "-q", "-j", "1"])
    assert ran.exit_code == 0, ran.output
    assert "rules: built-in and ./traceanalyzer-rules (the default folder of your rules" in (
        ran.output
    )
    rules = json.loads((tmp_path / "out" / "findings.json").read_text())["rules"]
    assert "my-rule" in {r["name"] for r in rules}
    data = tmp_path / "data"
    shutil.copytree(sample, data)
    shutil.copytree(tmp_path / "traceanalyzer-rules", data / "traceanalyzer-rules")
    monkeypatch.chdir(data)
    ran = CliRunner().invoke(main, ["run", ".", "--out", str(tmp_path / "o2"), "-q", "-j", "1"])
    assert ran.exit_code == 0, ran.output
    assert "is inside the analysed folder: it came with the data and is not loaded" in ran.output
    rules = json.loads((tmp_path / "o2" / "findings.json").read_text())["rules"]
    assert "my-rule" not in {r["name"] for r in rules}


def test_rules_new_never_writes_into_the_builtin_rules(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """At the root of a checkout, `rules/` is the built-in rules' folder: refused by name, and
    the default folder is another one."""
    before = sorted(p.name for p in (ROOT / "rules").rglob("*"))
    for folder in ("rules", "rules/fixtures", str(ROOT / "rules")):
        refused = CliRunner().invoke(rules_group, ["new", "my-rule", "--rules", folder])
        assert refused.exit_code == 2, refused.output
        assert "own folder of built-in rules" in refused.output
    assert sorted(p.name for p in (ROOT / "rules").rglob("*")) == before
    monkeypatch.chdir(ROOT)
    created = invoke("new", "my-rule", "--rules", str(tmp_path / "mine"))
    assert created.exit_code == 0 and (tmp_path / "mine" / "my_rule.py").is_file()
    assert sorted(p.name for p in (ROOT / "rules").rglob("*")) == before


def test_rules_new_refuses_a_taken_name_or_id(tmp_path) -> None:
    taken_name = CliRunner().invoke(rules_group, ["new", "slow-rank", "--rules", str(tmp_path)])
    assert taken_name.exit_code == 2
    assert "a rule named 'slow-rank' already exists: the built-in rule TA003" in taken_name.output
    assert not (tmp_path / "slow_rank.py").exists()
    for rule_id, why in (("TA003", "reserved for built-in rules"), ("ta100", "e.g. TA123")):
        refused = CliRunner().invoke(rules_group, ["new", "x-rule", "--id", rule_id])
        assert refused.exit_code == 2 and why in refused.output
    # a name taken in another --rules folder
    invoke("new", "mine", "--rules", str(tmp_path / "a"))
    elsewhere = CliRunner().invoke(
        rules_group, ["new", "mine", "--rules", str(tmp_path / "b"), "--rules", str(tmp_path / "a")]
    )
    assert elsewhere.exit_code == 2 and "a rule named 'mine' already exists" in elsewhere.output


def test_a_rule_that_does_not_load_is_a_usage_error(tmp_path) -> None:
    """`rules list`, `rules test`, `rules explain` (and `run`, tests/test_exit_codes.py) exit 2
    naming the file and why, instead of listing or testing the other rules."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nraise NameError('no_such_helper')\n")
    for args in (["list"], ["test"], ["explain", "slow-rank"]):
        result = CliRunner().invoke(rules_group, [*args, "--rules", str(tmp_path)])
        assert result.exit_code == 2, (args, result.output)
        assert f"{bad}: line 3: NameError: no_such_helper" in result.output
        assert "passed" not in result.output
    twice = tmp_path / "twice"
    invoke("new", "slow-sync", "--rules", str(twice))
    source = (twice / "slow_sync.py").read_text()
    (twice / "slow_sync.py").write_text(source.replace('name="slow-sync"', 'name="slow-rank"'))
    duplicate = CliRunner().invoke(rules_group, ["list", "--rules", str(twice)])
    assert duplicate.exit_code == 2 and "'slow-rank' is defined twice" in duplicate.output


def test_did_you_mean_a_rule_or_a_parameter() -> None:
    from traceanalyzer.engine.config import ConfigError, resolve, run_settings

    mistyped = CliRunner().invoke(rules_group, ["explain", "slow-rnk"])
    assert mistyped.exit_code == 2
    assert "unknown rule 'slow-rnk'; did you mean 'slow-rank'?" in mistyped.output
    rules = load_rules().rules
    with pytest.raises(ConfigError, match="no parameter 'min_rnks'; did you mean 'min_ranks'?"):
        resolve(rules, run_settings(["slow-rank.min_rnks=2"], False))
    with pytest.raises(ConfigError, match=r"expected a whole number \(default 4\), got 'abc'"):
        resolve(rules, run_settings(["slow-rank.min_ranks=abc"], False))
