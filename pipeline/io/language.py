"""Which language a record is in (input.language_check), before it is decoded.

py3langid (a numpy port of langid.py, 97 languages, its model in the wheel) was chosen by measurement
(benchmarks/language-check-m/): on the project's Multi30k German and English sentences it was right on 99.95%
of them (lingua 99.8% in its high accuracy mode, langdetect 99.4%), on noisy strings 99.2% (91%, 91%), on
strings of 2-3 words 77% (73%, 73%), and it labels ~40,000 records/s on one core (lingua 465, langdetect 1,100).

A record counts as in another language only where the detector is at least CONFIDENT sure of it (its
probability normalized over the languages it knows): on those sets at 0.8 no German record of a German job
was taken for another language, and 96.6% of the English sentences were caught (at 0.5: 1.0% of 2-3 word
German strings taken for another, 99.6% caught)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

LANGUAGE_CHECKS = ("off", "flag", "skip")
CONFIDENT = 0.8
SKIPPED = "language"  # the `skipped` column of a record input.language_check: skip returned untranslated


@functools.cache
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def base_code(language: str) -> str:
    """A language tag's primary subtag, lowercase: "pt-BR" -> "pt"."""
    return language.replace("_", "-").split("-")[0].lower()


@dataclass(frozen=True)
class Detected:
    language: str  # ISO 639-1
    confidence: float  # its probability among the languages the detector knows


def detect(text: str) -> Detected:
    language, confidence = _identifier().classify(text)
    return Detected(str(language), float(confidence))


@dataclass(frozen=True)
class LanguageCheck:
    """input.language_check flag or skip: each record's language detected; with skip, a record confidently in
    another language than ``language`` is returned untranslated. ``target``: input.target_language, a record
    already in it counts as translated (the report says how many)."""

    mode: str  # flag | skip
    language: str  # input.language
    target: str | None = None

    def elsewhere(self, detected: Detected) -> bool:
        """Whether a record is confidently in another language than the job's input."""
        return detected.confidence >= CONFIDENT and detected.language != base_code(self.language)

    def skips(self, detected: Detected) -> bool:
        return self.mode == "skip" and self.elsewhere(detected)
