"""Damaged checkpoints and full disks, on real SFT runs through ``slime train`` (issue 26 item 5).

A damaged newest checkpoint (cut, emptied, garbled, mistyped; ``latest`` naming a missing step or
empty) makes ``--load`` fall back to the newest complete one with one warning line naming the file
and the step, and the resumed run trains exactly the rows an uninterrupted one trains. With no
complete checkpoint, ``--load`` is one error line naming the file and the step (no traceback, and not
"it ran without --save-interval"). A save that finds the disk full stops the run with one line naming
the disk and the space needed, its earlier checkpoint intact and resumable; a disk weight sync on a
full disk names ENOSPC and the path in one line. The full disk is a small tmpfs (root only, else
skipped), so every write goes through the real writers (Python's, torch's, safetensors').
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from slime.cli import main
from slime.loop.checkpoint import latest_checkpoint
from tests.fixtures.sft_run import resize_disk, sft_argv, small_disk, step_numbers, trained_rows, write_sft_inputs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    return write_sft_inputs(tmp_path_factory.mktemp("sft"))


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory) -> list[tuple[int, list[int]]]:
    """The rows an uninterrupted 6-step run trains, step by step."""
    run = tmp_path_factory.mktemp("ref") / "run"
    assert main(sft_argv(*inputs, run)) == 0
    return trained_rows(run)


def _finished(inputs, tmp_path, steps: int) -> Path:
    run = tmp_path / "run"
    assert main(sft_argv(*inputs, run, steps=steps)) == 0
    return run


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _manifest_free(ckpt: Path) -> None:
    """Make ``ckpt`` look like one written before manifests (its files then checked by kind, not size)."""
    (ckpt / "manifest.json").unlink(missing_ok=True)


def _cut(path: Path, keep: float) -> None:
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])


def _mistype(ckpt: Path) -> None:
    _manifest_free(ckpt)
    state = json.loads((ckpt / "loop.json").read_text())
    (ckpt / "loop.json").write_text(json.dumps({**state, "step": "four"}))


def _garble_same_size(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * (path.stat().st_size // 256) + b"x" * (path.stat().st_size % 256))


DAMAGE = {
    "truncated trainer.pt": (lambda c: _cut(c / "trainer.pt", 0.5), "step_000004/trainer.pt", "step_000002"),
    "empty trainer.pt": (lambda c: _cut(c / "trainer.pt", 0), "step_000004/trainer.pt", "step_000002"),
    "garbled loop.json": (lambda c: _cut(c / "loop.json", 0.3), "step_000004/loop.json", "step_000002"),
    "mistyped loop.json": (_mistype, "step_000004/loop.json", "step_000002"),
    "no trainer.pt (a copy cut short)": (
        lambda c: (c / "trainer.pt").unlink(),
        "step_000004/trainer.pt",
        "step_000002",
    ),
    "latest names a missing step": (
        lambda c: (c.parent / "latest").write_text("step_000009"),
        "step_000009",
        "step_000004",
    ),
    "latest empty (a save cut short)": (lambda c: (c.parent / "latest").write_text(""), "latest", "step_000004"),
}


@pytest.mark.parametrize("damage, named, used", DAMAGE.values(), ids=DAMAGE.keys())
def test_load_falls_back_to_the_newest_complete_checkpoint_saying_so(
    inputs, reference, tmp_path, caplog, capsys, damage, named, used
):
    run = _finished(inputs, tmp_path, steps=4)
    damage(run / "checkpoints" / "step_000004")
    caplog.set_level(logging.INFO)
    assert main(sft_argv(*inputs, run, "--load", str(run))) == 0, capsys.readouterr().err
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "--load" in r.getMessage()]
    assert (
        len(warned) == 1 and named in warned[0] and f"resuming from the newest complete checkpoint, {used}" in warned[0]
    ), warned
    assert "without --save-interval" not in capsys.readouterr().err
    assert any(f"resuming from {run / 'checkpoints' / used}" in r.getMessage() for r in caplog.records)
    assert step_numbers(run) == [1, 2, 3, 4, 5, 6]
    assert trained_rows(run) == reference  # nothing lost or trained twice across the fallback


UNREADABLE = {
    "truncated trainer.pt": (lambda c: _cut(c / "trainer.pt", 0.5), "trainer.pt", "truncated"),
    "empty trainer.pt": (lambda c: _cut(c / "trainer.pt", 0), "trainer.pt", "0 bytes"),
    "garbled trainer.pt of the saved size": (lambda c: _garble_same_size(c / "trainer.pt"), "trainer.pt", "unreadable"),
    "trainer.pt of another shape": (
        lambda c: (_manifest_free(c), __import__("torch").save({"optimizer": {}}, c / "trainer.pt")),
        "trainer.pt",
        "does not fit",
    ),
    "garbled loop.json": (lambda c: _cut(c / "loop.json", 0.3), "loop.json", ""),
    "garbled loop.json, no manifest": (
        lambda c: (_manifest_free(c), _cut(c / "loop.json", 0.3)),
        "loop.json",
        "garbled JSON",
    ),
    "mistyped loop.json": (_mistype, "loop.json", "not a loop state"),
}


@pytest.mark.parametrize("damage, file, why", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_an_unreadable_only_checkpoint_is_one_line_naming_the_file_and_the_step(
    inputs, tmp_path, capsys, damage, file, why
):
    run = _finished(inputs, tmp_path, steps=2)
    damage(run / "checkpoints" / "step_000002")
    capsys.readouterr()
    assert main(sft_argv(*inputs, run, "--load", str(run))) == 2
    line = _error_line(capsys)
    assert "checkpoint step 2" in line and f"step_000002/{file}" in line and why in line, line
    assert "without --save-interval" not in line


def test_a_checkpoint_written_before_manifests_still_resumes(inputs, reference, tmp_path):
    run = _finished(inputs, tmp_path, steps=4)
    for ckpt in (run / "checkpoints").glob("step_*"):
        _manifest_free(ckpt)
    assert main(sft_argv(*inputs, run, "--load", str(run))) == 0
    assert trained_rows(run) == reference


def test_a_full_disk_during_a_save_is_one_line_naming_the_disk_and_keeps_the_earlier_checkpoint(
    inputs, reference, tmp_path, capsys
):
    sizes = _finished(inputs, tmp_path / "sizes", steps=2)  # how much a checkpoint and the rest of a run take
    ckpt = sum(p.stat().st_size for p in (sizes / "checkpoints" / "step_000002").rglob("*") if p.is_file())
    with small_disk(tmp_path / "disk", ckpt * 3 // 2 + 64 * 1024) as disk:  # room for one checkpoint, not two
        run = disk / "run"
        capsys.readouterr()
        assert main(sft_argv(*inputs, run)) == 2
        line = _error_line(capsys)
        assert line.startswith("slime train: error: checkpoint step 4: no space left on device (ENOSPC) writing ")
        assert f"the disk mounted at {disk} (tmpfs): " in line and " free of " in line and "it needs about " in line
        assert "the previous checkpoint step_000002 is intact" in line and f"--load {run}" in line
        from slime.loop.checkpoint import checkpoint_problem

        assert latest_checkpoint(run / "checkpoints") == run / "checkpoints" / "step_000002"
        assert checkpoint_problem(run / "checkpoints" / "step_000002") is None
        assert not list((run / "checkpoints").glob(".tmp-*")), "the partial checkpoint is left behind"
        assert step_numbers(run) == [1, 2, 3, 4]
        resize_disk(disk, 16 * 1024 * 1024)
        assert main(sft_argv(*inputs, run, "--load", str(run))) == 0
        assert step_numbers(run) == [1, 2, 3, 4, 5, 6] and trained_rows(run) == reference


async def test_a_full_disk_during_a_disk_weight_sync_names_enospc_and_the_path_in_one_line(inputs, tmp_path):
    from transformers import AutoModelForCausalLM

    from slime.config import SyncConfig
    from slime.errors import SlimeError
    from slime.sync.disk import DiskWeightSync
    from slime.train.checkpoint import save_hf_dir

    model_dir, _ = inputs
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with small_disk(tmp_path / "disk", 48 * 1024) as disk:  # less than the weights (about 100 KiB)
        sync = DiskWeightSync(
            SyncConfig(weights_dir=str(disk / "weights")),
            pool=None,
            save_fn=lambda out: save_hf_dir(model, out, source_dir=str(model_dir)),
        )
        with pytest.raises(SlimeError) as info:  # slime's DiskFullError, not the writer's own error
            await sync.save(1)
        line = str(info.value)
        assert type(info.value).__name__ == "DiskFullError"
        assert "\n" not in line and line.startswith(
            "weight sync (--weight-sync disk) of version 1: no space left on device (ENOSPC) writing "
        )
        assert str(disk / "weights" / "v1") in line and f"the disk mounted at {disk} (tmpfs)" in line
        assert not any((disk / "weights").iterdir()), "a partial weights folder is left behind"
        shutil.rmtree(disk / "weights")


def test_the_checkpoint_a_resumed_run_started_from_is_never_pruned(inputs, tmp_path):
    """A resumed run's engines were launched from its checkpoint's model/, and a restarted engine is launched from
    it again: pruning it (the saves at steps 4 and 6, two kept) ended the run at the first engine restart."""
    run = _finished(inputs, tmp_path, steps=2)
    assert main(sft_argv(*inputs, run, "--load", str(run), steps=6)) == 0
    left = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert left == ["step_000002", "step_000004", "step_000006"]
    assert (run / "checkpoints" / "step_000002" / "model").is_dir()
