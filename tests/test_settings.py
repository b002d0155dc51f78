"""The settings of each run kind (probe.settings): the command's options take their defaults and checks from
the settings fields (a click default that differs from its field's, or a bound checked by the command line
and not by the settings, fails here); one bad value gives one message through every door (the command, the
settings object, a request's mapping, ``probe.run_kind``, and for the values the live page takes too, its
server and its session); the settings need no heavy library; and no public function of probe takes more than a
set number of parameters (the settings travel instead)."""

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
from conftest import invoke_cli, one_error, save_tiny
from probe.cli import main
from probe.errors import InputError
from probe.settings import (
    REQUESTS,
    SETTINGS,
    AblateRequest,
    AnalyzeSettings,
    HeadRequest,
    LiveSettings,
    OptionConflict,
    PatchSettings,
    WhySettings,
)

#: Options of the commands that are not settings of the run: where the model comes from and sits, where the
#: folder goes, how the command prints.
NOT_SETTINGS = {"model_name", "out", "force", "progress", "as_json", "device", "dtype", "device_map", "save_to"}
#: Every command with a settings class: the run kinds, and ``probe live`` (a server, not a run kind).
COMMANDS = {**SETTINGS, "live": LiveSettings}


def _fields(cls) -> dict:
    return {f.name: f for f in dataclasses.fields(cls)}


def _shown(value, multiple: bool):
    """A settings default as its option shows it (a tuple taking one value: comma-separated)."""
    if isinstance(value, tuple) and not multiple:
        return ",".join(map(str, value))
    return value


@pytest.mark.parametrize("kind", sorted(COMMANDS))
def test_every_option_of_a_command_is_its_settings_field_with_the_same_default(kind):
    cls, command = COMMANDS[kind], main.commands[kind]
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


@pytest.mark.parametrize("kind", sorted(COMMANDS) + [f"request {r}" for r in sorted(REQUESTS)])
def test_every_field_says_what_it_is_and_every_default_passes_its_check(kind):
    cls = REQUESTS[kind.split()[1]] if kind.startswith("request ") else COMMANDS[kind]
    for row, f in zip(cls.describe(), dataclasses.fields(cls)):
        assert row["doc"].endswith("."), row
        assert row["option"] or row["name"] == "runs" or cls in REQUESTS.values(), row
        if str(f.type).split(" |")[0] in ("int", "float", "dict") or f.name == "shares":  # numbers, maps of them
            assert row["unit"], f"{kind} {row['name']}: a number without its unit"
            if f.metadata.get("check"):
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


LIVE_TEXT = "The cat sat on the mat and then it slept."
LIVE_TOKEN = "t0k3n"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A tiny GPT-2 (2 layers x 4 heads) saved as a folder that ``probe why --model`` reads, and the live server
    (Starlette's TestClient) on a session of the same model, its text cap 50 characters."""
    from starlette.testclient import TestClient

    from probe.live.server import make_app
    from probe.live.session import LiveSession

    folder = save_tiny("gpt2", tmp_path_factory.mktemp("live") / "gpt2")
    session = LiveSession(probe.load_model(str(folder)), LiveSettings(max_chars=50))
    return folder, session, TestClient(make_app(session, LIVE_TOKEN))


def _served(client, route: str, body: dict) -> str:
    """The one line the live server answers ``body`` with (status 400, a JSON object with ``error`` only)."""
    r = client.post(f"/api/{route}", json=body, headers={"X-Probe-Token": LIVE_TOKEN})
    assert r.status_code == 400 and list(r.json()) == ["error"], r.text
    line = r.json()["error"]
    assert "\n" not in line
    return line


#: One bad value of a live request that a command also takes: the command's arguments (after --model where it
#: loads one), its exit status, the route and the request's fields, and the one line. 12 tokens: LIVE_TEXT on
#: the tests' byte-level BPE (no special token added).
LIVE_BAD = {
    "head": (["why", "--head", "L0H9", "--text", LIVE_TEXT], 1, "head", {"layer": 0, "head": 9},
             "head L0H9 out of range: layers have heads 0-3 (the model has layers 0-1 and heads 0-3)"),
    "layer": (["why", "--head", "L5H0", "--text", LIVE_TEXT], 1, "head", {"layer": 5, "head": 0},
              "layer 5 out of range: the model has layers 0-1 and heads 0-3"),
    "query": (["why", "--head", "L0H1", "--text", LIVE_TEXT, "--query", "12"], 1, "head",
              {"layer": 0, "head": 1, "query": 12}, "query 12 out of range: the text has 12 tokens, rows 0-11"),
    "negative query": (["why", "--head", "L0H1", "--text", LIVE_TEXT, "--query", "-1"], 1, "head",
                       {"layer": 0, "head": 1, "query": -1},
                       "query -1 out of range: the text has 12 tokens, rows 0-11"),
    "top": (["why", "--head", "L0H1", "--text", LIVE_TEXT, "--top", "0"], 2, "head", {"layer": 0, "head": 1, "top": 0},
            "--top must be at least 1, got 0"),
    "ablation": (["effects", "--ablation", "bogus"], 2, "ablate", {"heads": [[0, 1]], "ablation": "bogus"},
                 "unknown ablation 'bogus'; choose from zero, mean, resample"),
}


@pytest.mark.parametrize("case", sorted(LIVE_BAD))
def test_a_bad_value_of_the_live_page_is_the_commands_message(live, case, tmp_path):
    """A head out of range, a query row past the text, a top below 1, an unknown ablation: the live server's
    400 line is the command's ``Error:`` line (whole for a run's error, inside click's usage line for an option's),
    the Python call's (the session's method, probe.why, the request's settings built from the JSON) and the
    notebook widget's (probe.live.api.answer): one check, one message."""
    from probe.live.api import answer

    folder, session, client = live
    args, status, route, fields, message = LIVE_BAD[case]
    model = ["--model", folder, "--out", tmp_path / "run"] if args[0] == "why" else []
    cli = one_error(invoke_cli(*args[:1], *model, *args[1:]), status, message)
    body = {"text": LIVE_TEXT, **fields}
    served = _served(client, route, body)
    assert served == message and (cli == f"Error: {message}" if status == 1 else message in cli)
    with pytest.raises(InputError) as called:
        getattr(session, route)(**body)
    assert str(called.value) == message
    assert answer(session, route, body) == (400, {"error": message})
    if route == "head":  # probe why's own doors: the library call, or its settings for a bound checked before it
        head = f"L{fields['layer']}H{fields['head']}"
        with pytest.raises(InputError) as why:
            if "top" in fields:
                WhySettings(head=head, text=LIVE_TEXT, top=fields["top"])
            else:
                probe.why(session.lm, LIVE_TEXT, head, fields.get("query"))
        assert str(why.value) == message
    if status == 2:  # a bound checked before the model: the request's settings say it, as the command's do
        with pytest.raises(InputError) as built:
            (HeadRequest if route == "head" else AblateRequest).from_mapping(body)
        assert str(built.value) == message


def test_the_live_caps_are_one_message_too(live):
    """A text over the cap: the server's 400 line is the session's and the widget's; the cap's own bound:
    ``probe live --max-chars 0``'s usage line holds LiveSettings' and LiveSession's line."""
    from probe.live.api import answer
    from probe.live.session import LiveSession

    folder, session, client = live
    text = "x" * 51
    message = "the text is 51 characters; the live page takes at most 50"
    assert _served(client, "edit", {"text": text}) == message
    assert _served(client, "head", {"text": text, "layer": 0, "head": 0}) == message
    with pytest.raises(InputError, match=message):
        session.edit(text)
    assert answer(session, "edit", {"text": text}) == (400, {"error": message})
    capped = LiveSession(session.lm, max_chars=50, max_tokens=11)  # LIVE_TEXT: 41 characters, 12 tokens
    assert len(session.lm.tokenizer(LIVE_TEXT)["input_ids"]) == capped.n_tokens(LIVE_TEXT) == 12
    assert answer(capped, "edit", {"text": LIVE_TEXT}) == (
        400, {"error": "the text is 12 tokens; the live page takes at most 11"})
    line = one_error(invoke_cli("live", "--max-chars", "0"), 2, "--max-chars must be at least 1, got 0")
    for make in (lambda: LiveSettings(max_chars=0), lambda: LiveSession(session.lm, max_chars=0),
                 lambda: LiveSettings.from_mapping({"max_chars": 0})):
        with pytest.raises(InputError) as exc:
            make()
        assert str(exc.value) == "--max-chars must be at least 1, got 0" and str(exc.value) in line
    one_error(invoke_cli("live", "--port", "70000"), 2, "--port must be at most 65535, got 70000")
    with pytest.raises(InputError, match="^unknown live setting 'max_char'; settings: host, port, max_chars"):
        LiveSession(session.lm, max_char=10)


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
    # a text is one string with more than white space, refused before any model is read; a target may be empty
    for text, message in ((["a b", "c"], "--text must be a string, got"), (123, "--text must be a string, got 123"),
                          (" \n", "--text is empty")):
        with pytest.raises(InputError, match=message):
            WhySettings.from_mapping({"head": "L1H0", "text": text})
    assert WhySettings.from_mapping({"head": "L1H0", "text": "a", "target": ""}).target == ""
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
#: The most parameters a public function or method of probe takes ("about a dozen": before the settings objects,
#: 42, analyze_run).
MOST_PARAMETERS = 12
#: The public functions still above it, as they are: the loop everything measures with (each option documented
#: argument by argument; 18 with ``announce``, the long-batch estimate's line), the attention maths with each model
#: family's switch (``probe.attention``; ``scored_attention`` the same and ``scored``), the library's pruning and
#: ablation experiments (``probe.prune``, ``probe.head_effects``: their options are PruneSettings' and
#: EffectsSettings' fields, as keywords; ``head_effects``' 15th and ``prune``'s 16th, ``estimate``, the line
#: saying the passes left)
#: and ``probe.show``. The head view's data (``view_data``, 19) takes 12: side 0's word alignment and what is
#: shown beside the maps are records (``probe.view.data.Alignment``, ``Display``).
ABOVE = {"probe.runs.analysis.analyze": 18, "probe.capture.op.attention": 14,
         "probe.capture.op.scored_attention": 15, "probe.pruning.experiment.prune": 16,
         "probe.effects.measure.head_effects": 15, "probe.entries.notebook.show": 13}


def _public_functions():
    """``(module.name, parameters)`` of every public function and every public method (``__init__`` included,
    ``self``/``cls`` not counted) of every public class of probe's modules but the command line's; a dataclass's
    generated ``__init__`` (a record's or a settings class's fields) is not a function someone wrote."""
    for info in pkgutil.walk_packages(probe.__path__, "probe."):
        if info.name.startswith("probe.cli") or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", len(inspect.signature(obj).parameters)
            elif inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") and attr != "__init__":
                        continue
                    if attr == "__init__" and dataclasses.is_dataclass(obj) and getattr(
                            getattr(member, "__code__", None), "co_filename", "") == "<string>":
                        continue  # dataclasses writes its __init__ as source text: its file is "<string>"
                    fn = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                    if not inspect.isfunction(fn):
                        continue
                    params = list(inspect.signature(fn).parameters)
                    bound = not isinstance(member, staticmethod) and params[:1] in (["self"], ["cls"])
                    yield f"{module.__name__}.{name}.{attr}", len(params) - bound


def test_no_public_function_takes_more_than_the_most_parameters():
    """Before the settings objects, 7 public functions took more than 15 parameters (analyze_run 42,
    analyze_texts 27, view_data 19, the two kernels 18, analyze and circuits.run.measure 17); the run calls
    take a settings object instead, and the folder-writing wrappers they replaced (why_run 13, patch_run 15
    parameters) are gone."""
    counts = dict(_public_functions())
    assert len(counts) > 1000 and any(".__init__" in name for name in counts)
    above = {name: n for name, n in counts.items() if n > MOST_PARAMETERS and name not in WIDE_BY_DESIGN}
    assert above == ABOVE
    calls = ["probe.entries.analyze.analyze_run", "probe.entries.texts.analyze_texts", "probe.circuits.run.measure",
             *(f"probe.entries.{m}" for m in ("analyze.run_analyze", "pairs.run_patch", "pairs.run_path",
                                              "pairs.run_circuit", "ablation.run_effects", "ablation.run_prune",
                                              "why.run_why", "checks.run_verify", "compare.run_compare"))]
    assert max(counts[name] for name in calls) <= 12, {name: counts[name] for name in calls}
