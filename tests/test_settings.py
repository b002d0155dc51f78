"""The settings of each run kind (probe.settings): the command's options take their defaults and checks from
the settings fields (a click default that differs from its field's, or a bound checked by the command line
and not by the settings, fails here); one bad value gives one message through every door (the command, the
settings object, a request's mapping, ``probe.run_kind``); the settings need no heavy library; and no public
function of probe takes more than a set number of parameters (the settings travel instead)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import subprocess
import sys

import click
import pytest

import probe
from conftest import invoke_cli, one_error
from probe.cli import main
from probe.errors import InputError
from probe.settings import SETTINGS, AnalyzeSettings, OptionConflict, PatchSettings, WhySettings

#: Options of the commands that are not settings of the run: where the model comes from and sits, where the
#: folder goes, how the command prints.
NOT_SETTINGS = {"model_name", "out", "force", "progress", "as_json", "device", "dtype", "device_map", "save_to"}


def _fields(cls) -> dict:
    return {f.name: f for f in dataclasses.fields(cls)}


def _shown(value, multiple: bool):
    """A settings default as its option shows it (a tuple taking one value: comma-separated)."""
    if isinstance(value, tuple) and not multiple:
        return ",".join(map(str, value))
    return value


@pytest.mark.parametrize("kind", sorted(SETTINGS))
def test_every_option_of_a_command_is_its_settings_field_with_the_same_default(kind):
    cls, command = SETTINGS[kind], main.commands[kind]
    fields = _fields(cls)
    params = {p.name: p for p in command.params}
    assert set(fields) <= set(params), f"settings of {kind} without an option: {set(fields) - set(params)}"
    for name, param in params.items():
        if name in NOT_SETTINGS:
            continue
        assert name in fields, f"probe {kind}: option {name} is not a field of {cls.__name__}"
        field = fields[name]
        default = None if field.default is dataclasses.MISSING else field.default
        multiple = getattr(param, "multiple", False) or getattr(param, "nargs", 1) == -1
        click_default = param.default
        if type(click_default).__name__ == "Sentinel" or (multiple and click_default in (None, ())):
            click_default = None  # click's 'no default' (UNSET), or an empty multiple option
        expected = _shown(default, multiple) if not (multiple and default in ((), None)) else None
        assert click_default == expected, f"probe {kind} {name}: click {click_default!r}, settings {expected!r}"
        checked = param.callback is not None or isinstance(param.type, (click.IntRange, click.FloatRange,
                                                                        click.Choice))
        if checked:
            assert field.metadata.get("check") or field.metadata.get("choices"), \
                f"probe {kind} {name}: checked by the command line, not by {cls.__name__}"


@pytest.mark.parametrize("kind", sorted(SETTINGS))
def test_every_field_says_what_it_is_and_every_default_passes_its_check(kind):
    cls = SETTINGS[kind]
    for row, f in zip(cls.describe(), dataclasses.fields(cls)):
        assert row["doc"].endswith("."), row
        assert row["option"] or row["name"] == "runs", row
        if str(f.type).split(" |")[0] in ("int", "float") and f.metadata.get("check"):
            assert row["bound"], f"{kind} {row['name']}: a number without its bound in words"
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING and f.default is not None:
            assert cls.check_field(f.name, f.default) == f.default, f.name


#: One bad value per run kind: the command's arguments, the settings mapping, the one-line message.
BAD = {
    "analyze": (["--examples", "21"], {"examples": 21}, "--examples must be at most 20, got 21"),
    "verify": (["--rtol", "-1"], {"rtol": -1.0}, "--rtol must be a finite number >= 0, got -1.0"),
    "prune": (["--fraction", "1.5"], {"fraction": 1.5}, "--fraction must be in (0, 1), got 1.5"),
    "effects": (["--seeds", "2"], {"seeds": 2}, "--seeds must be at least 5, got 2"),
    "patch": (["--heads-per-pass", "0"], {"heads_per_pass": 0}, "--heads-per-pass must be at least 1, got 0"),
    "path": (["--senders", "L1X0", "--receivers", "logits"], {"senders": "L1X0", "receivers": "logits"},
             "--senders: 'L1X0' is not a name of that form (L5H1,L5H2)"),
    "circuit": (["--method", "eap-x"], {"method": "eap-x"},
                "--method must be one of eap-ig, eap, got 'eap-x'"),
    "why": (["--head", "head one", "--text", "a"], {"head": "head one", "text": "a"},
            "'head one' is not a head of the form L5H1"),
    "compare": (["a", "b", "--top", "21"], {"runs": ("a", "b"), "top": 21}, "--top must be at most 20, got 21"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_value_is_one_message_through_every_door(kind):
    """The command's usage error holds the very line the settings raise, from a mapping (a request of the
    live page), from the class and from probe.run_kind: one check, one message."""
    args, mapping, message = BAD[kind]
    line = one_error(invoke_cli(kind, *args), 2, message)
    with pytest.raises(InputError) as built:
        SETTINGS[kind].from_mapping(mapping)
    assert message in str(built.value) and str(built.value) in line
    with pytest.raises(InputError) as direct:
        SETTINGS[kind](**mapping)
    assert str(direct.value) == str(built.value)
    with pytest.raises(InputError) as called:
        probe.run_kind(kind, None, mapping)  # refused before any model is read
    assert str(called.value) == str(built.value)


def test_the_settings_copies_of_library_names_agree():
    """The settings are written without importing torch; the library's own constants are the same."""
    from probe.circuits.greedy import THRESHOLD
    from probe.qk.corpus import RULES
    from probe.settings.kinds import WHY_LABELS

    assert SETTINGS["circuit"]().threshold == THRESHOLD and set(WHY_LABELS) == set(RULES)


def test_options_that_do_not_go_together_are_one_message_too():
    line = one_error(invoke_cli("analyze", "--text", "a", "--corpus", "x"), 2, "not two of them")
    with pytest.raises(OptionConflict) as exc:
        AnalyzeSettings(texts=("a",), corpus="x")
    assert str(exc.value) in line
    one_error(invoke_cli("why", "--head", "L0H0"), 2, "give either --text or --corpus")
    with pytest.raises(OptionConflict, match="give either --text or --corpus"):
        WhySettings(head="L0H0")


def test_a_request_is_checked_by_name_and_value():
    settings = PatchSettings.from_mapping({"direction": "noise", "components": ["q", "z"], "rope_offsets": 2})
    assert settings == PatchSettings(direction="noise", components="q,z", rope_offsets=2)
    assert settings.components == ("z", "q") and settings.to_json()["components"] == ["z", "q"]
    with pytest.raises(InputError, match="unknown patch setting 'directions'; settings: pairs, direction"):
        PatchSettings.from_mapping({"directions": "noise"})
    with pytest.raises(InputError, match="why needs head"):
        WhySettings.from_mapping({"text": "a"})
    with pytest.raises(InputError, match="unknown run kind 'patches'"):
        probe.run_kind("patches", None, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.direction = "denoise"


def test_the_settings_import_no_heavy_library():
    code = ("import sys\nfrom probe.settings import SETTINGS\n[cls.describe() for cls in SETTINGS.values()]\n"
            "print(*(m for m in ('torch', 'transformers', 'pandas', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


#: The compiled statistics kernels take their arrays one by one (numba compiles plain arguments, not objects).
WIDE_BY_DESIGN = {"probe.measures.kernel.statistics_kernel", "probe.measures.kernel.statistics_kernel_serial"}
#: The most parameters a public function of probe takes (before the settings objects: 42, analyze_run).
MOST_PARAMETERS = 15
#: The public functions still above it, as they are: the loop everything measures with (each option documented
#: argument by argument; 18 with ``announce``, the long-batch estimate's line) and the head view's data (not a run
#: kind).
ABOVE = {"probe.runs.analysis.analyze": 18, "probe.view.data.view_data": 19}


def _public_functions():
    for info in pkgutil.walk_packages(probe.__path__, "probe."):
        if info.name.startswith("probe.cli") or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if not name.startswith("_") and inspect.isfunction(obj) and obj.__module__ == module.__name__:
                yield f"{module.__name__}.{name}", len(inspect.signature(obj).parameters)


def test_no_public_function_takes_more_than_the_most_parameters():
    """Before the settings objects, 7 public functions took more than 15 parameters (analyze_run 42,
    analyze_texts 27, view_data 19, the two kernels 18, analyze and circuits.run.measure 17); the run calls
    take a settings object instead."""
    counts = dict(_public_functions())
    above = {name: n for name, n in counts.items() if n > MOST_PARAMETERS and name not in WIDE_BY_DESIGN}
    assert above == ABOVE
    calls = ["probe.entries.analyze.analyze_run", "probe.entries.texts.analyze_texts", "probe.circuits.run.measure",
             *(f"probe.entries.{m}" for m in ("analyze.run_analyze", "pairs.run_patch", "pairs.run_path",
                                              "pairs.run_circuit", "ablation.run_effects", "ablation.run_prune",
                                              "why.run_why", "checks.run_verify", "compare.run_compare"))]
    assert max(counts[name] for name in calls) <= 12, {name: counts[name] for name in calls}
