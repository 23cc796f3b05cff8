"""Language identification candidates on the project's sentences: accuracy and records/s on one core, then the
chosen one's skip threshold (README.md has the output). Run from the repository root."""
import random, time, json, os
os.environ.setdefault("OMP_NUM_THREADS", "1")
D = "../shared/data/multi30k"
de = open(f"{D}/val.de").read().splitlines()
en = open(f"{D}/val.en").read().splitlines()
rng = random.Random(0)

def noisy(s):
    chars = list(s)
    for _ in range(max(1, len(chars) // 10)):
        i = rng.randrange(len(chars)); op = rng.random()
        if op < 0.4: chars[i] = rng.choice("abcdefghijklmnopqrstuvwxyz")
        elif op < 0.7: chars[i] = ""
        else: chars.insert(i, rng.choice(" .,!?"))
    out = "".join(chars)
    return rng.choice([out, out.upper(), "http://x.co/a1 " + out, out + " :) #photo 2024"])

sets = {
    "sentences": [(s, "de") for s in de] + [(s, "en") for s in en],
    "short (2-3 words)": [(" ".join(s.split()[:rng.choice([2, 3])]), lab) for s, lab in
                          [(s, "de") for s in de[:300]] + [(s, "en") for s in en[:300]]],
    "mixed (de + an English phrase)": [(d + " " + " ".join(e.split()[:3]), "de") for d, e in zip(de[:300], en[300:600])],
    "noisy": [(noisy(s), lab) for s, lab in [(s, "de") for s in de[:300]] + [(s, "en") for s in en[:300]]],
}

def lingua_fast():
    from lingua import LanguageDetectorBuilder
    det = LanguageDetectorBuilder.from_all_languages().with_low_accuracy_mode().build()
    return lambda t: (lambda r: r.iso_code_639_1.name.lower() if r else None)(det.detect_language_of(t))
def lingua_high():
    from lingua import LanguageDetectorBuilder
    det = LanguageDetectorBuilder.from_all_languages().build()
    return lambda t: (lambda r: r.iso_code_639_1.name.lower() if r else None)(det.detect_language_of(t))
def py3langid():
    import py3langid as langid
    return lambda t: langid.classify(t)[0]
def langdetect_():
    from langdetect import DetectorFactory, detect
    DetectorFactory.seed = 0
    def f(t):
        try: return detect(t)
        except Exception: return None
    return f

cands = {"py3langid 0.4.0": py3langid, "lingua 2.1.1 (low accuracy mode)": lingua_fast,
         "lingua 2.1.1 (high accuracy)": lingua_high, "langdetect 1.0.9": langdetect_}
rows = []
for name, make in cands.items():
    t0 = time.perf_counter(); detect = make(); detect("Ein Hund."); load = time.perf_counter() - t0
    row = {"candidate": name, "load_s": round(load, 2)}
    for set_name, items in sets.items():
        t = time.perf_counter(); got = [detect(text) for text, _ in items]; secs = time.perf_counter() - t
        row[set_name] = round(sum(g == lab for g, (_, lab) in zip(got, items)) / len(items), 4)
        if set_name == "sentences": row["records_per_s"] = round(len(items) / secs)
    rows.append(row); print(row, flush=True)
print(json.dumps(rows, indent=1))

# The chosen one's confidence (norm_probs): how sure must it be before a record is skipped?
import py3langid.langid as L
ident = L.LanguageIdentifier.from_model_file(L.MODEL_FILE, norm_probs=True)
print("\nthreshold analysis, a de job (input.language de): German records wrongly skipped / English records skipped")
for t in (0.0, 0.5, 0.8, 0.9, 0.95, 0.99):
    cells = []
    for set_name, items in sets.items():
        g = [(ident.classify(x), lab) for x, lab in items]
        de_rows = [(c, p) for (c, p), lab in g if lab == "de"]
        en_rows = [(c, p) for (c, p), lab in g if lab == "en"]
        wrong = sum(1 for c, p in de_rows if c != "de" and p >= t) / max(1, len(de_rows))
        caught = sum(1 for c, p in en_rows if c != "de" and p >= t) / max(1, len(en_rows)) if en_rows else float("nan")
        cells.append(f"{set_name}: {wrong:.3f} / {caught:.3f}")
    print(f"t={t}: " + "; ".join(cells))
