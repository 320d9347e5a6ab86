"""Prepare a folder of WAV files as WeNet's aishell recipe leaves it for training (what run.sh's stages 0-3 write).

    python prepare.py CORPUS [DATA]

CORPUS holds the WAV files and a WeNet raw ``data.list`` (JSON lines with key, wav and txt; the wav path relative to
CORPUS or absolute), as autotune's synthetic corpus has. DATA (default ``data``) receives ``train/data.list`` and
``dev/data.list`` (every 8th utterance goes to dev; the wav paths absolute), ``dict/lang_char.txt`` (the char table
run.sh's stage 2 writes: ``<blank> 0``, ``<unk> 1``, ``<sos/eos> 2``, then each character) and
``train/global_cmvn`` (the JSON statistics of tools/compute_cmvn_stats.py: 80-bin fbank, no dither, over the training
list). Then, from the folder holding ``conf/`` and ``data/``, with the WeNet checkout on PYTHONPATH and its ``wenet``
folder reachable as ``wenet/`` (aishell's s0 has a link to it):

    torchrun --standalone --nproc_per_node=1 wenet/bin/train.py --device cpu --ddp.dist_backend gloo \
        --config conf/train_conformer_tiny.yaml --data_type raw --train_data data/train/data.list \
        --cv_data data/dev/data.list --model_dir exp/conformer --num_workers 1 --prefetch 2
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import soundfile as sf

from autotune.data.cmvn import compute_cmvn_stats
from autotune.data.features import FbankConfig
from autotune.data.sources import Utterance

SPECIAL_TOKENS = ("<blank>", "<unk>", "<sos/eos>")


def prepare(corpus: Path, data: Path) -> Path:
    """Write the train and dev lists, the char table and the training list's CMVN statistics under data."""
    rows = [json.loads(line) for line in (corpus / "data.list").read_text(encoding="utf-8").splitlines() if line]
    if not rows:
        raise SystemExit(f"{corpus / 'data.list'}: no utterance")
    for row in rows:
        row["wav"] = str((corpus / row["wav"]).resolve())
    splits = {"train": [r for i, r in enumerate(rows) if i % 8], "dev": rows[::8]}
    for name, chosen in splits.items():
        folder = data / name
        folder.mkdir(parents=True, exist_ok=True)
        lines = (json.dumps({k: r[k] for k in ("key", "wav", "txt")}, ensure_ascii=False) for r in chosen)
        (folder / "data.list").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    characters = sorted({c for r in rows for c in r["txt"] if not c.isspace()})
    table = [*SPECIAL_TOKENS, *characters]
    (data / "dict").mkdir(parents=True, exist_ok=True)
    (data / "dict" / "lang_char.txt").write_text("".join(f"{t} {i}\n" for i, t in enumerate(table)), encoding="utf-8")
    utterances = [_utterance(row) for row in splits["train"]]
    stats = compute_cmvn_stats(utterances, FbankConfig(num_mel_bins=80))
    (data / "train" / "global_cmvn").write_text(stats.to_json(), encoding="utf-8")
    return data


def _utterance(row: dict[str, str]) -> Utterance:
    info = sf.info(row["wav"])
    return Utterance(
        utt_id=row["key"],
        path=row["wav"],
        speaker="",
        duration_s=info.frames / info.samplerate,
        sample_rate=info.samplerate,
        text=row["txt"],
    )


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    prepare(Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) == 3 else "data"))
