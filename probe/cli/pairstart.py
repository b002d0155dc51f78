"""The start shared by the commands on prompt pairs (``probe patch``, ``probe circuit``,
``probe path``): the pairs read and checked, the run folder claimed, then the model loaded, in that
order, so that a bad pairs file or a taken folder fails before minutes of loading weights."""

from __future__ import annotations

from collections.abc import Callable

from .group import hold


def pair_input(pairs_file) -> tuple[list, str]:
    """The pairs of ``pairs_file`` (else the built-in indirect-object pairs) and where they came from,
    read before torch is imported (:mod:`probe.text.pairfile`): a command calls it first, so that a
    malformed or non-UTF-8 file is answered at once.

    Raises:
        InputError: an unreadable file, a line without four or five fields, no pair.
    """
    from ..text.pairfile import builtin_pairs, read_pairs

    return (read_pairs(pairs_file), pairs_file) if pairs_file else (builtin_pairs(), "built-in IOI set")


def pairs_and_model(model_name: str, pairs_file, out, force: bool, *, dtype, device, head: str | None = None,
                    check: Callable | None = None, kind_check: Callable | None = None, given=None):
    """Read the pairs (``pairs_file``, else the built-in indirect-object pairs), check them against the
    model's tokenizer, claim ``out`` for the command's life, load the model and check it.

    Args:
        model_name: an alias, a folder or a Hub id.
        pairs_file: a pairs TSV, or None for the built-in pairs (decoders only).
        out, force: the run folder and whether an existing one may be replaced.
        dtype, device: where and how the weights sit.
        head: the model head to load (``"auto"``: a masked-LM head where the checkpoint has one), or
            None for the loader's default.
        check: called with the loaded model before anything runs (raises to refuse it).
        kind_check: the command's refusal by the model's kind, called before the weights load (with
            the model's preview, where it is on this machine) and again once loaded.
        given: ``(pairs, source)`` already read by :func:`pair_input` (else read here).

    Returns:
        ``(lm, pairs, source, out)``: the loaded model, the pairs, where they came from, the claimed
        run folder's path.

    Raises:
        InputError: a bad pairs file, or pairs that do not fit the tokenizer; the built-in pairs on a
            model that is not a decoder; ``out`` a file, not empty without ``force``, or being written
            by another run.
    """
    pairs, source = given if given is not None else pair_input(pairs_file)
    from ..effects.patch_run import builtin_refusal, check_before_loading
    from ..loading.models import load_model
    from ..report import claim_run_dir

    check_before_loading(model_name, pairs, builtin=not pairs_file, kind_check=kind_check)  # weights take minutes
    out = hold(claim_run_dir(out, model_name, force))  # claimed before loading a model: one run per folder
    lm = load_model(model_name, dtype=dtype, device=device, **({} if head is None else {"head": head}))
    for each in (kind_check, check):
        if each is not None:
            each(lm)
    if lm.kind != "decoder" and not pairs_file:
        raise builtin_refusal(lm.name, lm.kind)
    return lm, pairs, source, out
