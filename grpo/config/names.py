"""Near names for unknown keys: the ``(did you mean 'x'?)`` hints of the config, TRL-key and recipe errors."""

from __future__ import annotations

import difflib


def close_names(name: str, candidates: list[str], n: int = 3) -> list[str]:
    """The candidates most like `name`, best first: the same last part under another section ('train.lr' ->
    'optim.lr'; shallower keys first), then a near spelling of the last part among its siblings, or of the
    whole name (or a name it abbreviates) when its section is unknown too."""
    section, _, leaf = name.rpartition(".")
    leaf_of = {c: c.rpartition(".")[2] for c in candidates}
    same_leaf = sorted((c for c in candidates if leaf_of[c] == leaf), key=lambda c: c.count("."))
    siblings = {leaf_of[c]: c for c in candidates if c.rpartition(".")[0] == section}
    if section and siblings:
        near = [siblings[m] for m in difflib.get_close_matches(leaf, list(siblings), n=n, cutoff=0.6)]
    else:                                    # a near spelling, or an abbreviation ('algo' -> 'algorithm')
        near = difflib.get_close_matches(name, candidates, n=n, cutoff=0.75)
        near += [c for c in candidates if len(name) >= 3 and c.startswith(name)]
    return list(dict.fromkeys(same_leaf + near))[:n]


def did_you_mean(name: str, candidates: list[str]) -> str:
    """The hint ` (did you mean 'x' or 'y'?)` for the closest candidates ('' when none is close)."""
    close = close_names(name, candidates)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
