"""A corpus of real speech for the benchmarks, spoken here by espeak-ng: no download, and every file is words.

The embedded corpus (autotune/data/synth.py) is speech-like: it costs what audio costs to decode, crop and featurise,
but it is not speech. This one is: espeak-ng (Debian's `espeak-ng`) reads sentences drawn from a fixed word list, each
speaker a voice of its own (a language, a voice variant, a pitch and a rate), resampled from espeak-ng's 22.05 kHz to
16 kHz (soxr, as autotune resamples) and written as 16-bit PCM WAV, the files VoxCeleb's and CN-Celeb's recipes
read. Its layout is 3D-Speaker's (`SPEAKER/UTT.wav` under the folder, and `train.csv` with its columns
ID,dur,path,start,stop,spk), so `autotune run --model cam++ --data FOLDER/train.csv` trains on it as a user's
3D-Speaker data; `manifest.json` records the voices and the generator's settings. The same arguments give the same
sentences and voices (a seeded generator); espeak-ng's own version is recorded, its output may differ between versions.

    .venv/bin/python benchmarks/speech_corpus.py /tmp/speech --speakers 40 --utterances 25
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

SAMPLE_RATE = 16_000
# Languages whose voices espeak-ng ships in Debian's package, each read with the same English words: the phones
# differ by language, which is what makes the speakers differ beyond pitch and rate.
LANGUAGES = ("en", "en-us", "en-gb-scotland", "de", "nl", "sv", "it", "es", "pl", "cs")
VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5")
WORDS = (
    "the a of to and in that is was he for it with as his on be at by had not are but from or have an they which one "
    "you were her all she there would their we him been has when who will more no if out so said what up its about "
    "into than them can only other new some could time these two may then do first any my now such like our over man "
    "me even most made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us great old year off come since "
    "against go came right used take three voice river morning window garden letter station number paper question "
    "market evening summer winter doctor teacher train bridge mountain silver yellow quiet heavy simple careful"
).split()


def espeak_version() -> str | None:
    """espeak-ng's version line, or None where it is not installed."""
    if shutil.which("espeak-ng") is None:
        return None
    done = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def voices(count: int, rng: np.random.Generator) -> list[dict[str, object]]:
    """count distinct speakers: every (language, variant) pair once, in a shuffled order, each with its own pitch
    (espeak-ng's -p, 0-99) and rate (-s, words per minute)."""
    pairs = list(itertools.product(LANGUAGES, VARIANTS))
    order = rng.permutation(len(pairs))[:count]
    return [
        {
            "voice": f"{pairs[i][0]}+{pairs[i][1]}",
            "pitch": int(rng.integers(25, 75)),
            "rate": int(rng.integers(140, 190)),
        }
        for i in order
    ]


def sentence(rng: np.random.Generator, seconds: float, rate_wpm: int) -> str:
    """Words for about `seconds` of speech at `rate_wpm` words per minute."""
    n_words = max(3, round(seconds * rate_wpm / 60))
    return " ".join(str(word) for word in rng.choice(WORDS, size=n_words))


def speak(text: str, speaker: dict[str, object], wav22k: Path) -> np.ndarray:
    subprocess.run(
        ["espeak-ng", "-v", str(speaker["voice"]), "-p", str(speaker["pitch"]), "-s", str(speaker["rate"]),
         "-w", str(wav22k), text],
        check=True, capture_output=True,
    )  # fmt: skip
    audio, rate = sf.read(wav22k, dtype="float32")
    return soxr.resample(audio, rate, SAMPLE_RATE) if rate != SAMPLE_RATE else audio


def generate(folder: Path, speakers: int, utterances: int, min_s: float, max_s: float, seed: int) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    people = voices(speakers, rng)
    rows, total_s = [], 0.0
    with tempfile.TemporaryDirectory() as scratch:
        wav22k = Path(scratch) / "out.wav"
        for s, speaker in enumerate(people):
            spk = f"spk{s:03d}"
            (folder / spk).mkdir(parents=True, exist_ok=True)
            for u in range(utterances):
                text = sentence(rng, float(rng.uniform(min_s, max_s)), int(str(speaker["rate"])))
                audio = speak(text, speaker, wav22k)
                path = folder / spk / f"utt{u:03d}.wav"
                sf.write(path, audio, SAMPLE_RATE, subtype="PCM_16")
                duration = len(audio) / SAMPLE_RATE
                total_s += duration
                rows.append(f"{spk}-utt{u:03d},{duration:.3f},{path.resolve()},0,{duration:.3f},{spk}")
    (folder / "train.csv").write_text("\n".join(["ID,dur,path,start,stop,spk", *rows]) + "\n", encoding="utf-8")
    manifest = {
        "generator": "benchmarks/speech_corpus.py",
        "espeak_ng": espeak_version(),
        "seed": seed,
        "sample_rate": SAMPLE_RATE,
        "files": len(rows),
        "hours": round(total_s / 3600, 3),
        "speakers": {f"spk{s:03d}": speaker for s, speaker in enumerate(people)},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where to write it (must be empty or not exist)")
    parser.add_argument("--speakers", type=int, default=40)
    parser.add_argument("--utterances", type=int, default=25, help="per speaker")
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--max-seconds", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if espeak_version() is None:
        print("error: espeak-ng is not installed: apt-get install espeak-ng", file=sys.stderr)
        raise SystemExit(2)
    if args.folder.exists() and any(args.folder.iterdir()):
        print(f"error: {args.folder} is not empty: give a new folder", file=sys.stderr)
        raise SystemExit(2)
    if not 0 < args.speakers <= len(LANGUAGES) * len(VARIANTS) or args.utterances < 1:
        print(
            f"error: --speakers must be 1-{len(LANGUAGES) * len(VARIANTS)} ({len(LANGUAGES)} languages x "
            f"{len(VARIANTS)} voice variants) and --utterances at least 1",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if not 0 < args.min_seconds <= args.max_seconds:
        print("error: --min-seconds must be above 0 and at most --max-seconds", file=sys.stderr)
        raise SystemExit(2)
    manifest = generate(args.folder, args.speakers, args.utterances, args.min_seconds, args.max_seconds, args.seed)
    print(f"{manifest['files']} files, {manifest['hours']} h, {args.speakers} speakers in {args.folder}")


if __name__ == "__main__":
    main()
