"""The sentence splitters measured for input.segment: sentence (docs/segments.md): accuracy and speed.

    pip install pysbd sentencex blingfire syntok   # into a scratch environment; only sentencex is a dependency
    python scripts/measure_splitters.py [--data ../shared/data/multi30k]

Accuracy: 30 two-sentence cases written for it (10 each in English, German and French: abbreviations,
ordinals, dates, decimals, quotes, ellipses), each joined with a space; a case counts when the splitter gives
back exactly its two sentences. Speed: the first 5,000 German sentences of Multi30k train joined five to a
paragraph (blank lines between paragraphs), split whole with the German rules.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

CASES = {
 "en": [
  ["Dr. Smith arrived at 5 p.m. on Monday.", "He left at 6."],
  ["The U.S. economy grew by 3.5% in 2023.", "Prices rose, e.g. for food."],
  ["She said \"Stop!\" and walked away.", "Nobody followed."],
  ["\"Is it raining?\" he asked.", "It was."],
  ["Mr. and Mrs. Jones live at No. 5 Main St. in London.", "They moved in 2010."],
  ["It costs $4.99.", "That's cheap."],
  ["Version 2.0 was released on Jan. 3, 2021.", "It fixed 12 bugs."],
  ["Wait...", "what happened?"],
  ["A man in a blue shirt is standing on a ladder.", "Two dogs play in the snow."],
  ["See Fig. 3 for details.", "The results (cf. Table 2) agree."],
 ],
 "de": [
  ["Das ist z.B. ein Test.", "Er kam um 17 Uhr."],
  ["Am 3. Oktober 1990 wurde Deutschland wiedervereinigt.", "Das war ein Mittwoch."],
  ["Dr. Müller wohnt in der Goethestr. 12 in Berlin.", "Sie ist Ärztin."],
  ["Der Preis beträgt 4,99 Euro, d.h. etwa 5 Euro.", "Das ist günstig."],
  ["Er sagte: „Komm her!“ und ging.", "Niemand folgte ihm."],
  ["Das Buch hat ca. 300 Seiten usw.", "Ich lese es bald."],
  ["Im 19. Jh. entstand die Stadt.", "Heute leben dort 10.000 Menschen."],
  ["Ein Mann mit einem orangefarbenen Hut starrt auf etwas.", "Ein Hund rennt durch den Schnee."],
  ["Siehe Abb. 2 und Nr. 7.", "Beide sind wichtig."],
  ["Warum nicht?", "Weil es regnet!"],
 ],
 "fr": [
  ["M. Dupont est arrivé à 17 h.", "Il est reparti à 18 h."],
  ["Le prix est de 4,99 €, c.-à-d. environ 5 €.", "C'est bon marché."],
  ["Il a dit : « Viens ici ! » et il est parti.", "Personne ne l'a suivi."],
  ["Mme Martin habite au 12, av. Victor Hugo.", "Elle est médecin."],
  ["Le 14 juillet 1789, la Bastille est prise.", "C'est le début de la Révolution."],
  ["Voir p. 12 et fig. 3.", "Les deux sont utiles."],
  ["Pourquoi pas ?", "Parce qu'il pleut !"],
  ["Un homme en chemise bleue est debout sur une échelle.", "Deux chiens jouent dans la neige."],
  ["La version 2.0 est sortie en 2021, etc.", "Elle corrige 12 bogues."],
  ["Le Dr Petit et M. Leroy sont là.", "Ils attendent."],
 ],
}


def _pysbd(lang):
    import pysbd

    segmenter = pysbd.Segmenter(language=lang, clean=False, char_span=False)
    return segmenter.segment


def _sentencex(lang):
    import sentencex

    return lambda text: list(sentencex.segment(lang, text))


def _blingfire(lang):
    import blingfire

    return lambda text: blingfire.text_to_sentences(text).split("\n")


def _syntok(lang):
    from syntok import segmenter

    return lambda text: ["".join(token.spacing + token.value for token in sentence)
                         for paragraph in segmenter.analyze(text) for sentence in paragraph]


SPLITTERS = {"pysbd": _pysbd, "sentencex": _sentencex, "blingfire": _blingfire, "syntok": _syntok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"))
    args = parser.parse_args()
    lines = (Path(args.data) / "train.de").read_text(encoding="utf-8").splitlines()[:5000]
    text = "\n\n".join(" ".join(lines[i : i + 5]) for i in range(0, len(lines), 5))
    for name, make in SPLITTERS.items():
        try:
            split = make("de")
        except ImportError:
            print(f"{name:10s} not installed")
            continue
        wrong = []
        for lang, cases in CASES.items():
            split_lang = make(lang)
            wrong += [(lang, got) for gold in cases
                      if (got := [part.strip() for part in split_lang(" ".join(gold)) if part.strip()]) != gold]
        split("Warm up.")
        started = time.perf_counter()
        count = len([part for part in split(text) if part.strip()])
        seconds = time.perf_counter() - started
        total = sum(len(cases) for cases in CASES.values())
        print(f"{name:10s} exact {total - len(wrong)}/{total}  {len(text) / seconds / 1e6:6.2f} MB/s "
              f"({count} sentences of 5000 in {seconds * 1000:.0f} ms)")
        for lang, got in wrong:
            print(f"    {lang}: {got}")


if __name__ == "__main__":
    main()
