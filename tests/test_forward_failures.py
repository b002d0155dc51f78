"""An exception raised inside a model's own forward pass (probe/capture/failures.py) is answered in one
``Error:`` line naming probe's step and the model's reason, in discovery, capture and any command;
an exception raised in probe's own code keeps its traceback.

Found on a tiny X-MOD model (no spec; discovered): its forward pass raises ``ValueError: Input language
unknown`` when no language id is given, and ``probe analyze`` / ``probe verify`` printed 65 lines of
traceback through spec_for -> discover."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import bert_tokenizer, invoke_cli, one_error
from probe.architectures import DISCOVERED
from probe.capture.failures import forward_failures, from_model
from probe.errors import InputError, ModelForwardError

ROOT = Path(__file__).resolve().parents[1]


def _xmod(folder: Path, language: str | None = None) -> Path:
    """A tiny X-MOD model (hidden 64, 2 layers, 4 heads) and its tokenizer, saved to ``folder``."""
    import transformers as tr

    tok = bert_tokenizer()
    config = tr.XmodConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=64, default_language=language)
    torch.manual_seed(0)
    tr.XmodModel(config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture
def forget_xmod():
    yield
    DISCOVERED.pop("xmod", None)


def test_a_model_that_needs_a_language_id_is_refused_in_one_line_by_analyze_and_verify(tmp_path, forget_xmod):
    folder = _xmod(tmp_path / "xmod")
    # the real entry point, run where a default run folder would go (reports/ under the working directory)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "probe", "analyze", "--model", str(folder), "--text", "Hi there."],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: discovery") and "XmodModel's own forward pass" in lines[0]
    assert "ValueError: Input language unknown" in lines[0] and "language id" in lines[0] and "en_XX" in lines[0]
    assert not (tmp_path / "reports").exists() and proc.stdout == ""
    one_error(invoke_cli("verify", "--model", folder, "--no-progress"), 1, "discovery", "language id")
    # what the line says to do works: a default language in config.json, and verify passes
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "default_language": "en_XX"}))
    result = invoke_cli("verify", "--model", folder, "--no-progress")
    assert result.exit_code == 0 and "PASS" in result.stdout, result.output


def test_capture_names_its_step_when_the_model_refuses_there(tmp_path, forget_xmod):
    from probe.capture.maps import capture_attention
    from probe.loading.models import load_model

    lm = load_model(str(_xmod(tmp_path / "xmod", "en_XX")))  # discovered with a language
    assert capture_attention(lm, ["Hi there."]).probs  # it captures
    lm.model.config.default_language = None
    with pytest.raises(ModelForwardError, match=r"^capture .*XmodModel's own forward pass: ValueError: Input "
                                                r"language unknown.*language id") as info:
        capture_attention(lm, ["Hi there."])
    assert isinstance(info.value.__cause__, ValueError)  # the model's exception is kept as the cause


def test_any_exception_of_the_models_code_is_the_models_and_probes_own_are_not():
    """The rule (module docstring): through a module call, and no frame inside it is probe's. Torch raising for
    the model's code counts as the model's; a callback of the user's that probe's listener called does not
    (tests/test_capture.py: it leaves as it was raised)."""
    layer = torch.nn.Linear(4, 3)
    with pytest.raises(ModelForwardError, match=r"^step failed inside Linear's own forward pass: RuntimeError: "):
        with forward_failures("step", layer):
            layer(torch.zeros(2, 5))  # torch refuses the shapes inside the module's forward
    # probe's own code inside a module call: a frame in probe's package is innermost
    probe_file = str(ROOT / "probe" / "capture" / "failures.py")
    space: dict = {}
    exec(compile("def hook(module, args):\n    raise ValueError('a bug in probe')\n", probe_file, "exec"), space)
    layer.register_forward_pre_hook(space["hook"])
    with pytest.raises(ValueError, match="a bug in probe"):
        with forward_failures("step", layer):
            layer(torch.zeros(2, 4))
    # a ProbeError passes as it is, and so does an exception outside any forward pass
    for exc in (InputError("bad"), ValueError("not in a forward pass")):
        with pytest.raises(type(exc), match=str(exc)):
            with forward_failures("step"):
                raise exc
    try:
        raise KeyError("outside")
    except KeyError as exc:
        assert not from_model(exc)


def test_verification_names_its_step_when_the_model_refuses_there(tmp_path, forget_xmod):
    """MiniMax refused transformers' key/value cache inside its forward pass in `probe verify`, and the
    models table showed the raw ``ValueError``: verification is a step like discovery and capture."""
    from probe.loading.models import load_model
    from probe.verification import verify

    lm = load_model(str(_xmod(tmp_path / "xmod", "en_XX")))
    assert verify(lm, cases=["sentence"]).passed
    lm.model.config.default_language = None
    with pytest.raises(ModelForwardError, match=r"^verification \(.*\) failed inside XmodModel's own forward pass: "
                                                r"ValueError: Input language unknown"):
        verify(lm, cases=["sentence"])
