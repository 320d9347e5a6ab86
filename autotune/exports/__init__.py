"""Paste-ready exports of a tuned result for training frameworks (`autotune export RESULT.yaml --to TARGET`).

Each target writes that framework's own key names with its own batch semantics, and says in plain notes what the
framework cannot express (e.g. bf16 under WeNet's DDP engine, AMP in 3D-Speaker). Every target has a table with one
entry per knob of autotune/knobs/declarations.py (base.knob_table): what carries it, or the note saying it cannot.
"""

from __future__ import annotations

from autotune.exports import amphion, espnet, gpt_sovits, lightning, speakerlab, speechbrain, wenet  # noqa: F401
from autotune.exports.base import TARGETS, Export, ExportContext, Exporter, export, register

__all__ = ["TARGETS", "Export", "ExportContext", "Exporter", "export", "register"]
