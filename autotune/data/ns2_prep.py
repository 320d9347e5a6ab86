"""NaturalSpeech2's training data prepared once per corpus: one pickle per utterance, as Amphion's recipe reads it.

Amphion's NS2Dataset (models/tts/naturalspeech2/ns2_dataset.py, read_metadata true) reads
``processed_dir/<dataset>/train.json``, a JSON list of ``{Dataset, Uid, speaker, phones, num_frames}``, and opens
``processed_dir/metadata/<Dataset>/<Uid>.pkl`` for every item, a dict of ``code`` (16, T) EnCodec indices, ``pitch``
(T,) in Hz and ``duration`` (N,) frames per phone. The recipe's data preparation is not in Amphion (Amphion issue #43);
`ensure_ns2_metadata` writes that layout once per corpus into autotune's cache (keyed by the corpus and these
settings), so that the folder is Amphion's ``processed_dir`` with the dataset ``autotune``: ``autotune/train.json``,
``autotune/test.json`` (the same rows: NS2Trainer builds a validation loader from it), ``metadata/autotune/<Uid>.pkl``
and, written last, autotune's own ``prepared.json``. The DataLoader workers then read one pickle per item:

- ``code``: 16 codebooks (EnCodec 24 kHz at 12 kbps) of random ids in [0, 1024), seeded by the utterance id, at
  75 frames per second of the utterance's audio (24 kHz, hop 320). The step's cost depends on the codes' shape only;
  running EnCodec would need its downloaded weights.
- ``pitch``: F0 per codec frame, the cepstral estimator of `autotune.data.tts.TtsFeaturizer` on 24 kHz STFT frames of
  hop 320 (unvoiced frames interpolated), floored at 50 Hz, the recipe's lowest pitch bin (its loss takes the log).
- phones: CMUdict symbols from the transcript. A synthetic transcript is one vowel per syllable: each becomes a
  consonant-vowel pair (the vowel stressed), between ``sil`` at both ends as MFA alignments have them; a transcript
  with ``{ARPAbet}`` spans uses their phones. Ids are Amphion's phone map (``get_phone_map``: CMUdict's 84 symbols,
  sp, spn, sil, <s>, </s>). Utterances with fewer than 3 phones are left out (the prompt cut needs a phone to spare).
- ``duration``: the frames spread evenly over the phones (`autotune.data.tts.even_durations`), a stand-in for MFA.
"""

from __future__ import annotations

import json
import pickle
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchaudio.functional as AF

from autotune.data.audio import read_segment
from autotune.data.offline import Preparation, cache_root, complete_check, corpus_key, map_utterances, prepare_once
from autotune.data.sources import Utterance
from autotune.data.tts import MelConfig, TtsFeaturizer, even_durations
from autotune.errors import DataError

__all__ = [
    "CODEC_FRAMES_PER_S",
    "MIN_PHONES",
    "NS2_PHONES",
    "Ns2Metadata",
    "codec_frames",
    "ensure_ns2_metadata",
    "transcript_phones",
]

PREP_VERSION = 2  # bump when the prepared items or their layout change for the same inputs
WHAT = "codec codes, pitch and durations, one pickle per utterance (Amphion NaturalSpeech2 metadata)"
MANIFEST = "prepared.json"  # autotune's; train.json must stay the bare list NS2Dataset iterates
DATASET = "autotune"  # train.json's Dataset, the config's `dataset`
CODEC_RATE = 24_000  # EnCodec 24 kHz
CODEC_HOP = 320
CODEC_FRAMES_PER_S = CODEC_RATE / CODEC_HOP  # 75
CODE_LEVELS = 16  # 12 kbps
CODEBOOK_SIZE = 1024
MIN_PITCH_HZ = 50.0  # config/ns2.json pitch_min, and NS2Collator's pad value
MIN_PHONES = 3
_VOWELS = ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW")
_CONSONANTS = "B CH D DH F G HH JH K L M N NG P R S SH T TH V W Y Z ZH".split()
# text/cmudict.py valid_symbols (sorted, as there), then ns2_dataset.py get_phone_map's additions.
NS2_PHONES = (
    *sorted([v + stress for v in _VOWELS for stress in ("", "0", "1", "2")] + _CONSONANTS),
    "sp",
    "spn",
    "sil",
    "<s>",
    "</s>",
)
_PHONE_ID = {phone: index for index, phone in enumerate(NS2_PHONES)}
_SYLLABLE = {"a": ("M", "AA1"), "e": ("D", "EH1"), "i": ("N", "IY1"), "o": ("L", "OW1"), "u": ("T", "UW1")}
_BRACES = re.compile(r"\{([^}]*)\}")


def transcript_phones(text: str) -> list[str]:
    """CMUdict phones of a transcript: its ``{ARPAbet}`` spans, else a consonant-vowel pair per vowel letter; with
    ``sil`` at both ends."""
    spans = _BRACES.findall(text)
    if spans:
        phones = [phone for span in spans for phone in span.split() if phone in _PHONE_ID]
    else:
        phones = [phone for letter in text.lower() for phone in _SYLLABLE.get(letter, ())]
    return ["sil", *phones, "sil"] if phones else []


def codec_frames(utt: Utterance) -> int:
    """EnCodec frames of the utterance's audio: 75 per second."""
    return max(1, round(utt.duration_s * CODEC_FRAMES_PER_S))


@dataclass(frozen=True, kw_only=True, slots=True)
class Ns2Metadata:
    """A prepared corpus: the folder (Amphion's processed_dir), and per utterance its id, phones and frames."""

    root: Path
    utt_ids: tuple[str, ...]
    phones: tuple[tuple[int, ...], ...]
    num_frames: tuple[int, ...]

    def path(self, index: int) -> Path:
        return _pickle_path(self.root, self.utt_ids[index])

    @classmethod
    def load(cls, root: Path) -> Ns2Metadata:
        rows = json.loads((root / DATASET / "train.json").read_text())
        return cls(
            root=root,
            utt_ids=tuple(row["Uid"] for row in rows),
            phones=tuple(tuple(_PHONE_ID[p] for p in row["phones"].split()) for row in rows),
            num_frames=tuple(row["num_frames"] for row in rows),
        )


def usable_for_ns2(utterances: Sequence[Utterance]) -> tuple[Utterance, ...]:
    """The utterances with at least MIN_PHONES phones (the prompt cut asserts one phone is left for the target)."""
    return tuple(utt for utt in utterances if len(transcript_phones(utt.text or "")) >= MIN_PHONES)


_is_complete = complete_check(MANIFEST, PREP_VERSION)


def ensure_ns2_metadata(
    utterances: Sequence[Utterance], *, cache_dir: str | Path | None = None
) -> tuple[Ns2Metadata, Preparation]:
    """The corpus's per-utterance pickles from the cache, written once when missing.

    Args:
        utterances: the utterances to train on (`usable_for_ns2`).
        cache_dir: cache root; default `autotune.data.offline.cache_root`.

    Raises:
        DataError: an audio file cannot be read, or the cache cannot be written.
    """
    settings = {"version": PREP_VERSION, "rate": CODEC_RATE, "hop": CODEC_HOP, "levels": CODE_LEVELS}
    root = cache_root(cache_dir) / f"ns2-metadata-{corpus_key('ns2-metadata', settings, utterances, with_text=True)}"
    reused, seconds = prepare_once(root, lambda folder: _prepare(folder, utterances), _is_complete)
    metadata = Ns2Metadata.load(root)
    if metadata.utt_ids != tuple(utt.utt_id for utt in utterances):  # a key collision, or a folder edited by hand
        raise DataError(f"the prepared NaturalSpeech2 data in {root} does not match the data; delete it and rerun")
    return metadata, Preparation(what=WHAT, path=str(root), items=len(utterances), seconds=seconds, reused=reused)


def _pickle_path(root: Path, utt_id: str) -> Path:
    """Where NS2Dataset opens an utterance's pickle: processed_dir/metadata/<Dataset>/<Uid>.pkl."""
    return root / "metadata" / DATASET / f"{utt_id}.pkl"


def _prepare(folder: Path, utterances: Sequence[Utterance]) -> None:
    pitch_of = _PitchTrack()

    def item(utt: Utterance) -> dict[str, np.ndarray]:
        frames = codec_frames(utt)
        phones = transcript_phones(utt.text or "")
        codes = np.random.default_rng(zlib.crc32(utt.utt_id.encode())).integers(0, CODEBOOK_SIZE, (CODE_LEVELS, frames))
        return {
            "code": codes.astype(np.int64),
            "pitch": pitch_of(*read_segment(utt), frames),
            "duration": even_durations(frames, len(phones)).numpy(),
        }

    paths = [_pickle_path(folder, utt.utt_id) for utt in utterances]
    for utt, path in zip(utterances, paths, strict=True):
        if not path.resolve().is_relative_to((folder / "metadata" / DATASET).resolve()):
            raise DataError(f"utterance ID {utt.utt_id!r} cannot name a file; use IDs without '..' or a leading '/'")
    rows: list[dict[str, object]] = []
    for utt, path, data in zip(utterances, paths, map_utterances(item, utterances, "NS2 data"), strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)  # an ID with '/' is a subfolder, as Amphion's join makes it
        with open(path, "wb") as file:
            pickle.dump(data, file)
        phones = " ".join(transcript_phones(utt.text or ""))
        frames = int(data["code"].shape[1])
        rows.append(
            {"Dataset": DATASET, "Uid": utt.utt_id, "speaker": utt.speaker, "phones": phones, "num_frames": frames}
        )
    (folder / DATASET).mkdir()
    for split in ("train.json", "test.json"):
        (folder / DATASET / split).write_text(json.dumps(rows))
    (folder / MANIFEST).write_text(json.dumps({"version": PREP_VERSION, "utterances": len(rows)}))  # last: complete


class _PitchTrack:
    """Per-codec-frame F0 (Hz) of a waveform, floored at MIN_PITCH_HZ, exactly `frames` long."""

    def __init__(self) -> None:
        self.config = MelConfig(sample_rate=CODEC_RATE, n_fft=1024, hop_length=CODEC_HOP)
        self.featurizer = TtsFeaturizer(self.config)
        self.window = torch.hann_window(self.config.n_fft)

    def __call__(self, waveform: torch.Tensor, rate: int, frames: int) -> np.ndarray:
        if rate != CODEC_RATE:
            waveform = AF.resample(waveform, rate, CODEC_RATE)
        spectrum = torch.stft(
            waveform, self.config.n_fft, CODEC_HOP, window=self.window, center=True, return_complex=True
        ).T
        f0 = self.featurizer.pitch(spectrum.abs()).clamp_min(MIN_PITCH_HZ)[:frames]
        f0 = torch.nn.functional.pad(f0, (0, frames - len(f0)), value=float(f0[-1]) if len(f0) else MIN_PITCH_HZ)
        return f0.numpy().astype(np.float32)
