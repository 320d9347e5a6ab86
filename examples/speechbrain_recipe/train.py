#!/usr/bin/env python3
"""A speaker-classification recipe written as SpeechBrain's VoxCeleb recipe is
(recipes/VoxCeleb/SpeakerRec/train_speaker_embeddings.py: a Brain subclass, a data preparation run on the main
process, a DynamicItemDataset with an audio pipeline that decodes and crops, Brain.fit with the hparams'
dataloader_options), trained by SpeechBrain's own code on any folder of speaker subfolders of WAV files.

  python train.py hparams/train_ecapa_tdnn.yaml --data_folder data --device cpu

`autotune run --recipe speechbrain --command 'python train.py hparams/train_ecapa_tdnn.yaml --data_folder data'`
tunes it through SpeechBrain's own overrides (docs/own-training.md).
"""

import json
import os
import random
import sys
from pathlib import Path

import speechbrain as sb
from hyperpyyaml import load_hyperpyyaml
from speechbrain.utils.distributed import run_on_main


class SpeakerBrain(sb.core.Brain):
    """Features, normalisation, embedding, classifier; the additive-margin loss."""

    def compute_forward(self, batch, stage):
        batch = batch.to(self.device)
        wavs, lens = batch.sig
        feats = self.modules.compute_features(wavs)
        feats = self.modules.mean_var_norm(feats, lens)
        embeddings = self.modules.embedding_model(feats)
        return self.modules.classifier(embeddings), lens

    def compute_objectives(self, predictions, batch, stage):
        predictions, lens = predictions
        speakers, _ = batch.spk_id_encoded
        return self.hparams.compute_cost(predictions, speakers, lens)


def prepare(data_folder, annotation):
    """One entry per WAV file: its path and its speaker (the folder it is in)."""
    entries = {}
    for path in sorted(Path(data_folder).glob("*/*.wav")):
        entries[path.stem] = {"wav": str(path.resolve()), "spk_id": path.parent.name}
    if not entries:
        raise ValueError(f"no WAV files in speaker folders under {data_folder}")
    Path(annotation).parent.mkdir(parents=True, exist_ok=True)
    Path(annotation).write_text(json.dumps(entries))


def dataio_prep(hparams):
    """The training set: each item decoded and cropped to sentence_len seconds at a random offset."""
    data = sb.dataio.dataset.DynamicItemDataset.from_json(hparams["train_annotation"])
    snippet = int(hparams["sample_rate"] * hparams["sentence_len"])
    encoder = sb.dataio.encoder.CategoricalEncoder()

    @sb.utils.data_pipeline.takes("wav")
    @sb.utils.data_pipeline.provides("sig")
    def audio_pipeline(wav):
        signal = sb.dataio.dataio.read_audio(wav)
        if signal.shape[0] > snippet:
            start = random.randint(0, signal.shape[0] - snippet)
            signal = signal[start : start + snippet]
        return signal

    @sb.utils.data_pipeline.takes("spk_id")
    @sb.utils.data_pipeline.provides("spk_id_encoded")
    def label_pipeline(spk_id):
        yield encoder.encode_sequence_torch([spk_id])

    sb.dataio.dataset.add_dynamic_item([data], audio_pipeline)
    sb.dataio.dataset.add_dynamic_item([data], label_pipeline)
    encoder.load_or_create(
        path=os.path.join(hparams["save_folder"], "label_encoder.txt"), from_didatasets=[data], output_key="spk_id"
    )
    sb.dataio.dataset.set_output_keys([data], ["id", "sig", "spk_id_encoded"])
    return data


if __name__ == "__main__":
    hparams_file, run_opts, overrides = sb.parse_arguments(sys.argv[1:])
    sb.utils.distributed.ddp_init_group(run_opts)
    with open(hparams_file, encoding="utf-8") as fin:
        hparams = load_hyperpyyaml(fin, overrides)
    sb.create_experiment_directory(
        experiment_directory=hparams["output_folder"], hyperparams_to_save=hparams_file, overrides=overrides
    )
    run_on_main(prepare, kwargs={"data_folder": hparams["data_folder"], "annotation": hparams["train_annotation"]})
    train_data = dataio_prep(hparams)
    brain = SpeakerBrain(modules=hparams["modules"], opt_class=hparams["opt_class"], hparams=hparams, run_opts=run_opts)
    brain.fit(hparams["epoch_counter"], train_data, train_loader_kwargs=hparams["dataloader_options"])
