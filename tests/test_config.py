"""``placecheck.basics.config``: the TOML config, its defaults and overrides, and errors naming key and
line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import unwrapped

from placecheck.basics import config
from placecheck.basics.config import Allow, ModelConfig, apply_allows, find_pyproject, load, parse
from placecheck.basics.errors import UsageError
from placecheck.basics.options import AuditOptions
from placecheck.findings.finding import Finding, Severity

REPO = Path(__file__).resolve().parents[1]


def _parse(text: str, **kwargs: object) -> config.RunConfig:
    return parse(textwrap.dedent(text), "cfg.toml", **kwargs)  # type: ignore[arg-type]


def _error(text: str, prefix: tuple[str, ...] = ()) -> str:
    with pytest.raises(UsageError) as info:
        _parse(text, prefix=prefix)
    return str(info.value)


def test_a_full_config() -> None:
    cfg = _parse("""
        jobs = 3
        timeout = 30
        fail_on = "error"
        baseline = "b.json"

        [defaults]
        device = "cuda:1"
        ignore = ["PC205"]
        allow = [{ code = "PC204", reason = "intended" }]

        [[models]]
        target = "pkg.mod:Net"
        kwargs = { width = 4, names = ["a"] }
        args = ["depth=2"]
        inputs = ["float32[1,3,8,8]"]
        allow = [{ code = "PC1", where = "cache.*", reason = "rebuilt in forward" }]

        [[models]]
        target = "pkg.mod:Net"
        name = "net-cpu"
        device = "cpu"
        timeout = 5
        """)
    assert (cfg.jobs, cfg.timeout, cfg.fail_on, cfg.baseline) == (3, 30.0, "error", "b.json")
    first, second = cfg.models
    assert first == ModelConfig(
        target="pkg.mod:Net", kwargs={"width": 4, "names": ["a"]}, args=("depth=2",),
        options=AuditOptions(inputs=("float32[1,3,8,8]",), device="cuda:1", ignore=("PC205",)),
        allow=(Allow("PC204", "*", "intended", 10), Allow("PC1", "cache.*", "rebuilt in forward", 17)),
        line=12)
    assert (second.label, second.options.device, second.timeout, second.options.ignore) == (
        "net-cpu", "cpu", 5.0, ("PC205",))
    assert first.label == "pkg.mod:Net"


def test_command_line_overrides_win() -> None:
    cfg = _parse("""
        [[models]]
        target = "a:b"
        device = "cuda:1"
        """, overrides={"device": "cpu", "select": ("PC1",)})
    assert (cfg.models[0].options.device, cfg.models[0].options.select) == ("cpu", ("PC1",))


@pytest.mark.parametrize("text, expected", [
    ("""
     jobz = 2
     [[models]]
     target = "a:b"
     """, "cfg.toml:2: jobz: unknown key; the config takes: models, defaults"),
    ("""
     [[models]]
     target = "a:b"

     [[models]]
     target = "c:d"
     devise = "cuda"
     """, "cfg.toml:7: models[1].devise: unknown key; models[1] takes: target, name"),
    ("""
     [defaults]
     colour = "red"
     [[models]]
     target = "a:b"
     """, "cfg.toml:3: defaults.colour: unknown key"),
    ("""
     [[models]]
     target = "a:b"
     allow = [
       { code = "PC101", reason = "x" },
       { code = "PC102", wher = "x", reason = "y" },
     ]
     """, "cfg.toml:6: models[0].allow[1].wher: unknown key"),
    ("""
     [[models]]
     target = "a:b"
     [[models.allow]]
     code = "PC101"
     reason = "x"
     [[models.allow]]
     code = "PC101"
     why = "x"
     """, "cfg.toml:9: models[0].allow[1].why: unknown key"),
])
def test_unknown_keys_name_the_key_and_the_line(text: str, expected: str) -> None:
    assert _error(text).startswith(expected)


@pytest.mark.parametrize("text, expected", [
    ("""
     jobs = "2"
     [[models]]
     target = "a:b"
     """, "cfg.toml:2: jobs: expected an integer >= 1, got a string '2'"),
    ("""
     [[models]]
     target = "a:b"
     kwargs = 3
     """, "cfg.toml:4: models[0].kwargs: expected a table"),
    ("""
     [[models]]
     target = "a:b"
     inputs = "float32[1]"
     """, "cfg.toml:4: models[0].inputs: expected a list of strings"),
    ("""
     [[models]]
     target = "a:b"

     train = "yes"
     """, "cfg.toml:5: models[0].train: expected true or false"),
    ("""
     [[models]]
     target = "a:b"
     engine = "gpu"
     """, "cfg.toml:4: models[0].engine: unknown engine 'gpu': use one of auto, real, fake, tagged"),
    ("""
     [[models]]
     target = "a:b"
     device = "tpu"
     """, "cfg.toml:4: models[0].device: unknown device 'tpu': use cuda, cuda:N, cpu, mps, meta or keep"),
    ("""
     [[models]]
     target = "a:b"
     select = ["PC9999"]
     """, "cfg.toml:4: models[0].select: invalid code selector 'PC9999': use a code prefix such as PC2"),
    ("""
     [[models]]
     target = "a:b"
     timeout = -1
     """, "cfg.toml:4: models[0].timeout: expected a number of seconds > 0"),
    ("""
     [[models]]
     target = 5
     """, "cfg.toml:3: models[0].target: expected a string, got an integer 5"),
])
def test_wrong_types_name_the_key_and_the_line(text: str, expected: str) -> None:
    assert _error(text).startswith(expected)


def test_missing_and_duplicate_entries() -> None:
    assert _error("jobs = 1\n") == "cfg.toml:1: models: no models: add at least one [[models]] with a target"
    assert _error("""
        [[models]]
        name = "x"
        """).startswith("cfg.toml:2: models[0]: missing required key 'target'")
    assert "missing required key 'reason': say why" in _error("""
        [[models]]
        target = "a:b"
        allow = [{ code = "PC101" }]
        """)
    assert _error("""
        [[models]]
        target = "a:b"
        [[models]]
        target = "a:b"
        """).startswith("cfg.toml:4: models[1]: 'a:b' is already audited by the entry on line 2")
    assert _error("""
        [defaults]
        target = "a:b"
        [[models]]
        target = "a:b"
        """).startswith("cfg.toml:3: defaults.target: not allowed in [defaults]")
    assert _error("models = [").startswith("cfg.toml: not valid TOML")


PYPROJECT = """\
[project]
name = "mine"

[tool.ruff]
line-length = 100

[tool.placecheck]
jobs = 2

[[tool.placecheck.models]]
target = "a:b"

[[tool.placecheck.models]]
target = "c:d"
kwarg = 1
"""


def test_pyproject_table_with_line_numbers(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT.replace("kwarg = 1\n", ""))
    assert find_pyproject(tmp_path) == tmp_path / "pyproject.toml"
    cfg = load(tmp_path / "pyproject.toml")
    assert [m.target for m in cfg.models] == ["a:b", "c:d"] and cfg.jobs == 2
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    with pytest.raises(UsageError, match=r"pyproject.toml:15: models\[1\].kwarg: unknown key"):
        load(tmp_path / "pyproject.toml")


def test_pyproject_without_the_table(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert find_pyproject(tmp_path) is None
    with pytest.raises(UsageError, match=r"has no \[tool.placecheck\] table"):
        load(tmp_path / "pyproject.toml")
    assert find_pyproject(tmp_path / "nowhere") is None


def test_unreadable_file() -> None:
    with pytest.raises(UsageError, match=r"cannot read --config 'missing\.toml'"):
        load("missing.toml")


def test_engine_and_init_choices_have_one_source() -> None:
    # the engine and the construction step use the options module's enums; the config schema checks an
    # options value with the options module's own check, so a bad one reads as on the command line
    from placecheck.basics import options
    from placecheck.engines import engine
    from placecheck.model import construct

    assert engine.EngineChoice is options.EngineChoice and construct.InitChoice is options.InitChoice
    for key, bad in (("engine", "gpu"), ("init", "disk"), ("gpus", 0), ("device", "tpu"), ("wrap", "tp"),
                     ("world_size", 0), ("device_map", "everywhere"), ("select", ["PC9999"])):
        with pytest.raises(UsageError) as own:
            options.check_value(key, bad)
        assert _error(f'[[models]]\ntarget = "a:b"\n{key} = {json.dumps(bad)}\n') == \
            f"cfg.toml:3: models[0].{key}: {own.value}"


def test_every_model_key_is_a_model_field_or_an_audit_option() -> None:
    from placecheck.basics.options import OPTION_NAMES

    homeless = set(config.MODEL_KEYS) - {"allow"} - config._MODEL_FIELDS - set(OPTION_NAMES)
    assert homeless == set()
    # and a config entry's option keys arrive in its AuditOptions
    cfg = _parse("""
        [[models]]
        target = "a:b"
        engine = "tagged"
        train = true
        library_findings = true
        example_inputs = "m:inputs"
        """)
    assert cfg.models[0].options == AuditOptions(engine="tagged", train=True, library_findings=True,
                                                 example_inputs="m:inputs")


def test_group_and_hints_are_run_keys() -> None:
    cfg = _parse("""
        group = false
        hints = true
        [[models]]
        target = "a:b"
        """)
    assert (cfg.group, cfg.hints) == (False, True)
    assert (_parse('[[models]]\ntarget = "a:b"\n').group, _parse('[[models]]\ntarget = "a:b"\n').hints) == (
        True, False)


@pytest.mark.parametrize("name", ["example.toml", "defaults.toml", "transformers.toml", "torchvision.toml"])
def test_shipped_configs_load(name: str) -> None:
    assert load(REPO / "configs" / name).models


def _finding(code: str, where: str) -> Finding:
    return Finding(code=code, kind="k", severity=Severity.ERROR, where=where, message="m", hint="h")


def test_allow_matches_code_prefix_and_where_glob() -> None:
    allows = (Allow("PC1", "cache.*", "r", 3), Allow("PC204", "*", "r", 4), Allow("PC301", "x", "r", 5))
    findings = (_finding("PC101", "cache.k"), _finding("PC101", "mask"), _finding("PC204", ""),
                _finding("PC102", "cache.heads"))
    kept, allowed, unused = apply_allows(findings, allows)
    assert [(f.code, f.where) for f in kept] == [("PC101", "mask")]
    assert [(f.code, a.line) for f, a in allowed] == [("PC101", 3), ("PC204", 4), ("PC102", 3)]
    assert unused == [allows[2]]


def test_cli_reports_config_errors_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[models]]\ntarget = "a:b"\ntimeout = "soon"\n')
    proc = subprocess.run([sys.executable, "-m", "placecheck", "audit", "--config", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert unwrapped(proc.stderr) == (f"placecheck: error: {bad}:3: models[0].timeout: expected a number of "
                                      "seconds > 0, got a string 'soon'\n")
    assert "Traceback" not in unwrapped(proc.stderr)


@pytest.mark.parametrize("text, expected", [
    ("""
     [[models]]
     target = "a:b"
     kwargs = { width = 1979-05-27 }
     """, "cfg.toml:4: models[0].kwargs.width: a TOML date/time is not accepted here"),
    ("""
     [[models]]
     target = "a:b"
     name = "made 1979-05-27"
     kwargs.times = [07:32:00]
     """, "cfg.toml:5: models[0].kwargs.times[0]: a TOML date/time is not accepted here"),
    ("""
     [defaults]
     kwargs = { when = 1979-05-27T07:32:00Z }
     [[models]]
     target = "a:b"
     """, "cfg.toml:3: defaults.kwargs.when: a TOML date/time is not accepted here"),
])
def test_date_and_time_values_are_refused_with_key_and_line(text: str, expected: str) -> None:
    # the parent sends each model's entry to its process as JSON, which has no dates: one such value
    # used to fail the whole run with a TypeError
    assert _error(text).startswith(expected)


@pytest.mark.parametrize("text, expected", [
    ("""
     [[models]]
     target = "a:b"

     foo.bar = 2
     """, "cfg.toml:5: models[0].foo: unknown key"),
    ("""
     [[models]]
     target = "a:b"
     kwargs.x = 1
     device.kind = "cuda"
     """, "cfg.toml:5: models[0].device: expected a device string"),
    ("""
     [[models]]
     target = "a:b"
     [[models]]
     target = "c:d"

     [models.extra]
     q = 1
     """, "cfg.toml:7: models[1].extra: unknown key"),
    ("""
     [tool.placecheck]
     [[tool.placecheck.models]]
     target = "a:b"
     [tool.placecheck.models.kwargs]
     x = 1
     [tool.placecheck.models.extras]
     y = 1
     """, "cfg.toml:7: models[0].extras: unknown key"),
])
def test_dotted_keys_and_sub_tables_are_blamed_on_their_own_line(text: str, expected: str) -> None:
    prefix = ("tool", "placecheck") if "tool.placecheck" in text else ()
    assert _error(text, prefix).startswith(expected)


def test_dotted_keys_and_sub_tables_still_load() -> None:
    cfg = _parse("""
        [[models]]
        target = "a:b"
        kwargs.width = 8
        [[models]]
        target = "c:d"
        [models.kwargs]
        depth = 2
        """)
    assert [m.kwargs for m in cfg.models] == [{"width": 8}, {"depth": 2}]


@pytest.mark.parametrize("where", ["heads[0]", "cache['k']", "blocks.0.cache['k']", "tables[2][1]"])
def test_allow_where_copied_from_a_report_matches_exactly(where: str) -> None:
    # as a glob alone, [0] and ['k'] are character classes: the entry would never match itself
    kept, allowed, unused = apply_allows((_finding("PC101", where),), (Allow("PC101", where, "r", 3),))
    assert kept == [] and len(allowed) == 1 and unused == []


def test_allow_where_glob_still_applies() -> None:
    allow = Allow("PC102", "heads[[]*", "r", 3)
    assert allow.matches(_finding("PC102", "heads[3]"))
    assert not Allow("PC102", "heads[0]", "r", 3).matches(_finding("PC102", "heads[1]"))


def test_example_config_allows_a_where_with_brackets() -> None:
    [buggy] = [m for m in load(REPO / "configs" / "example.toml").models if "buggy" in m.target]
    assert any(a.matches(_finding("PC101", "blocks.0.cache['k']")) for a in buggy.allow)


def test_a_config_runs_overrides_are_audit_options_and_config_keys() -> None:
    # the command-line options a --config run applies to every model are fields of AuditOptions and
    # keys of a [[models]] entry, so the config and the override build the same object
    import typer

    from placecheck.basics.options import OPTION_NAMES
    from placecheck.cli import app, ci

    assert set(ci.MODEL_OVERRIDES) <= set(OPTION_NAMES) & set(config.MODEL_KEYS)
    params = {p.name for p in typer.main.get_command(app).commands["audit"].params}
    assert set(ci.MODEL_OVERRIDES) | ci.RUN_OPTIONS | set(ci.CONFIG_ONLY) <= params
