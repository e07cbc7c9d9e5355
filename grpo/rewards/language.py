"""Language consistency (DeepSeek-R1, section 2.3.3): the share of the reasoning written in the
target language, measured by Unicode script.

Words: the text is split at whitespace, and every Han character is a word of its own (Chinese
is written without spaces). A word's letters are its ``str.isalpha()`` characters; words with no
letter (numbers, punctuation, formulas such as ``2+2=4``) are ignored. A word is in the target
script when all of its letters are in that script's Unicode ranges.
"""

from __future__ import annotations

import re

from grpo.rewards.scoring import RewardError
from grpo.rewards.text import as_text, reasoning_text

#: Unicode code point ranges (inclusive) of the letters of each script.
SCRIPTS: dict[str, tuple[tuple[int, int], ...]] = {
    "latin": ((0x41, 0x5A), (0x61, 0x7A), (0xAA, 0xAA), (0xBA, 0xBA), (0xC0, 0x24F), (0x1D00, 0x1D7F),
              (0x1E00, 0x1EFF), (0x2C60, 0x2C7F), (0xA720, 0xA7FF), (0xAB30, 0xAB6F), (0xFF21, 0xFF3A),
              (0xFF41, 0xFF5A)),
    "han": ((0x2E80, 0x2FDF), (0x3005, 0x3007), (0x3021, 0x3029), (0x3038, 0x303B), (0x3400, 0x4DBF),
            (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x2FA1F), (0x30000, 0x323AF)),
    "cyrillic": ((0x400, 0x52F), (0x1C80, 0x1C8F), (0x2DE0, 0x2DFF), (0xA640, 0xA69F)),
    "greek": ((0x370, 0x3FF), (0x1F00, 0x1FFF)),
}

#: Language codes and names -> script (a ``language`` value may also name a script directly).
LANGUAGE_SCRIPTS: dict[str, str] = {
    **dict.fromkeys(("en", "english", "fr", "french", "de", "german", "es", "spanish", "it", "italian", "pt",
                     "portuguese", "nl", "dutch", "pl", "polish", "cs", "sv", "da", "no", "fi", "tr", "turkish",
                     "id", "indonesian", "vi", "vietnamese", "ro", "hu", "ca"), "latin"),
    **dict.fromkeys(("zh", "chinese", "cn", "zho", "cmn", "yue"), "han"),
    **dict.fromkeys(("ru", "russian", "uk", "ukrainian", "bg", "bulgarian", "sr", "mk", "be", "kk"), "cyrillic"),
    **dict.fromkeys(("el", "greek"), "greek"),
}
DEFAULT_LANGUAGE = "en"

_HAN_CLASS = "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in SCRIPTS["han"])
_WORD_RE = re.compile(f"[{_HAN_CLASS}]|[^\\s{_HAN_CLASS}]+")


def target_script(language: str | None, default: str = DEFAULT_LANGUAGE) -> str:
    """'zh-CN' -> 'han', 'ru' -> 'cyrillic', 'Latin' -> 'latin'; None -> the default's script."""
    key = str(language if language not in (None, "") else default).strip().lower()
    if key in SCRIPTS:
        return key
    base = re.split(r"[-_]", key)[0]
    if base in LANGUAGE_SCRIPTS:
        return LANGUAGE_SCRIPTS[base]
    raise ValueError(f"unknown language '{language}': use a script ({', '.join(SCRIPTS)}) or a language code "
                     f"such as en, zh, ru, el")


def in_script(char: str, script: str) -> bool:
    """True when the character's code point is in one of the script's ranges."""
    code = ord(char)
    return any(lo <= code <= hi for lo, hi in SCRIPTS[script])


def words(text: str) -> list[str]:
    """Whitespace-separated words, every Han character a word of its own."""
    return _WORD_RE.findall(text)


def script_share(text: str, script: str) -> float:
    """Share of the words with letters whose letters are all in ``script`` (0.0 when there are none)."""
    lettered = [[c for c in w if c.isalpha()] for w in words(text)]
    lettered = [letters for letters in lettered if letters]
    if not lettered:
        return 0.0
    return sum(all(in_script(c, script) for c in letters) for letters in lettered) / len(lettered)


def make_language_consistency(language: str = DEFAULT_LANGUAGE):
    """A language_consistency reward whose target, without a ``language`` column, is ``language``."""
    try:
        target_script(language)  # fail now on an unknown default
    except ValueError as e:
        raise RewardError(f"language_consistency: {e}") from None
    default = language

    def language_consistency(prompts: list, completions: list, language: list | None = None,
                             **_: object) -> list[float]:
        """Share of the reasoning's words written in the target script (DeepSeek-R1's language
        consistency reward), in [0, 1].

        Reasoning: the ``<think>`` block if present, else the whole completion (see
        grpo.rewards.text.reasoning_text). Target: the row's ``language`` column (a language code
        like en / zh-CN / ru, a name like Chinese, or a script: latin | han | cyrillic | greek),
        default English (Latin script). Words without letters are ignored; reasoning with no words
        with letters scores 0.0. An unknown language is an error.
        """
        targets = language if language is not None else [None] * len(completions)
        return [script_share(reasoning_text(as_text(c)), target_script(t, default))
                for c, t in zip(completions, targets)]

    return language_consistency


language_consistency = make_language_consistency()
