"""Quality against references: per-row sufficient statistics, summed once, scored once.

As sacrebleu does for significance tests: each row yields its BLEU/chrF statistics (n-gram
matches and totals); the corpus score is computed once from their sums, so it equals sacrebleu's
corpus score on the same texts, wherever and in how many pieces the rows were processed.
ROUGE (rouge-score, with stemming) is a per-row F-measure; the corpus value is its mean.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

TRANSLATION_METRICS = ("bleu", "chrf")
SUMMARIZATION_METRICS = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def _bleu() -> BLEU:
    return BLEU()  # sacrebleu defaults: 13a tokenisation, exp smoothing, mixed case


def _chrf() -> CHRF:
    return CHRF()


def stat_columns(task: str) -> dict[str, int]:
    """Name -> width of the per-row statistics for a task."""
    if task == "translation":
        return {"bleu": 2 + 2 * _bleu().max_ngram_order, "chrf": 3 * (_chrf().char_order + _chrf().word_order)}
    return {name: 1 for name in SUMMARIZATION_METRICS}


def stats_matrix(task: str, stats: dict[str, np.ndarray]) -> np.ndarray:
    """row_statistics' result as one [rows, width] matrix, metrics in stat_columns order (the
    `quality_stats` column's layout)."""
    return np.concatenate([stats[name] for name in stat_columns(task)], axis=1)


def stats_by_metric(task: str, matrix: np.ndarray) -> dict[str, np.ndarray]:
    """stats_matrix undone: the columns of `matrix` ([..., width]) split by metric."""
    bounds = np.cumsum([0, *stat_columns(task).values()])
    return {name: matrix[..., start:end] for name, start, end in zip(stat_columns(task), bounds[:-1], bounds[1:])}


def row_statistics(task: str, predictions: Sequence[str], references: Sequence[str]) -> dict[str, np.ndarray]:
    """Per-row sufficient statistics: name -> array [rows, width]."""
    if task == "translation":
        return {
            "bleu": np.asarray(_bleu()._extract_corpus_statistics(list(predictions), [list(references)]), float),
            "chrf": np.asarray(_chrf()._extract_corpus_statistics(list(predictions), [list(references)]), float),
        }
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(SUMMARIZATION_METRICS), use_stemmer=True)
    rows = [scorer.score(_sentence_lines(ref), _sentence_lines(pred)) for pred, ref in zip(predictions, references)]
    return {name: np.asarray([[100.0 * row[name].fmeasure] for row in rows]) for name in SUMMARIZATION_METRICS}


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _sentence_lines(text: str) -> str:
    """One sentence per line, which ROUGE-Lsum needs (as the BiLD paper's CNN/DM scores use)."""
    return "\n".join(s for s in _SENTENCE_END.split(text.strip()) if s)


def corpus_scores(task: str, sums: dict[str, np.ndarray], rows: int) -> dict[str, float]:
    """Scores from summed statistics. For ROUGE, sums hold summed F-measures over `rows` rows."""
    if rows == 0:
        return {}
    if task == "translation":
        return {
            "bleu": float(_bleu()._compute_score_from_stats(sums["bleu"].tolist()).score),
            "chrf": float(_chrf()._compute_score_from_stats(sums["chrf"].tolist()).score),
        }
    return {name: float(sums[name][0] / rows) for name in SUMMARIZATION_METRICS}


@dataclass(frozen=True)
class TranslationScores:
    """Corpus BLEU and chrF of a list of texts, with the sacrebleu signatures that say how."""

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str


def translation_scores(hypotheses: Sequence[str], references: Sequence[str]) -> TranslationScores:
    """BLEU and chrF of detokenized hypotheses, one reference each (sacrebleu's corpus scores)."""
    if not hypotheses:
        raise ValueError("no hypotheses to score")
    statistics = row_statistics("translation", hypotheses, references)
    scores = corpus_scores("translation", {name: rows.sum(0) for name, rows in statistics.items()}, len(hypotheses))
    found = signatures("translation")
    return TranslationScores(scores["bleu"], scores["chrf"], found["bleu"], found["chrf"])


def signatures(task: str) -> dict[str, str]:
    """The metric settings, recorded beside the scores as sacrebleu recommends."""
    if task == "translation":
        found = {}
        for name, metric in (("bleu", _bleu()), ("chrf", _chrf())):
            metric.num_refs = 1  # one reference per row, as scored here (sacrebleu sets it on first use)
            found[name] = str(metric.get_signature())
        return found
    return {name: "rouge-score|stemmer:yes|fmeasure|mean-over-rows|lsum:regex-sentence-split"
            for name in SUMMARIZATION_METRICS}


def bootstrap(rows: int, statistic: Callable[[np.ndarray], dict[str, float]], resamples: int = 1000,
              seed: int = 0) -> dict[str, dict[str, float]]:
    """Bootstrap resampling over rows: ``statistic(picks)`` gives name -> value for the rows at the
    indices ``picks`` (with repeats), evaluated on all rows as they are and on ``resamples`` resamples
    of ``rows`` rows each. Paired where ``statistic`` reads both systems' rows at the same indices.
    -> name: {value (all rows), low, high (the resamples' 2.5th and 97.5th percentiles: a 95% interval)}."""
    if rows == 0:
        return {}
    picks = np.random.default_rng(seed).integers(0, rows, size=(resamples, rows))
    observed = statistic(np.arange(rows))
    samples: dict[str, list[float]] = {name: [] for name in observed}
    for pick in picks:
        for name, value in statistic(pick).items():
            samples[name].append(value)
    return {name: {"value": observed[name], "low": float(np.percentile(samples[name], 2.5)),
                   "high": float(np.percentile(samples[name], 97.5))} for name in observed}


def paired_bootstrap(task: str, mine: dict[str, np.ndarray], theirs: dict[str, np.ndarray], resamples: int = 1000,
                     seed: int = 0) -> dict[str, dict[str, float]]:
    """Paired bootstrap resampling over rows (Koehn 2004; sacrebleu's ``paired-bs``): both systems'
    per-row statistics [rows, width] are resampled with the same row indices, and each corpus score
    is recomputed from the resampled sums. -> metric: {delta, low, high} (mine - theirs, 95% interval)."""
    rows = len(next(iter(mine.values())))

    def difference(pick: np.ndarray) -> dict[str, float]:
        ours = corpus_scores(task, {k: v[pick].sum(0) for k, v in mine.items()}, rows)
        base = corpus_scores(task, {k: v[pick].sum(0) for k, v in theirs.items()}, rows)
        return {name: ours[name] - base[name] for name in ours}

    return {name: {"delta": found["value"], "low": found["low"], "high": found["high"]}
            for name, found in bootstrap(rows, difference, resamples, seed).items()}
