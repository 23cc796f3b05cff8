"""metrics.quality.translation_scores: the one place a benchmark or evaluation gets BLEU and chrF."""

from __future__ import annotations

import pytest
import sacrebleu

from pipeline.metrics.quality import translation_scores

HYPOTHESES = ["A dog runs over the meadow.", "Two men play football.", "A woman reads a red book."]
REFERENCES = ["A dog runs across the meadow.", "Two men are playing soccer in the park.", "A woman reads a book."]


def test_translation_scores_are_sacrebleus_corpus_scores_with_signatures():
    scores = translation_scores(HYPOTHESES, REFERENCES)
    assert scores.bleu == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score)
    assert scores.chrf == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score)
    assert 0 < scores.bleu < 100
    assert scores.bleu_signature.startswith("nrefs:1|") and f"version:{sacrebleu.__version__}" in scores.bleu_signature
    assert "nrefs:1|" in scores.chrf_signature


def test_nothing_to_score_is_an_error():
    with pytest.raises(ValueError, match="no hypotheses"):
        translation_scores([], [])
