"""The "Attention over audio" section: each kept clip's waveform with its tokens aligned to time
and the alignment heads' cross-attention (:mod:`probe.audio.view`), and the alignment in run.json;
for a raw-waveform encoder, the waveform and where each layer's attention lands
(:mod:`probe.audio.frames`)."""

from __future__ import annotations

from markupsafe import Markup, escape

from .sections import Section, section_builder


@section_builder
def speech_section(result, tokenizer) -> Section | None:
    """The section, or None where no clip was analysed."""
    examples = result.results.get("speech")
    if not examples:
        return None
    from ..audio.view import caption, speech_html  # deferred: a text model's page imports no audio stack (scipy)

    html = f'<div class="speech-section"><p>{escape(caption())}</p>' + "".join(speech_html(ex) for ex in examples)
    record = {"clips": [{"name": ex.name, "seconds": round(len(ex.waveform) / ex.rate, 4), "frame_s": ex.frame_s,
                         "offset_s": ex.offset_s, "heads": [list(h) for h in ex.heads], "heads_from": ex.source,
                         "alignment": [[t, round(s, 4), round(e, 4)] for t, s, e in ex.alignment()]}
                        for ex in examples]}
    return Section("speech-attention", "Attention over audio", Markup(html + "</div>"), record=record, order=16)


@section_builder
def frames_section(result, tokenizer) -> Section | None:
    """The section of a raw-waveform encoder's clips, or None where none was analysed."""
    examples = result.results.get("frames")
    if not examples:
        return None
    from ..audio.frames import caption as frames_caption  # deferred: as the audio view above
    from ..audio.frames import frames_html  # deferred: as the audio view above

    html = (f'<div class="speech-section"><p>{escape(frames_caption())}</p>'
            + "".join(frames_html(ex) for ex in examples) + "</div>")
    record = {"clips": [{"name": ex.name, "seconds": round(len(ex.waveform) / ex.rate, 4), "frame_s": ex.frame_s,
                         "frames": ex.frames} for ex in examples]}
    return Section("speech-attention", "Attention over audio", Markup(html), record=record, order=17)
