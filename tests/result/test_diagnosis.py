"""The diagnosis on synthetic metrics: what bounds the winner and what to try next."""

from __future__ import annotations

from autotune.knobs.config import TrialConfig
from autotune.result.diagnosis import LargerBatches, decoded_audio_bytes, diagnose
from autotune.result.measurements import Measurements
from tests.conftest import make_cpu, make_cuda

SMALL_CORPUS = {"total_audio_hours": 2.76, "sample_rates": [16000], "n_utterances": 2000, "n_utterances_total": 2000}
HUGE_CORPUS = {"total_audio_hours": 2000.0, "sample_rates": [16000], "n_utterances": 20000, "n_utterances_total": 10**6}


def test_decoded_audio_size_scales_a_sampled_list_to_the_whole():
    assert decoded_audio_bytes(SMALL_CORPUS) == int(2.76 * 3600 * 16000 * 2)
    assert decoded_audio_bytes(HUGE_CORPUS) == int(2000 * 3600 * 16000 * 2 * 50)
    assert decoded_audio_bytes({}) is None


def test_waiting_for_data_is_data_bound_with_workers_and_preloading_next():
    winner = Measurements(status="ok", data_wait_fraction=0.42, gpu_utilization_percent=35.0)
    config = TrialConfig(per_device_batch_size=64, num_workers=2, pin_memory=False)
    result = diagnose(
        winner, config=config, hardware=make_cuda(), data=SMALL_CORPUS, compute={"pipeline_efficiency": 0.5}
    )
    assert result.bound == "data pipeline"
    assert any("42%" in line for line in result.evidence) and any(
        "50% of its compute-only" in line for line in result.evidence
    )
    assert any("busy 35%" in line for line in result.evidence)
    assert result.next[0].startswith("more DataLoader workers (now 2; this machine has 16 CPU cores)")
    assert any(line.startswith("preload the decoded audio into RAM (~0.3 GiB") for line in result.next)
    assert any("pin_memory" in line for line in result.next)
    assert result.to_dict()["bound"] == "data pipeline"


def test_a_winner_that_already_preloads_is_not_told_to_preload():
    config = TrialConfig(per_device_batch_size=64, num_workers=2, pin_memory=True, preload_audio=True)
    result = diagnose(
        Measurements(status="ok", data_wait_fraction=0.3), config=config, hardware=make_cuda(), data=SMALL_CORPUS
    )
    assert result.bound == "data pipeline" and result.next  # more workers still applies
    assert not any("preload" in line or "storage" in line for line in result.next)


def test_a_corpus_too_big_for_ram_points_at_storage():
    config = TrialConfig(per_device_batch_size=64, num_workers=16, pin_memory=True)
    result = diagnose(
        Measurements(status="ok", data_wait_fraction=0.3), config=config, hardware=make_cuda(), data=HUGE_CORPUS
    )
    assert result.bound == "data pipeline"
    assert result.next == (result.next[0],) and result.next[0].startswith("faster local storage (NVMe)")


def test_a_step_that_never_waits_is_compute_bound():
    winner = Measurements(
        status="ok", data_wait_fraction=0.01, peak_memory_bytes=8 * 2**30, memory_capacity_bytes=80 * 2**30
    )
    compute = {"pipeline_efficiency": 0.97, "fraction_of_peak": 0.21}
    result = diagnose(
        winner,
        config=TrialConfig(per_device_batch_size=64, num_workers=8, precision="fp32"),
        hardware=make_cuda(count=4),
        data=SMALL_CORPUS,
        compute=compute,
        searched_precisions=("fp32", "tf32"),
    )
    assert result.bound == "compute"
    assert any("97% of its compute-only ceiling" in line for line in result.evidence)
    assert any("21% of the device's dense peak" in line for line in result.evidence)
    assert result.next[0].startswith("bf16 (the search covered fp32, tf32)")
    assert "peak memory is 10% of the device" in result.next[1]
    assert result.next[2] == "more devices: 1 of this machine's 4 GPUs trained (--devices)"


def test_a_rejected_or_searched_precision_is_not_suggested_again():
    result = diagnose(
        Measurements(status="ok", data_wait_fraction=0.0),
        config=TrialConfig(per_device_batch_size=16, precision="fp32"),
        hardware=make_cpu(),
        data=SMALL_CORPUS,
        searched_precisions=("fp32",),
        rejected_precisions=("bf16",),
    )
    assert result.bound == "compute" and not any("bf16" in line for line in result.next)


def test_cpu_data_bound_advice_is_about_sharing_cores():
    config = TrialConfig(per_device_batch_size=16, num_workers=1, intra_op_threads=1)
    result = diagnose(
        Measurements(status="ok", data_wait_fraction=0.6), config=config, hardware=make_cpu(), data=SMALL_CORPUS
    )
    assert result.next[0].startswith("rebalance DataLoader workers (1) against intra-op threads (1)")


def test_nothing_measured_is_unknown():
    result = diagnose(
        Measurements(status="ok"), config=TrialConfig(per_device_batch_size=8), hardware=make_cpu(), data={}
    )
    assert result.bound == "unknown" and result.next == ()


ROOMY = Measurements(
    status="ok",
    data_wait_fraction=0.02,
    samples_per_second=14.7,
    peak_memory_bytes=2**30,
    memory_capacity_bytes=20 * 2**30,
)
BS16 = TrialConfig(per_device_batch_size=16, precision="bf16")


def _compute_bound(larger: LargerBatches | None, compute: dict | None = None):
    return diagnose(ROOMY, config=BS16, hardware=make_cpu(), data=SMALL_CORPUS, compute=compute, larger_batches=larger)


def test_an_efficiency_above_one_is_read_as_at_the_ceiling_not_as_faster():
    result = _compute_bound(None, compute={"pipeline_efficiency": 1.10})
    assert result.bound == "compute"
    assert "end to end it runs at its compute-only ceiling (measured 110%: above 100% is noise)" in result.evidence
    assert not any("110% of its compute-only ceiling" in line for line in result.evidence)


def test_a_larger_batch_the_search_measured_is_not_suggested_again():
    measured = LargerBatches(
        knob="per_device_batch_size",
        winner_value=16,
        largest_offered=64,
        best_measured=("bs=32 w=1 bf16 thr=2", 15.8, 2),
    )
    result = _compute_bound(measured)
    assert not any("larger" in line for line in result.next)
    assert (
        "larger batches were measured: the fastest, bs=32 w=1 bf16 thr=2, ran 15.8 samples/s (median of 2) against "
        "the winner's 14.7" in result.evidence
    )
    pruned = LargerBatches(knob="per_device_batch_size", winner_value=16, largest_offered=64, pruned=2)
    result = _compute_bound(pruned)
    assert not any("larger" in line for line in result.next)
    assert "2 configuration(s) with a larger batch were stopped early as far slower" in result.evidence
    oom = LargerBatches(
        knob="per_device_batch_size", winner_value=16, largest_offered=64, out_of_memory=("bs=64 w=0 bf16",)
    )
    result = _compute_bound(oom)
    assert not any("larger" in line for line in result.next)
    assert "larger batches ran out of memory or headroom: bs=64 w=0 bf16" in result.evidence


def test_a_larger_batch_is_suggested_where_the_search_could_not_measure_one():
    unmeasured = LargerBatches(knob="per_device_batch_size", winner_value=16, largest_offered=64)
    assert _compute_bound(unmeasured).next[0] == (
        "a larger per_device_batch_size (peak memory is 5% of the device): the space offers up to 64, but this run "
        "measured none above 16 at bf16 (a longer --budget or more --trials would)"
    )
    at_the_top = LargerBatches(knob="max_frames_in_batch", winner_value=48000, largest_offered=48000)
    assert _compute_bound(at_the_top).next[0] == (
        "a larger max_frames_in_batch than the space's largest (48000) where the recipe allows it (peak memory is 5% "
        "of the device): add larger choices to the search space"
    )
    on_two_threads = diagnose(
        ROOMY,
        config=TrialConfig(per_device_batch_size=16, precision="bf16", intra_op_threads=2),
        hardware=make_cpu(),
        data=SMALL_CORPUS,
        larger_batches=unmeasured,
    )
    assert "measured none above 16 at bf16 with 2 intra-op thread(s)" in on_two_threads.next[0]
    not_searched = LargerBatches(knob="per_device_batch_size", winner_value=16, largest_offered=None)
    assert _compute_bound(not_searched).next[0].startswith("a larger per-device batch where the recipe allows it")
    assert _compute_bound(None).next[0].startswith("a larger per-device batch where the recipe allows it")
