"""Exports of a result measured on several nodes (--nodes): each framework's multi-node launch, read back by the
programs that consume it: srun's own option list, torch's torchrun parser (torch.distributed.run.parse_args), then
3D-Speaker's, WeNet's and SpeechBrain's own parsers for the script's part; ESPnet's launcher parser
(espnet2.bin.launch, which run.sh's --ngpu/--num_nodes reach: egs2/TEMPLATE/spk1/spk.sh at espnet/espnet 021689d8
declares `num_nodes=1  # The number of nodes.` and passes it on as `--num_nodes`); Lightning's own Trainer under a
SLURM task's environment."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from autotune.exports import export
from autotune.result.tuned_config import TunedConfig
from tests.exports.common import RECIPES, bash_words, call_kwargs, for_target, make_tuned, notes_text

# Inside an sbatch job of two nodes: srun starts its command once per node (here: once, after its options), scontrol
# names the job's nodes.
_SLURM = (
    'scontrol() { [ "$1 $2" = "show hostnames" ] && printf "node1\\nnode2\\n"; }; '
    'srun() { export SRUN_OPTIONS=""; while [[ "$1" == --* ]]; do SRUN_OPTIONS+="$1 "; shift; done; "$@"; }; '
    'export SLURM_JOB_ID=4242 SLURM_JOB_NODELIST="node[1-2]"; '
)


def across(tuned: TunedConfig, nodes: int) -> TunedConfig:
    return dataclasses.replace(tuned, cluster={"nodes": nodes, "devices_per_node": tuned.config.world_size // nodes})


def launched(command: str | None) -> tuple[dict[str, str], list[str], list[str]]:
    """(environment, srun's options, the argv srun runs) of a printed multi-node command."""
    assert command is not None and command.count("srun ") == 1
    environment, argv = bash_words(_SLURM + command)
    return environment, environment["SRUN_OPTIONS"].split(), argv


def torchrun_args(argv: list[str]) -> tuple[object, int]:
    """torch's own parse of torchrun's options, and where the script starts in argv."""
    from torch.distributed.run import parse_args

    assert argv[0] == "torchrun"
    script = next(index for index, word in enumerate(argv[1:], 1) if not word.startswith("--"))
    return parse_args(argv[1 : script + 1]), script


def srun_knows(options: list[str], tmp_path: Path) -> None:
    """Every option is one of srun's own (its --help), where SLURM's client is installed. srun reads a slurm.conf
    before anything else, even for --help: a minimal one is enough."""
    if shutil.which("srun") is None:
        pytest.skip("srun is not installed (apt-get install slurm-client)")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    command = [str(shutil.which("srun")), "--help"]
    text = subprocess.run(command, capture_output=True, text=True, check=False, env={"SLURM_CONF": str(conf)}).stdout
    for option in options:
        assert f"{option.split('=')[0]}=" in text, option


@pytest.mark.parametrize("target", ("3d-speaker", "wenet", "speechbrain"))
def test_torchrun_targets_launch_one_torchrun_per_node(target: str, tmp_path: Path) -> None:
    result = export(across(for_target(target, world_size=4, accum=2), nodes=2), target)
    environment, options, argv = launched(result.command)
    assert options == ["--nodes=2", "--ntasks-per-node=1"]
    srun_knows(options, tmp_path)
    args, script = torchrun_args(argv)
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend) == ("2", "2", "c10d")
    assert (args.rdzv_endpoint, args.rdzv_id) == ("node1:29500", "4242")  # the job's first node, the job's id
    rest = argv[script + 1 :]
    if target == "3d-speaker":
        from tests.exports.test_speakerlab import _config

        recipe = tmp_path / "cam++.yaml"
        shutil.copy(RECIPES / "3d-speaker_cam++.yaml", recipe)
        parsed, _ = _config(rest, recipe)
        assert parsed.gpu == ["0", "1"]  # train.py takes gpu[LOCAL_RANK]: one node's GPUs
        assert rest[rest.index("--batch_size") + 1] == str(32 * 4)  # global: train.py divides by WORLD_SIZE (4)
        assert "LOCAL_RANK for its rank" in notes_text(result)
    elif target == "wenet":
        from tests.exports.test_wenet import wenet_parser

        parsed = wenet_parser().parse_args(rest)
        assert parsed.train_engine == "torch_ddp" and parsed.dist_backend == "nccl"
    else:
        import speechbrain as sb

        hparams, run_opts, _ = sb.parse_arguments(rest)
        assert hparams == "hparams/train_ecapa_tdnn.yaml" and run_opts["grad_accumulation_factor"] == 2
    assert "sbatch job of #SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=2" in notes_text(result)


def test_espnet_asks_its_launcher_for_the_nodes() -> None:
    pytest.importorskip("espnet2", reason="the frameworks extra installs espnet")
    from espnet2.bin.launch import get_parser

    result = export(across(make_tuned(model="ecapa-tdnn", world_size=4), nodes=2), "espnet")
    _, argv = bash_words(result.command)
    options = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert options["--ngpu"] == "2" and options["--num_nodes"] == "2"  # run.sh's --ngpu is per node
    # spk.sh hands both to ESPnet's launcher, which runs the trainer once per node through slurm.pl and srun
    launch = get_parser().parse_args(
        ["--cmd", "slurm.pl", "--ngpu", options["--ngpu"], "--num_nodes", options["--num_nodes"], "--", "python"]
    )
    assert (launch.ngpu, launch.num_nodes) == (2, 2)
    assert "cmd_backend='slurm'" in notes_text(result)


def test_lightning_trainer_takes_num_nodes_under_srun(monkeypatch) -> None:
    from lightning.pytorch import Trainer
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    result = export(across(make_tuned(world_size=4, device_type="cpu"), nodes=2), "lightning")
    kwargs = call_kwargs(result.python_text or "", "Trainer")
    assert (kwargs["devices"], kwargs["num_nodes"], kwargs["strategy"]) == (2, 2, "ddp")
    # The fourth task of `srun` in a job of --nodes=2 --ntasks-per-node=2, as the note says to start it.
    slurm = {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "2", "SLURM_JOB_NAME": "train"}
    slurm |= {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_JOB_ID": "7"}
    slurm |= {"SLURM_NODELIST": "node[1-2]"}
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    trainer = Trainer(**kwargs, logger=False, enable_checkpointing=False)
    assert isinstance(trainer.strategy.cluster_environment, SLURMEnvironment)
    assert (trainer.num_nodes, trainer.world_size, trainer.global_rank, trainer.local_rank) == (2, 4, 3, 1)
    assert "--ntasks-per-node=2" in notes_text(result) and "srun python train.py" in notes_text(result)


def test_a_one_node_result_prints_no_srun() -> None:
    for target in ("3d-speaker", "wenet", "speechbrain", "espnet"):
        command = export(for_target(target, world_size=4), target).command or ""
        assert "srun" not in command and "--num_nodes" not in command and "--rdzv" not in command


def test_devices_that_do_not_divide_among_the_nodes_are_a_one_node_launch() -> None:
    result = export(across(make_tuned(world_size=4), nodes=2), "3d-speaker", world_size=3)
    assert "srun" not in (result.command or "") and "--nproc_per_node=3" in (result.command or "")
    assert "Measured on 2 nodes; 3 device(s) do not divide among them" in notes_text(result)
