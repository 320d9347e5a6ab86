"""GPT-SoVITS s1's training data: the files its preparation writes, the dataset that reads them, and its bucket sampler.

The recipe (RVC-Boss/GPT-SoVITS 48b1a01, ``GPT_SoVITS/AR/data``) trains from an experiment folder its webui prepares
once: ``2-name2text.txt`` (name, phones, word2ph, text per line), ``3-bert/<name>.pt`` (a (1024, phones) BERT feature
per item, float16 when the preparation ran half precision, the default on a GPU: prepare_datasets/1-get-text.py:16,
63-64) and ``6-name2semantic.tsv`` (name and the 25 Hz semantic ids of the SSL codebook). `ensure_s1_data` writes the
same three once per corpus into autotune's cache: the semantic ids are random ids in [0, 1024) seeded by the utterance
id, 25 per second of its audio, and the BERT features random float16 values (a step's cost depends on their shapes;
the real ones need HuBERT, BERT and the s2 quantizer). The phones are the transcript's (`transcript_phones`, one
consonant-vowel pair per syllable between silences) written in the recipe's v2 symbol set (text/symbols2.py): a
silence is its pause symbol ``SP`` (symbols2 has no ``sil``, and the recipe's dataset skips, one by one, every item
with a phone it lacks: the real s1_train.py, run on this folder, found 0 items and failed); their ids are positions in
autotune's phone table, within the 732 rows of the v2 model's phone embedding.

``Text2SemanticDataset`` (dataset.py) holds the ids in RAM, drops items over ``max_sec`` or outside 3-25 phones per
second (lines 145-173), repeats a set of fewer than 100 items (179-188), and per item ``torch.load``s its BERT file
(224-236); its collate pads the phones with 0, the semantic ids with EOS and the BERT features with zeros (252-297).

Its ``DistributedBucketSampler`` (bucket_sampler.py) is re-implemented here from reading it: items sorted by seconds,
cut into 2-second buckets, each bucket shuffled, the concatenation cut into groups of ``batch_size x replicas``,
the groups shuffled, padded to a multiple of the replicas, and every replicas-th item kept for this rank. It yields
items, not batches: the DataLoader's ``batch_size`` cuts this rank's list into batches, the last one short.
"""

from __future__ import annotations

import json
import math
import random
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autotune.data.ns2_prep import NS2_PHONES, transcript_phones
from autotune.data.offline import Preparation, cache_root, complete_check, corpus_key, prepare_once
from autotune.data.sources import Utterance
from autotune.errors import DataError

__all__ = [
    "BERT_DIM",
    "EOS",
    "S1Corpus",
    "S1Dataset",
    "SEMANTIC_HZ",
    "bucket_sampler_epoch",
    "collate_s1",
    "ensure_s1_data",
    "loader_batches",
    "reshard",
    "semantic_length",
]

PREP_VERSION = 2  # 2: silences written as symbols2's SP
WHAT = "phones, BERT features (one .pt per item) and semantic ids (GPT-SoVITS s1 experiment folder)"
SEMANTIC_HZ = 25  # the s2 quantizer's rate, dataset.py's hz
CODEBOOK_SIZE = 1024
EOS = 1024  # s1longer-v2.yaml data.pad_val and model.EOS
BERT_DIM = 1024
MAX_SEC = 54  # s1longer-v2.yaml data.max_sec
MIN_PS_RATIO, MAX_PS_RATIO = 3, 25  # dataset.py's phones per second
MIN_ITEMS = 100  # dataset.py:179
BUCKET_WIDTH_S = 2.0  # bucket_sampler.py:74
NAME2TEXT, NAME2SEMANTIC, BERT_DIR = "2-name2text.txt", "6-name2semantic.tsv", "3-bert"
_PHONE_ID = {phone: index for index, phone in enumerate(NS2_PHONES)}
PAUSE = "SP"  # symbols2's pause, for transcript_phones' sil
_PHONE_ID[PAUSE] = _PHONE_ID["sil"]


def semantic_length(utt: Utterance) -> int:
    """Semantic tokens of the utterance's audio: 25 per second."""
    return max(1, round(utt.duration_s * SEMANTIC_HZ))


@dataclass(frozen=True, kw_only=True, slots=True)
class S1Corpus:
    """A prepared experiment folder; per item its name, phone ids and semantic ids (in RAM, as the recipe)."""

    root: Path
    names: tuple[str, ...]
    phones: tuple[tuple[int, ...], ...]
    semantic: tuple[np.ndarray, ...]

    def bert_path(self, name: str) -> Path:
        return self.root / BERT_DIR / f"{name}.pt"

    @classmethod
    def load(cls, root: Path) -> S1Corpus:
        phones: dict[str, tuple[int, ...]] = {}
        for line in (root / NAME2TEXT).read_text(encoding="utf-8").strip("\n").split("\n"):
            name, phone_text, _, _ = line.split("\t")
            phones[name] = tuple(_PHONE_ID[phone] for phone in phone_text.split(" "))
        rows = [line.split("\t") for line in (root / NAME2SEMANTIC).read_text(encoding="utf-8").splitlines()[1:]]
        return cls(
            root=root,
            names=tuple(name for name, _ in rows),
            phones=tuple(phones[name] for name, _ in rows),
            semantic=tuple(np.array(ids.split(" "), dtype=np.int64) for _, ids in rows),
        )


def _item_name(index: int) -> str:
    return f"{index:07d}.wav"  # the recipe names items by their audio file


_is_complete = complete_check("done.json", PREP_VERSION)


def ensure_s1_data(
    utterances: Sequence[Utterance], *, cache_dir: str | Path | None = None
) -> tuple[S1Corpus, Preparation]:
    """The corpus's experiment folder from the cache, written once when missing.

    Raises:
        DataError: no utterance has phones, or the cache cannot be written.
    """
    usable = [utt for utt in utterances if transcript_phones(utt.text or "")]
    if not usable:
        raise DataError(f"none of the {len(utterances)} transcripts has a vowel letter or {{ARPAbet}} phones")
    settings = {"version": PREP_VERSION, "hz": SEMANTIC_HZ, "bert": BERT_DIM}
    root = cache_root(cache_dir) / f"gpt-sovits-s1-{corpus_key('gpt-sovits-s1', settings, usable, with_text=True)}"
    reused, seconds = prepare_once(root, lambda folder: _prepare(folder, usable), _is_complete)
    corpus = S1Corpus.load(root)
    return corpus, Preparation(what=WHAT, path=str(root), items=len(usable), seconds=seconds, reused=reused)


def _prepare(folder: Path, utterances: Sequence[Utterance]) -> None:
    (folder / BERT_DIR).mkdir()
    texts, semantics = [], ["item_name\tsemantic_audio"]
    for index, utt in enumerate(utterances):
        name = _item_name(index)
        phones = [PAUSE if phone == "sil" else phone for phone in transcript_phones(utt.text or "")]
        rng = np.random.default_rng(zlib.crc32(utt.utt_id.encode()))
        ids = rng.integers(0, CODEBOOK_SIZE, semantic_length(utt))
        bert = torch.from_numpy(rng.standard_normal((BERT_DIM, len(phones)), dtype=np.float32)).half()
        torch.save(bert, folder / BERT_DIR / f"{name}.pt")
        word2ph = " ".join("2" for _ in range(len(phones) // 2))
        texts.append(f"{name}\t{' '.join(phones)}\t{word2ph}\t{utt.text}")
        semantics.append(f"{name}\t{' '.join(str(i) for i in ids.tolist())}")
    (folder / NAME2TEXT).write_text("\n".join(texts) + "\n", encoding="utf-8")
    (folder / NAME2SEMANTIC).write_text("\n".join(semantics) + "\n", encoding="utf-8")
    (folder / "done.json").write_text(json.dumps({"version": PREP_VERSION}))  # last: complete


def recipe_items(corpus: S1Corpus, max_sec: float = MAX_SEC) -> list[int]:
    """The corpus items the recipe's dataset keeps, in its order: the length and phones-per-second filters, then the
    whole list repeated when it has fewer than 100 items."""
    kept = []
    for index, (phones, semantic) in enumerate(zip(corpus.phones, corpus.semantic, strict=True)):
        seconds = len(semantic) / SEMANTIC_HZ
        if len(semantic) > max_sec * SEMANTIC_HZ or len(phones) > max_sec * SEMANTIC_HZ / 2.5:
            continue
        if not MIN_PS_RATIO <= len(phones) / seconds <= MAX_PS_RATIO:
            continue
        kept.append(index)
    if kept and len(kept) < MIN_ITEMS:
        kept = kept * max(2, MIN_ITEMS // len(kept))
    return kept


class S1Dataset(torch.utils.data.Dataset[dict[str, Any]]):
    """``Text2SemanticDataset``: ids in RAM, each item's BERT features read from its file in the worker."""

    def __init__(self, corpus: S1Corpus) -> None:
        self.corpus = corpus
        self.items = recipe_items(corpus)
        if not self.items:
            raise DataError(
                f"every one of the {len(corpus.names)} utterances is over {MAX_SEC} s or outside {MIN_PS_RATIO}-"
                f"{MAX_PS_RATIO} phones per second, as GPT-SoVITS's dataset filters them"
            )
        self.semantic_counts = tuple(len(corpus.semantic[item]) for item in self.items)
        self.phone_counts = tuple(len(corpus.phones[item]) for item in self.items)
        self.seconds = tuple(count / SEMANTIC_HZ for count in self.semantic_counts)

        self.preloaded: dict[int, torch.Tensor | None] | None = None

    def __len__(self) -> int:
        return len(self.items)

    def preload(self) -> float:
        """Every BERT file read into RAM once, before the DataLoader starts (the preload knob): the workers then share
        them instead of loading one file per item. Returns the wall seconds it took."""
        started = time.perf_counter()
        self.preloaded = {item: self._bert(item) for item in sorted(set(self.items))}
        return time.perf_counter() - started

    def _bert(self, item: int) -> torch.Tensor | None:
        path = self.corpus.bert_path(self.corpus.names[item])
        bert = torch.load(path, map_location="cpu") if path.exists() else None  # no file: zeros, as dataset.py:229
        phones = len(self.corpus.phones[item])
        if bert is not None and bert.shape[-1] != phones:
            raise DataError(f"{path}: {bert.shape[-1]} BERT frames for {phones} phones")
        return bert

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = self.items[index]
        bert = self.preloaded[item] if self.preloaded is not None else self._bert(item)
        phones, semantic = self.corpus.phones[item], self.corpus.semantic[item]
        return {"idx": index, "phoneme_ids": phones, "semantic_ids": semantic, "bert_feature": bert}


def collate_s1(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """The recipe's collate: phones padded with 0, semantic ids with EOS, BERT features (B, 1024, phones) with 0."""
    phone_counts = torch.tensor([len(example["phoneme_ids"]) for example in examples])
    semantic_counts = torch.tensor([len(example["semantic_ids"]) for example in examples])
    phones = torch.zeros(len(examples), int(phone_counts.max()), dtype=torch.long)
    semantic = torch.full((len(examples), int(semantic_counts.max())), EOS, dtype=torch.long)
    bert = torch.zeros(len(examples), BERT_DIM, int(phone_counts.max()))
    for row, example in enumerate(examples):
        phones[row, : phone_counts[row]] = torch.tensor(example["phoneme_ids"])
        semantic[row, : semantic_counts[row]] = torch.from_numpy(example["semantic_ids"])
        if example["bert_feature"] is not None:
            bert[row, :, : example["bert_feature"].shape[-1]] = example["bert_feature"]
    return {
        "phoneme_ids": phones,
        "phoneme_ids_len": phone_counts,
        "semantic_ids": semantic,
        "semantic_ids_len": semantic_counts,
        "bert_feature": bert,
    }


def make_buckets(seconds: Sequence[float], width_s: float = BUCKET_WIDTH_S) -> list[list[int]]:
    """Item indices by length: sorted by seconds, a new bucket each time an item reaches the next multiple of width_s
    (the first bucket holds items under width_s, each next one the following width_s)."""
    buckets: list[list[int]] = []
    current: list[int] = []
    limit = width_s
    for index in sorted(range(len(seconds)), key=lambda i: seconds[i]):
        if seconds[index] < limit:
            current.append(index)
        else:
            buckets.append(current)
            current, limit = [index], limit + width_s
    if current:
        buckets.append(current)
    return buckets


def bucket_sampler_epoch(
    seconds: Sequence[float], *, batch_size: int, replicas: int, rank: int, seed: int
) -> list[int]:
    """One epoch of this rank's items from the recipe's bucket sampler (shuffle on, drop_last off).

    Every rank computes the same shuffled order from ``seed`` (the recipe's seed + epoch) and keeps its share:
    ceil(len / replicas) items, the list padded from its own start to a multiple of the replicas.
    """
    shuffler = random.Random(seed)
    order: list[int] = []
    for bucket in make_buckets(seconds):
        bucket = list(bucket)
        shuffler.shuffle(bucket)
        order.extend(bucket)
    group = batch_size * replicas
    groups = [order[start : start + group] for start in range(0, len(order), group)]
    shuffler.shuffle(groups)
    order = [index for chunk in groups for index in chunk]
    total = math.ceil(len(order) / replicas) * replicas
    while len(order) < total:
        order += order[: total - len(order)]
    return order[rank:total:replicas]


def reshard(samples: Sequence[int], *, replicas: int, rank: int, seed: int, epoch: int) -> list[int]:
    """A sampler's items dealt over the ranks once more, as Lightning's DistributedSamplerWrapper does to a custom
    sampler when the Trainer's ``use_distributed_sampler`` is on (shuffled by seed + epoch, padded, every
    replicas-th kept): applied to a sampler that already kept its rank's share, each rank trains on 1/N^2."""
    sampler: torch.utils.data.DistributedSampler[int] = torch.utils.data.DistributedSampler(
        range(len(samples)),  # type: ignore[arg-type]
        num_replicas=replicas,
        rank=rank,
        shuffle=True,
        seed=seed,
    )
    sampler.set_epoch(epoch)
    return [samples[position] for position in sampler]


def loader_batches(samples: Sequence[int], batch_size: int) -> list[list[int]]:
    """A DataLoader's batches of ``batch_size`` over a sampler's items, the last one short (drop_last off)."""
    return [list(samples[start : start + batch_size]) for start in range(0, len(samples), batch_size)]
