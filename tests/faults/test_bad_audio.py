"""Audio no recording holds (NaN or inf samples, an amplitude of 1e30) is refused: by the input check, which decodes
the start of a sample of the listed files, and by every read in a trial, which names the file."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from autotune.data import load_source
from autotune.data.audio import read_segment
from autotune.errors import DataError
from tests.faults.conftest import error_line, invoke


def _float_wav(path, samples):
    sf.write(path, np.asarray(samples, dtype=np.float32), 16000, subtype="FLOAT")
    return path


BAD = {
    "nan": [0.1] * 8000 + [float("nan")] + [0.1] * 7999,
    "inf": [0.0] * 15999 + [float("inf")],
    "1e30": [1e30] * 16000,
}


@pytest.mark.parametrize("kind", BAD, ids=BAD.keys())
def test_the_input_check_refuses_samples_no_recording_holds(tmp_path, kind):
    good = _float_wav(tmp_path / "good.wav", np.sin(np.arange(16000) / 10) * 0.5)
    bad = _float_wav(tmp_path / "bad.wav", BAD[kind])
    listing = tmp_path / "train.csv"
    listing.write_text(f"ID,dur,path,start,stop,spk\nu1,1.0,{good},0,1,s1\nu2,1.0,{bad},0,1,s2\n")
    result = invoke(["run", "--model", "cam++", "--data", str(listing), "--results-dir", str(tmp_path / "results")])
    assert result.exit_code == 2, result.output
    line = error_line(result.stderr)
    assert f"audio file {bad} holds" in line and ("non-finite" in line or "amplitude 1e+30" in line)
    assert not (tmp_path / "results").exists()


def test_a_trial_names_the_file_it_cannot_train_on(tmp_path):
    """A file the input check's sample did not reach: the trial's read refuses it, with its name."""
    good = _float_wav(tmp_path / "good.wav", np.zeros(16000))
    listing = tmp_path / "train.csv"
    listing.write_text(f"ID,dur,path,start,stop,spk\nu1,1.0,{good},0,1,s1\n")
    source = load_source(listing)
    _float_wav(good, BAD["nan"])  # broken after the check, as a file the sample missed would be
    with pytest.raises(DataError, match=f"audio file {good} \\(utterance u1\\) holds non-finite samples"):
        read_segment(source.utterances[0])
