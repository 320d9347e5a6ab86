"""GPT-SoVITS s2's experiment folder: the 32 kHz audio, cnhubert features and phones its training reads.

The recipe (RVC-Boss/GPT-SoVITS 48b1a01) trains s2 from the folder its webui prepares once: ``2-name2text.txt`` (name,
phones, word2ph, text per line), ``5-wav32k/<name>`` and ``4-cnhubert/<name>.pt``, both written by
prepare_datasets/2-get-hubert-wav32k.py. Its name2go decodes each file at 32 kHz, drops one whose peak is over 2.2,
scales it to ``x / peak * 0.95 * 0.5 * 32768 + 0.5 * 32768 * x`` and writes it as 16-bit PCM;
the cnhubert features of its 16 kHz resampling are a (1, 768, frames) tensor, float16 when the preparation runs half
precision (the default on a GPU), at 50 per second: (samples at 16 kHz - 400) // 320 + 1 frames, the receptive field
and stride of cnhubert's convolutions: as many as the 32 kHz spectrogram has, or one fewer for a quarter of the
lengths (the dataset pads that frame back: data_utils.py get_audio_text_speaker_pair).

`ensure_s2_data` writes the same three once per corpus into autotune's cache: the audio is the corpus's own,
resampled and scaled as the script does, and the features are random float16 values seeded by the utterance id (a
step's cost depends on their shape; the real ones need the cnhubert weights). The phones are the transcript's
(`transcript_phones`), as the s1 folder has them (`autotune.data.gpt_sovits`); a silent utterance, whose scaling
divides by a zero peak, is left out. `S2Corpus` lists the items as ``TextAudioSpeakerLoader`` finds them: the names in
all three (data_utils.py, TextAudioSpeakerLoader.__init__).
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio.functional as AF

from autotune.data.audio import read_segment
from autotune.data.ns2_prep import NS2_PHONES, transcript_phones
from autotune.data.offline import Preparation, cache_root, complete_check, corpus_key, map_utterances, prepare_once
from autotune.data.sources import Utterance
from autotune.errors import DataError

__all__ = [
    "HUBERT_DIR",
    "NAME2TEXT",
    "SAMPLE_RATE",
    "SSL_DIM",
    "S2Corpus",
    "WAV_DIR",
    "WAV_HEADER_BYTES",
    "ensure_s2_data",
    "hubert_frames",
]

PREP_VERSION = 1  # bump when the prepared items change for the same inputs
WHAT = "32 kHz audio, cnhubert features (one .pt per item) and phones (GPT-SoVITS s2 experiment folder)"
SAMPLE_RATE = 32_000  # s2.json data.sampling_rate; the folder's name
SSL_DIM = 768
HUBERT_RATE, HUBERT_HOP, HUBERT_FIELD = 16_000, 320, 400
MAX_PEAK = 2.2  # name2go's filter: a file with a higher peak is left out
PEAK_SCALE, ALPHA = 0.95, 0.5  # maxx, alpha
WAV_HEADER_BYTES = 44  # the canonical 16-bit PCM WAV header scipy's wavfile.write and soundfile write
NAME2TEXT, HUBERT_DIR, WAV_DIR = "2-name2text.txt", "4-cnhubert", "5-wav32k"
_PHONE_ID = {phone: index for index, phone in enumerate(NS2_PHONES)}


def hubert_frames(samples_32k: int) -> int:
    """cnhubert frames of audio of ``samples_32k`` samples at 32 kHz, resampled to 16 kHz."""
    samples = math.ceil(samples_32k * HUBERT_RATE / SAMPLE_RATE)
    return (samples - HUBERT_FIELD) // HUBERT_HOP + 1 if samples >= HUBERT_FIELD else 0


@dataclass(frozen=True, kw_only=True, slots=True)
class S2Corpus:
    """A prepared experiment folder: the item names found in all three parts, sorted, and their phone ids."""

    root: Path
    names: tuple[str, ...]
    phones: tuple[tuple[int, ...], ...]

    def wav_path(self, name: str) -> str:
        return str(self.root / WAV_DIR / name)

    def hubert_path(self, name: str) -> str:
        return str(self.root / HUBERT_DIR / f"{name}.pt")

    @classmethod
    def load(cls, root: Path) -> S2Corpus:
        """The items ``TextAudioSpeakerLoader`` finds in its __init__: lines of four tab-separated fields, whose
        name has both a feature file and an audio file."""
        phones: dict[str, tuple[int, ...]] = {}
        for line in (root / NAME2TEXT).read_text(encoding="utf-8").strip("\n").split("\n"):
            fields = line.split("\t")
            if len(fields) == 4:
                phones[fields[0]] = tuple(_PHONE_ID[phone] for phone in fields[1].split(" "))
        features = {name[: -len(".pt")] for name in os.listdir(root / HUBERT_DIR)}
        names = sorted(set(phones) & features & set(os.listdir(root / WAV_DIR)))
        return cls(root=root, names=tuple(names), phones=tuple(phones[name] for name in names))


_is_complete = complete_check("done.json", PREP_VERSION)


def ensure_s2_data(
    utterances: Sequence[Utterance], *, cache_dir: str | Path | None = None
) -> tuple[S2Corpus, Preparation]:
    """The corpus's s2 experiment folder from the cache, written once when missing.

    Raises:
        DataError: no utterance has phones, an audio file cannot be read, or the cache cannot be written.
    """
    usable = [utt for utt in utterances if transcript_phones(utt.text or "")]
    if not usable:
        raise DataError(f"none of the {len(utterances)} transcripts has a vowel letter or {{ARPAbet}} phones")
    settings = {"version": PREP_VERSION, "rate": SAMPLE_RATE, "ssl": SSL_DIM}
    root = cache_root(cache_dir) / f"gpt-sovits-s2-{corpus_key('gpt-sovits-s2', settings, usable, with_text=True)}"
    reused, seconds = prepare_once(root, lambda folder: _prepare(folder, usable), _is_complete)
    corpus = S2Corpus.load(root)
    if not corpus.names:
        raise DataError(f"none of the {len(usable)} utterances with phones has audio GPT-SoVITS keeps (all silent)")
    return corpus, Preparation(what=WHAT, path=str(root), items=len(corpus.names), seconds=seconds, reused=reused)


def _prepare(folder: Path, utterances: Sequence[Utterance]) -> None:
    (folder / WAV_DIR).mkdir()
    (folder / HUBERT_DIR).mkdir()
    index_of = {utt.utt_id: index for index, utt in enumerate(utterances)}
    written = map_utterances(lambda utt: _write_item(folder, index_of[utt.utt_id], utt), utterances, WHAT)
    lines = [line for line in written if line is not None]
    (folder / NAME2TEXT).write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "done.json").write_text(json.dumps({"version": PREP_VERSION}))  # last: complete


def _write_item(folder: Path, index: int, utt: Utterance) -> str | None:
    """One item's audio and features; its 2-name2text.txt line, or None when the script would leave it out."""
    name, phones = f"{index:07d}.wav", transcript_phones(utt.text or "")  # the recipe names items by their audio
    wave, rate = read_segment(utt)
    audio = AF.resample(wave, rate, SAMPLE_RATE).numpy() if rate != SAMPLE_RATE else wave.numpy()
    peak = float(np.abs(audio).max()) if audio.size else 0.0
    frames = hubert_frames(audio.size)
    if not 0.0 < peak <= MAX_PEAK or frames == 0:
        return None
    scaled = audio / peak * (PEAK_SCALE * ALPHA * 32768) + (1 - ALPHA) * 32768 * audio
    sf.write(folder / WAV_DIR / name, scaled.astype(np.int16), SAMPLE_RATE, subtype="PCM_16", format="WAV")
    rng = np.random.default_rng(zlib.crc32(utt.utt_id.encode()))
    features = rng.standard_normal((1, SSL_DIM, frames), dtype=np.float32)
    torch.save(torch.from_numpy(features).half(), folder / HUBERT_DIR / f"{name}.pt")
    word2ph = " ".join("2" for _ in range(len(phones) // 2))
    return f"{name}\t{' '.join(phones)}\t{word2ph}\t{utt.text}"
