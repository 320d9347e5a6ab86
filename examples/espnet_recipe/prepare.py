"""Prepare a folder of WAV files as ESPnet2's ASR trainer reads it (what asr.sh's stages 1-10 leave for stage 11).

    python prepare.py CORPUS [DATA]

CORPUS holds the WAV files (any depth; the file stem is the utterance id) and a Kaldi ``text`` file (utterance id,
then its transcript), as autotune's synthetic corpus has. DATA (default ``data``) receives ``train/`` and ``valid/``
each with ``wav.scp``, ``text``, ``speech_shape`` and ``text_shape`` (one ``utt length`` line each: samples and
characters, the shape files that espnet2/samplers/build_batch_sampler.py sorts and folds by, as collect_stats would
write them), and ``tokens.txt``, the char token list (``<blank>`` first and ``<sos/eos>`` last, as
espnet2/bin/tokenize_text.py writes it). Every 8th utterance goes to valid. Then, in this folder:

    python -m espnet2.bin.asr_train --config conf/train_asr_tiny.yaml --ngpu 0 --output_dir exp/asr \
        --train_data_path_and_name_and_type data/train/wav.scp,speech,sound \
        --train_data_path_and_name_and_type data/train/text,text,text \
        --train_shape_file data/train/speech_shape --train_shape_file data/train/text_shape \
        --valid_data_path_and_name_and_type data/valid/wav.scp,speech,sound \
        --valid_data_path_and_name_and_type data/valid/text,text,text \
        --valid_shape_file data/valid/speech_shape --valid_shape_file data/valid/text_shape
"""

from __future__ import annotations

import sys
from pathlib import Path

import soundfile as sf


def prepare(corpus: Path, data: Path) -> Path:
    """Write the train and valid folders and the token list under data; returns data."""
    texts = dict(line.split(maxsplit=1) for line in (corpus / "text").read_text().splitlines() if " " in line)
    wavs = {path.stem: path.resolve() for path in sorted(corpus.rglob("*.wav")) if path.stem in texts}
    if not wavs:
        raise SystemExit(f"{corpus}: no WAV file has a transcript in {corpus / 'text'}")
    keys = sorted(wavs)
    splits = {"train": [k for i, k in enumerate(keys) if i % 8], "valid": keys[::8]}
    for name, chosen in splits.items():
        folder = data / name
        folder.mkdir(parents=True, exist_ok=True)
        rows = {"wav.scp": [], "text": [], "speech_shape": [], "text_shape": []}
        for key in chosen:
            text = texts[key].strip()
            rows["wav.scp"].append(f"{key} {wavs[key]}")
            rows["text"].append(f"{key} {text}")
            rows["speech_shape"].append(f"{key} {sf.info(str(wavs[key])).frames}")
            rows["text_shape"].append(f"{key} {len(text.replace(' ', ''))}")
        for file, lines in rows.items():
            (folder / file).write_text("".join(line + "\n" for line in lines))
    characters = sorted({c for key in keys for c in texts[key].strip() if not c.isspace()})
    (data / "tokens.txt").write_text("\n".join(["<blank>", "<unk>", *characters, "<sos/eos>"]) + "\n")
    return data


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    prepare(Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) == 3 else "data"))
