"""The settings of each run kind, one class per command (``probe analyze``, ``verify``, ``prune``,
``effects``, ``patch``, ``path``, ``circuit``, ``why``, ``compare``): every choice a user makes, with its
default, unit and bound written once here. The command's options take their defaults and checks from these
fields (tests/test_settings.py holds the two together), the library calls take these objects
(:mod:`probe.entries.kinds`), and the live page builds them from a request with
:meth:`~probe.settings.fields.Settings.from_mapping`: one bad value, one message, whichever door.
"""

from __future__ import annotations

import os

from .. import bounds
from ..errors import InputError
from ..rules import health_thresholds
from .fields import OptionConflict, Settings, setting, settings_class, typed

#: The names of ``probe.capture.reference.mutants.MUTANTS`` (that module imports torch: not read here so that
#: ``probe --help`` starts without it; tests/test_start_up.py checks the two agree).
MUTANT_NAMES = ("alibi-sign", "c2p-sign", "causal-inverted", "merge-without-transpose", "no-causal-mask",
                "no-padding-mask", "no-scale", "scale-d-model")
#: ``probe.verification.FP32_RTOL``, the default relative tolerance (written here for the same reason and
#: checked by the same test).
FP32_RTOL = 1e-5
#: The labels ``probe why --corpus`` averages over (``probe.qk.corpus.RULES``; checked by tests/test_settings.py).
WHY_LABELS = ("previous-token", "next-token", "self", "first-token", "induction", "duplicate-token", "sep")


def _count(option: str, minimum: int = 1):
    return lambda v: bounds.positive_int(option, v, minimum)


def _limit():
    return setting(None, doc="At most this many sequences (of each annotated file).", unit="sequences",
                   bound=">= 1", check=bounds.limit, option="--limit")


def _max_length(doc: str = "Token limit per sequence [default: the model's limit; above it: an error]."):
    return setting(None, doc=doc, unit="tokens", bound=">= 2, <= the model's limit", check=_count("--max-length", 2),
                   option="--max-length")


def _batch_size(default: int = 16, doc: str = "Sequences per forward pass."):
    return setting(default, doc=doc, unit="sequences", bound=">= 1", check=_count("--batch-size"),
                   option="--batch-size")


def query_setting():
    """The query row of ``probe why --query`` and of the live page's head request: an integer, its range the
    text's (checked with the text: ``query Q out of range: the text has T tokens, rows 0-T-1``)."""
    return setting(None, doc="The query row [default: the last].", unit="token position",
                   bound=">= 0, < the text's tokens", option="--query")


def top_setting():
    """The keys ``probe why --top`` lists, and the live page's head request (one bound, one message)."""
    return setting(5, doc="Keys listed (the most attended).", unit="keys", bound=">= 1", check=_count("--top"),
                   option="--top")


def _pairs_file():
    return setting(None, doc="A file of prompt pairs: clean, corrupted, answer, wrong (tab-separated) [default: "
                             "the built-in indirect-object set, decoders].", bound="a UTF-8 file", option="--pairs")


def _text(option: str):
    """A check of one optional text: a string (:func:`~probe.settings.fields.typed`) with more than white
    space; else one line naming ``option``, before any model loads."""
    return lambda value: bounds.texts(typed(option, value, "str"), option)[0]


def _strings(value) -> tuple:
    """One string or path, or a sequence of them, as a tuple of strings (paths as strings)."""
    items = (value,) if isinstance(value, (str, os.PathLike)) else tuple(value)
    return tuple(os.fspath(v) if isinstance(v, os.PathLike) else v for v in items)


@settings_class
class AnalyzeSettings(Settings):
    """``probe analyze``: what is measured, on which input, and how (:func:`probe.entries.kinds.run_analyze`)."""

    kind = "analyze"

    texts: tuple = setting((), doc="Sequences to analyse.", bound="non-empty strings", check=_strings,
                           option="--text")
    corpus: str | None = setting(None, doc="Plain text (one sequence a line) or CoNLL-U.", option="--corpus")
    pairs: str | None = setting(None, doc="Two texts a line, tab-separated: two segments, or an encoder-decoder's "
                                          "source and target.", option="--pairs")
    generate: int | None = setting(None, doc="Encoder-decoder models: the model writes each source's target (greedy, "
                                             "at most this many new tokens).", unit="tokens", bound=">= 1",
                                   check=_count("--generate"), option="--generate")
    limit: int | None = _limit()
    images: tuple = setting((), doc="Image files (image models).", check=_strings, option="--image")
    image_folder: str | None = setting(None, doc="Every image file of a folder, by name.", option="--images")
    image_size: tuple | None = setting(None, doc="Resize images to (height, width) instead of the processor's size.",
                                       unit="pixels", bound="two integers >= 1 (HxW)", check=bounds.image_size,
                                       option="--image-size")
    audio: tuple = setting((), doc="Audio clips (speech models).", check=_strings, option="--audio")
    transcripts: tuple = setting((), doc="The transcript the decoder reads, one per audio clip.", check=_strings,
                                 option="--transcript")
    coref: str | None = setting(None, doc="A GAP TSV file whose coreference heads are scored, or 'builtin'.",
                                option="--coref")
    syntax: str | None = setting(None, doc="A CoNLL-U file whose dependency heads are scored.", option="--syntax")
    batch_size: int = _batch_size()
    max_length: int | None = _max_length()
    examples: int = setting(3, doc="Sequences whose attention maps are kept for the report.", unit="sequences",
                            bound="0 to 20", check=lambda v: bounds.int_range("--examples", v, 0, 20),
                            option="--examples")
    thresholds: dict | None = setting(None, doc="Label thresholds overriding the defaults (label -> value).",
                                      unit="the label's statistic (probe.rules.LABEL_RULES: a share of attention, "
                                           "a normalized entropy)", bound="each in (0, 1]", check=bounds.thresholds,
                                      option="--threshold")
    parse_special_tokens: bool = setting(False, doc="Typed special-token strings become special tokens.",
                                         option="--parse-special-tokens")
    rollout: bool = setting(True, doc="Attention rollout and flow of the first kept examples.", option="--rollout")
    verify: bool = setting(False, doc="Also verify the from-scratch attention against the model.", option="--verify")
    query_block: int | None = setting(None, doc="Capture attention this many query rows at a time (0: whole maps; "
                                                "default: automatic above 1024 tokens).", unit="query rows",
                                      bound=">= 0", check=_count("--query-block", 0), option="--query-block")
    distance: bool = setting(True, doc="Jensen-Shannon distances between heads (groups, head map, duplicates).",
                             option="--distance")
    map_sequences: int = setting(200, doc="Sequences in the all-heads distance behind the map and groups.",
                                 unit="sequences", bound=">= 1", check=_count("--map-sequences"),
                                 option="--map-sequences")
    circuits: bool = setting(True, doc="Decoders: the induction / duplicate-token probe, attention sinks.",
                             option="--circuits")
    health: dict | None = setting(None, doc="Health-check thresholds overriding the defaults (check -> value).",
                                  unit="the check's statistic (probe.rules.HEALTH_RULES: a share of attention, a "
                                       "normalized entropy, a distance)", bound="each in (0, 1]",
                                  check=lambda v: (health_thresholds(v), dict(v))[1],
                                  option="--health-threshold")
    value_weighted: bool = setting(True, doc="Value-weighted statistics (Kobayashi et al. 2020).", option="--norm")
    labels_by: str = setting("weight", doc="Labels from the attention statistics or their value-weighted forms.",
                             choices=bounds.LABELS_BY, bound="weight or norm", option="--labels-by")

    def check_together(self) -> None:
        if sum(bool(x) for x in (self.texts, self.corpus, self.pairs)) > 1:
            raise OptionConflict("give either --text, --corpus or --pairs, not two of them")
        if (self.coref is not None or self.syntax is not None) and (self.texts or self.corpus or self.pairs):
            raise OptionConflict("--coref and --syntax analyse their own annotated text; leave out --text, --corpus "
                                 "and --pairs")
        if self.generate is not None and self.pairs:
            raise OptionConflict("give either --pairs (sources and targets) or --generate (sources only), not both")
        bounds.value_weighting(self.value_weighted, self.labels_by)  # --labels-by norm with --no-norm


@settings_class
class VerifySettings(Settings):
    """``probe verify``: the tolerances and the cases (:func:`probe.entries.kinds.run_verify`)."""

    kind = "verify"

    atol: float | None = setting(None, doc="Absolute tolerance [default: 1e-05 for float32, 0.01 for bfloat16/"
                                           "float16].", unit="the compared values' own (probabilities, outputs)",
                                 bound="finite, >= 0",
                                 check=lambda v: bounds.tolerance("--atol", v), option="--atol")
    rtol: float = setting(FP32_RTOL, doc="Relative tolerance.", unit="a ratio to |the model's value|",
                          bound="finite, >= 0",
                          check=lambda v: bounds.tolerance("--rtol", v), option="--rtol")
    mutant: str | None = setting(None, doc="Verify a deliberately broken attention instead (expected to FAIL).",
                                 choices=MUTANT_NAMES, bound="a mutant's name", option="--mutant")
    quick: bool = setting(False, doc="Check one sentence only (the 'sentence' case).", option="--quick")


@settings_class
class PruneSettings(Settings):
    """``probe prune``: the pruning experiment (:func:`probe.entries.kinds.run_prune`)."""

    kind = "prune"

    corpus: str | None = setting(None, doc="Plain text or CoNLL-U [default: the built-in sample].", option="--corpus")
    limit: int | None = _limit()
    objective: str | None = setting(None, doc="What pruning must not hurt [default: chosen from the model].",
                                    choices=("clm", "mlm", "fidelity", "classification"), option="--objective")
    labels: str | None = setting(None, doc="classification: a file of one label per line, in corpus order.",
                                 option="--labels")
    orders: tuple = setting(bounds.PRUNING_ORDERS, doc="Curves to run; the first one's heads are removed from the "
                                                        "pruned copy.", bound="distinct, of importance, redundancy, "
                                                                              "random", check=bounds.pruning_orders,
                            option="--order")
    steps: int = setting(10, doc="Pruning steps (points after step 0).", unit="steps", bound=">= 1",
                         check=_count("--steps"), option="--steps")
    fraction: float = setting(0.5, doc="Share of all heads pruned by the last step.", unit="share of heads",
                              bound="(0, 1)",
                              check=lambda v: bounds.fraction("--fraction", v), option="--fraction")
    seeds: int = setting(3, doc="Random orders.", unit="orders", bound=">= 3", check=_count("--seeds", 3),
                         option="--seeds")
    batch_size: int = _batch_size()
    max_length: int | None = _max_length("Token limit per sequence [default: the model's].")


@settings_class
class EffectsSettings(Settings):
    """``probe effects``: ablation of every head and label group (:func:`probe.entries.kinds.run_effects`)."""

    kind = "effects"

    corpus: str | None = setting(None, doc="Plain text or CoNLL-U [default: the built-in sample].", option="--corpus")
    pairs: str | None = setting(None, doc="Encoder-decoder models: source<TAB>target per line.", option="--pairs")
    limit: int | None = _limit()
    objective: str | None = setting(None, doc="What an ablation may hurt [default: from the model].",
                                    choices=("clm", "mlm", "fidelity", "seq2seq"), option="--objective")
    ablation: tuple = setting(("zero", "mean"), doc="Ablations, in the order zero, mean, resample.",
                              bound="of zero, mean, resample", check=lambda v: bounds.ablation_kinds(bounds.listed(v)),
                              option="--ablation")
    seeds: int = setting(10, doc="Random head sets per label group.", unit="sets", bound=">= 5",
                         check=_count("--seeds", 5), option="--seeds")
    copies: int = setting(8, doc="Ablation sets per forward pass.", unit="sets", bound=">= 1",
                          check=_count("--copies"), option="--copies")
    clusters: bool = setting(False, doc="Also ablate each head group against random heads.", option="--clusters")
    induction: bool = setting(True, doc="Decoders: test the induction claim.", option="--no-induction")
    batch_size: int = _batch_size()
    max_length: int | None = _max_length("Token limit per sequence [default: the model's].")

    def check_together(self) -> None:
        if self.corpus and self.pairs:
            raise OptionConflict("give either --corpus or --pairs, not both")


@settings_class
class PatchSettings(Settings):
    """``probe patch``: activation patching, DLA and composition (:func:`probe.entries.kinds.run_patch`)."""

    kind = "patch"

    pairs: str | None = _pairs_file()
    direction: str = setting("denoise", doc="denoise: corrupted run, clean head output; noise: the reverse.",
                             choices=("denoise", "noise"), option="--direction")
    method: str = setting("activation", doc="attribution: also attribution patching (the gradient estimate).",
                          choices=("activation", "attribution"), option="--method")
    components: tuple = setting(("z",), doc="What is patched (z always, first).",
                                bound=f"of {', '.join(bounds.COMPONENT_NAMES)}",
                                check=lambda v: tuple(dict.fromkeys(("z", *bounds.components(",".join(_strings(v)))))),
                                option="--component")
    heads_per_pass: int | None = setting(None, doc="Patched copies of the batch in one forward pass [default: 2 x "
                                                   "heads].", unit="copies", bound=">= 1",
                                         check=_count("--heads-per-pass"), option="--heads-per-pass")
    rope_offsets: int = setting(1, doc="RoPE models: composition averaged over relative offsets 0..K-1.",
                                unit="offsets", bound=">= 1", check=_count("--rope-offsets"), option="--rope-offsets")


@settings_class
class PathSettings(Settings):
    """``probe path``: path patching of senders into receivers (:func:`probe.entries.kinds.run_path`)."""

    kind = "path"

    senders: str = setting(doc="Sender heads, comma-separated (L5H1,L5H2).", bound="heads of the model",
                           check=lambda v: bounds.head_names("--senders", v), option="--senders")
    receivers: str = setting(doc="Receivers, comma-separated: logits, or a head's q, k or v input (L9H6.q).",
                             bound="inputs of the model", check=lambda v: bounds.head_names("--receivers", v),
                             option="--receivers")
    pairs: str | None = _pairs_file()

    def check_together(self) -> None:
        """A receiver at or below the layer of every sender reads nothing they write: refused from the names.

        Raises:
            InputError: as :func:`probe.bounds.path_reads`.
        """
        bounds.path_reads(self.senders, self.receivers)


@settings_class
class CircuitSettings(Settings):
    """``probe circuit``: edge attribution, the circuit, its faithfulness (:func:`probe.entries.kinds.run_circuit`)."""

    kind = "circuit"

    pairs: str | None = _pairs_file()
    method: str = setting("eap-ig", doc="eap: gradient at the clean run; eap-ig: averaged over steps points.",
                          choices=("eap-ig", "eap"), option="--method")
    steps: int = setting(5, doc="EAP-IG's integration points m.", unit="points", bound=">= 1",
                         check=_count("--steps"), option="--steps")
    points: str = setting("right", doc="EAP-IG's points: right (k = 1..m) or left (k = 0..m-1).",
                          choices=("right", "left"), option="--points")
    edges: int | None = setting(None, doc="Edges in the circuit [default: 5% of all edges].", unit="edges",
                                bound=">= 1, <= the graph's edges", check=_count("--edges"), option="--edges")
    select: str = setting("top-k", doc="top-k: the largest |score|; greedy: removal while faithfulness holds.",
                          choices=("top-k", "greedy"), option="--select")
    threshold: float = setting(0.8, doc="select greedy: the faithfulness the circuit keeps.",
                               unit="faithfulness: (M(C) - M(empty)) / (M(full) - M(empty))", bound="(0, 1]",
                               check=lambda v: bounds.fraction("--threshold", v, closed_high=True),
                               option="--threshold")
    max_passes: int = setting(2000, doc="select greedy: the most circuits evaluated.", unit="circuits", bound=">= 1",
                              check=_count("--max-passes"), option="--max-passes")
    seeds: int = setting(5, doc="Random circuits per size for the faithfulness baseline.", unit="circuits",
                         bound=">= 1", check=_count("--seeds"), option="--seeds")
    shares: tuple | None = setting(None, doc="Circuit sizes of the faithfulness curve, as shares of all edges.",
                                   unit="share of edges", bound="each in (0, 1]", check=bounds.shares,
                                   option="--shares")
    batch_size: int | None = _batch_size(None, "Pairs per forward pass [default: all pairs, as many as about 3 GB of "
                                              "writes and gradients hold].")


@settings_class
class WhySettings(Settings):
    """``probe why``: one head's scores split by source (:func:`probe.entries.kinds.run_why`)."""

    kind = "why"

    head: str = setting(doc="The head (L5H1; an encoder-decoder model's cross head: 'cross L5H1').",
                        bound="a head of the model", check=bounds.head_form, option="--head")
    text: str | None = setting(None, doc="The sequence (an encoder-decoder model's source).", bound="not empty",
                               check=_text("--text"), option="--text")
    target: str | None = setting(None, doc="Encoder-decoder models: the decoder's text [default: the source].",
                                 option="--target")
    corpus: str | None = setting(None, doc="Instead of text: a corpus whose rows fitting the label are averaged.",
                                 option="--corpus")
    label: str | None = setting(None, doc="With corpus: the rows to average [default: the head's label].",
                                choices=WHY_LABELS, option="--label")
    limit: int | None = _limit()
    query: int | None = query_setting()
    top: int = top_setting()

    def check_together(self) -> None:
        if (self.text is None) == (self.corpus is None):
            raise OptionConflict("give either --text or --corpus")
        if self.corpus is None and (self.label is not None or self.limit is not None):
            raise OptionConflict("--label and --limit go with --corpus")
        if self.corpus is not None and (self.query is not None or self.target is not None):
            raise OptionConflict("--query and --target go with --text")


@settings_class
class CompareSettings(Settings):
    """``probe compare``: two run folders, or two models analysed on one corpus
    (:func:`probe.entries.kinds.run_compare`)."""

    kind = "compare"

    runs: tuple = setting((), doc="Two run folders (A, B).", bound="none or two", check=_strings)
    models: tuple = setting((), doc="Two models analysed on one corpus instead.", bound="none or two",
                            check=_strings, option="--model")
    texts: tuple = setting((), doc="Sequences for the two models.", check=_strings, option="--text")
    corpus: str | None = setting(None, doc="A corpus for the two models [default: the built-in sample].",
                                 option="--corpus")
    limit: int | None = _limit()
    batch_size: int = _batch_size()
    max_length: int | None = _max_length("Truncate sequences to this many tokens.")
    top: int = setting(4, doc="Most changed heads drawn side by side.", unit="heads", bound="0 to 20",
                       check=lambda v: bounds.int_range("--top", v, 0, 20), option="--top")

    def check_together(self) -> None:
        if bool(self.runs) == bool(self.models) or (self.runs and len(self.runs) != 2) or (
                self.models and len(self.models) != 2):
            raise OptionConflict("give two run folders (RUN_A RUN_B) or two models (--model A --model B)")
        if self.runs and (self.texts or self.corpus or self.limit):
            raise OptionConflict("--text, --corpus and --limit go with --model, not with run folders")
        if self.texts and self.corpus:
            raise InputError("give either --text or --corpus, not both")


#: Each run kind's settings class, by the command's name.
SETTINGS: dict[str, type[Settings]] = {cls.kind: cls for cls in (
    AnalyzeSettings, VerifySettings, PruneSettings, EffectsSettings, PatchSettings, PathSettings, CircuitSettings,
    WhySettings, CompareSettings)}
