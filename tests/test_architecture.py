"""The house has one direction: layers import only downwards, the core names no built-in rule,
no pickle anywhere, and a run pays only for what it uses (matplotlib, Ray)."""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from traceanalyzer.codekey import named_loads

PACKAGE = Path(__file__).resolve().parents[1] / "traceanalyzer"
SAMPLES = PACKAGE.parent / "sample_traces"

# Lower layers first. A module may import its own layer and the layers before it, never one
# after it. `traceanalyzer` itself (the package's façade: open_store) stands on top, with the
# cli; the version it hands on is a base module.
LAYERS: list[tuple[str, ...]] = [
    (
        "version",
        "vocabulary",
        "timeutil",
        "process_env",
        "executor",
        "schema",
        "step_components",
        "json_shape",
        "sqlite_ro",
        "interrupts",
        "printable",
        "outdir",
        "exitcodes",
        "hints",
        "clitypes",
        "text",
        "stats",
        "chart",
        "patterns",
        "intervals",
        "api_layers",
        "launch_links",
        "host_gaps",
        "kernels",
        "codekey",
    ),
    ("discover",),
    ("parse",),
    ("store", "store_trace", "ingest", "read_ahead", "stages"),
    ("engine",),  # the rule core: rule, params, runner, registry, loader, findings, cache
    (
        "derived",
        "memory",
    ),  # the tables derived before the rules (steps, launches, exchanges...), the device memory per step
    ("analyses",),  # what rules and the overview conclude from the tables
    ("authoring",),  # the rules CLI, scaffold, fixture runner, rule docs
    ("kit",),  # the rule author's surface: a façade
    ("overview", "synth", "recipes"),
    ("kit.testing",),  # the fixture builders, over the synthetic generator
    ("report", "query"),
    ("compare", "pipeline"),
    ("cli", "traceanalyzer"),
]
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}
# Files shipped to profiling hosts as they are (recipe templates) are not part of the package's
# import graph.
NOT_MODULES = ("recipes/templates/",)


def _sources() -> list[Path]:
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if not any(part in p.relative_to(PACKAGE).as_posix() for part in NOT_MODULES)
    ]


def _layer(module: str) -> int:
    parts = module.split(".")
    assert parts[0] == "traceanalyzer"
    if len(parts) == 1:
        return LEVEL["traceanalyzer"]
    return LEVEL.get(".".join(parts[1:3]), LEVEL[parts[1]])  # a subpackage may have its own


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import of the project, wherever it is (lazy ones included)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from traceanalyzer.synth import ops` imports the module traceanalyzer.synth.ops;
            # `from traceanalyzer import text` the module text, not the package's façade
            facade = node.module == "traceanalyzer"
            found += [] if facade else [(node.lineno, node.module)]
            found += [
                (
                    node.lineno,
                    f"{node.module}.{a.name}" if not facade or a.name in LEVEL else "traceanalyzer",
                )
                for a in node.names
            ]
    return [(line, m) for line, m in found if m.split(".")[0] == "traceanalyzer"]


def test_every_module_has_a_layer() -> None:
    for path in _sources():
        module = _module_name(path)
        parts = module.split(".")
        assert len(parts) == 1 or parts[1] in LEVEL, f"{module}: add it to LAYERS"


def test_layers_import_only_downwards() -> None:
    """Every import, lazy ones and the modules loaded through ``importlib`` by name included."""
    problems = []
    for path in _sources():
        module = _module_name(path)
        level = _layer(module)
        source = path.read_text("utf-8")
        for line, imported in [*_imports(ast.parse(source)), *named_loads(source)]:
            if imported.split(".")[1:2] and imported.split(".")[1] not in LEVEL:
                continue  # a name in a string that is no module
            if _layer(imported) > level:
                problems.append(f"{path.relative_to(PACKAGE)}:{line} {module} imports {imported}")
    assert not problems, "imports against the layer order:\n" + "\n".join(problems)


def test_loads_by_name_are_imports() -> None:
    """A module loaded through ``importlib`` is imported as surely as by a statement, and hides
    the arrow from a reader of statements: the cli's table of lazy commands and a literal
    ``import_module`` are read."""
    cli = named_loads((PACKAGE / "cli.py").read_text("utf-8"))
    assert {"traceanalyzer.report.cli", "traceanalyzer.synth.cli"} <= {m for _, m in cli}
    hidden = 'def f():\n    return importlib.import_module("traceanalyzer.synth.fixtures")\n'
    assert named_loads(hidden) == [(2, "traceanalyzer.synth.fixtures")]
    table = 'HOMES = {"x": "traceanalyzer.report.writer"}\nimport_module(HOMES[name])\n'
    assert named_loads(table) == [(1, "traceanalyzer.report.writer")]
    assert named_loads('NAME = "traceanalyzer.report.writer"\n') == []  # loads nothing


def _type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def test_no_import_cycle_between_modules() -> None:
    """Module-level imports (the ones that run at import time, and the type-only ones under
    ``if TYPE_CHECKING:``: a circle of types is a circle of ideas) and the modules loaded
    through ``importlib`` by name (wherever: a hidden edge is an edge) form no cycle."""
    graph: dict[str, set[str]] = {}
    for path in _sources():
        module = _module_name(path)
        source = path.read_text("utf-8")
        tree = ast.parse(source)
        body = [s for n in tree.body for s in (n.body if _type_checking(n) else [n])]
        top = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
        loaded = [*_imports(ast.Module(body=top, type_ignores=[])), *named_loads(source)]
        graph[module] = {m for _, m in loaded}
    modules = set(graph)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    # a module's own packages are imported before it whatever it imports: no edge of its own
    edges = {
        m: {r for i in deps if (r := resolve(i)) and r != m and not m.startswith(r + ".")}
        for m, deps in graph.items()
    }
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                pytest.fail("import cycle: " + " -> ".join([*stack[stack.index(n) :], n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)


def _code_text(path: Path) -> list[tuple[int, str]]:
    """(line, text) of a Python file's strings and names, without comments and docstrings."""
    source = path.read_text("utf-8")
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(body[0].lineno)
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            continue
        if tok.type == tokenize.STRING and tok.start[0] in docstrings:
            continue
        out.append((tok.start[0], tok.string))
    return out


BUILTIN_RULE = re.compile(r"capture-memcpy-growth|store-transfer-stall|slow-rank|TA00[0-9]")


def test_the_core_names_no_builtin_rule() -> None:
    """Every rule is presented through its own object: nothing outside the rules knows one."""
    hits = []
    for path in sorted(p for p in PACKAGE.rglob("*") if p.is_file()):
        if path.suffix in (".pyc", ".so"):
            continue
        if path.suffix == ".py":
            lines = _code_text(path)
        else:
            lines = list(enumerate(path.read_text("utf-8", errors="replace").splitlines(), 1))
        hits += [
            f"{path.relative_to(PACKAGE)}:{n}: {t}" for n, t in lines if BUILTIN_RULE.search(t)
        ]
    assert not hits, "\n".join(hits)


def test_rules_import_the_product_only_through_the_kit(tmp_path: Path) -> None:
    """A rule file sees one surface, ``traceanalyzer.kit``, and its fixtures that and
    ``traceanalyzer.kit.testing``: what they may use is what those export, and the modules behind
    them can move without breaking a rule. The built-in rules, and what `rules new` writes."""
    from traceanalyzer.authoring.scaffold import FIXTURE_TEMPLATE, RULE_TEMPLATE

    scaffold = tmp_path / "rules"
    (scaffold / "fixtures").mkdir(parents=True)
    values = {"id": "TA100", "name": "slow-sync", "func": "slow_sync", "module": "slow_sync"}
    for template, path in ((RULE_TEMPLATE, "r.py"), (FIXTURE_TEMPLATE, "fixtures/r.py")):
        (scaffold / path).write_text(template.format_map(_Blank(values)), "utf-8")
    rules_dir = PACKAGE.parent / "rules"
    hits = []
    for path in sorted([*rules_dir.rglob("*.py"), *scaffold.rglob("*.py")]):
        allowed = {"traceanalyzer.kit"}
        if path.parent.name == "fixtures":
            allowed.add("traceanalyzer.kit.testing")
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                if name.split(".")[0] == "traceanalyzer" and name not in allowed:
                    hits.append(f"{path}:{node.lineno}: {name}")
    assert not hits, "\n".join(hits)


# Where pattern parameters are matched: a config file inside a received collection can set
# them, and Python's `re` backtracks (`^(a|a)*$` hung a rule); patterns.py says how instead.
MATCH_PARAMETERS = ("kit", "analyses", "derived", "overview")


def test_patterns_are_matched_only_in_linear_time() -> None:
    """No rule, analysis, derived-table or overview module hands ``re`` a pattern that is not a
    literal (a parameter's value): they match with polars or ``kit.first_match``."""
    files = [*(PACKAGE.parent / "rules").rglob("*.py")]
    for folder in MATCH_PARAMETERS:
        files += (PACKAGE / folder).rglob("*.py")
    hits = []
    for path in sorted(files):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "re"
                and node.args
            ):
                continue
            pattern = node.args[0]
            if not (isinstance(pattern, ast.Constant) and isinstance(pattern.value, str)):
                hits.append(f"{path}:{node.lineno}: re.{node.func.attr}({ast.unparse(pattern)})")
    assert not hits, "\n".join(hits)


class _Blank(dict):
    """Template values: the given ones, any other placeholder a plain word."""

    def __missing__(self, key: str) -> str:
        return "x"


# The reports render what they are handed (report/inputs.py's ReportData, plain values prepared
# once): only inputs.py loads and reads the store; writer, run_reports and the annotate command run
# the two steps (load, prepare) and hand the result on.
REPORT_RUNNERS = {"inputs", "writer", "run_reports", "cli", "__init__"}
NOT_FOR_RENDERERS = {"ReportInputs", "Store", "session_events", "SessionTimeline"}


def test_no_report_renderer_calls_back_or_opens_the_store() -> None:
    hits = []
    for path in sorted((PACKAGE / "report").glob("*.py")):
        if path.stem in REPORT_RUNNERS:
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else
                [node.id] if isinstance(node, ast.Name) else
                [node.attr] if isinstance(node, ast.Attribute) else []
            )  # fmt: skip
            hits += [f"{path.name}:{node.lineno} {n}" for n in names if n in NOT_FOR_RENDERERS]
    assert not hits, hits


def test_no_pickle_in_the_product() -> None:
    hits = [
        f"{p.relative_to(PACKAGE)}:{n}"
        for p in _sources()
        for n, text in _code_text(p)
        if re.search(r"\b(c?pickle|dill|cloudpickle)\b", text)
    ]
    assert not hits, hits


def _loaded_modules(*args: str) -> set[str]:
    """The modules a `traceanalyzer run` of the given arguments imported."""
    code = (
        "import sys, atexit\n"
        "listing = sys.argv[1]\n"
        "atexit.register(lambda: open(listing, 'w').write('\\n'.join(sys.modules)))\n"
        "from traceanalyzer.cli import main\n"
        "sys.argv = ['traceanalyzer', *sys.argv[2:]]\n"
        "main()\n"
    )
    listing = Path(args[0])
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, check=False)
    return set(listing.read_text().split("\n"))


def test_a_run_without_findings_imports_nothing_it_does_not_use(tmp_path: Path) -> None:
    """Neither matplotlib nor Ray; on a healthy Text export neither DuckDB (the salvaging
    reader), pandas, nor pyarrow.compute (50 ms of wrappers: no column needs its casts)."""
    modules = _loaded_modules(
        str(tmp_path / "modules.txt"),
        "run",
        str(SAMPLES / "store_healthy"),
        "--out",
        str(tmp_path / "out"),
        "--executor",
        "local",
        "-q",
    )
    assert "traceanalyzer.report.writer" in modules  # the reports were written
    assert (tmp_path / "out" / "report.html").is_file()
    assert not {m for m in modules if m.split(".")[0] in ("matplotlib", "ray", "duckdb", "pandas")}
    assert "pyarrow.compute" not in modules


def test_a_run_whose_findings_have_figures_imports_no_matplotlib(tmp_path: Path) -> None:
    """The built-in rules draw SVG charts: matplotlib is for rules that ask for it."""
    out = tmp_path / "out"
    modules = _loaded_modules(
        str(tmp_path / "modules.txt"),
        "run",
        str(SAMPLES / "store_stall_2rank_rank1_sick"),
        "--out",
        str(out),
        "--executor",
        "local",
        "-q",
    )
    assert "traceanalyzer.chart" in modules  # a figure was drawn
    assert list((out / "plots").glob("store-transfer-stall-*.svg"))
    assert not {m for m in modules if m.split(".")[0] == "matplotlib"}


def test_the_recipe_hooks_spell_the_window_markers_like_the_vocabulary() -> None:
    """The hook templates run on profiling hosts without traceanalyzer: they cannot import the
    markers, so they must write exactly what the rules read."""
    from traceanalyzer.vocabulary import CAPTURE_WINDOW, STORE_TRANSFER_WINDOW, WINDOW_KEY

    templates = PACKAGE / "recipes" / "templates"
    store = (
        templates / "mooncake-store-transfer/ta_store_hooks/ta_store_hooks/__init__.py"
    ).read_text()
    assert f'WINDOW_KEY = "{WINDOW_KEY}"' in store
    assert f'WINDOW_VALUE = "{STORE_TRANSFER_WINDOW}"' in store
    capture = (templates / "graph-capture-repeat/hooks/ta_capture_hooks.py").read_text()
    assert f'"{WINDOW_KEY}": "{CAPTURE_WINDOW}"' in capture


def test_a_run_without_findings_does_not_import_pandas() -> None:
    """pandas costs a quarter of a second and no part of a run needs it (an empty Arrow table
    built with pyarrow's constructors imports it: the store makes empty frames with polars)."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from traceanalyzer.cli import main\n"
        f"r = CliRunner().invoke(main, ['run', {str(SAMPLES / 'inference_baseline')!r}, "
        "'--out', sys.argv[1], '-q', '--executor', 'local'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print('pandas' in sys.modules)\n"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run(
            [sys.executable, "-c", code, out], capture_output=True, text=True, timeout=300
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"
