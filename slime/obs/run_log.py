"""What a run keeps of its log lines (``Observers`` opens one ``RunLog`` per run):

- ``RUN_DIR/train.log``: every line the run logs once its observers are open (the root logger's level, INFO
  under ``slime train``) and every step and eval line it prints, in the console's format, appended to on a
  resume. (Lines of the startup before that, the checks and the model load, are on the console only.)
- ``RUN_DIR/failed_samples.jsonl``: one JSON line per sample whose reward failed (raised, hung, returned a
  non-number; ``slime.rollout.rewards``): ``{"time", "group_id", "index", "prompt", "label", "response",
  "error": {"where", "type", "message", "elapsed_s", "traceback"}}``, from the ``failed_sample`` field those
  log records carry (``FAILED_SAMPLE_FIELD``).
- On the console, a warning repeated within a step (same logger, same message template: 48 samples whose reward
  raised) is shown once, then, at the end of the step, one line with how many more there were
  (``CollapseRepeats``); ``train.log`` keeps every one.

Only rank 0 of a torchrun job (``RANK`` unset or 0) writes the files.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

__all__ = ["RunLog", "CollapseRepeats", "FAILED_SAMPLE_FIELD"]

FAILED_SAMPLE_FIELD = "failed_sample"
"""The ``extra=`` field of a log record that carries a failed sample's evidence (a JSON-able dict); the same name
as ``slime.rollout.rewards.FAILED_SAMPLE_FIELD``, which sets it (obs does not import rollout)."""

_SUMMARY_FIELD = "slime_repeat_summary"
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # slime train's console format (slime.cli)


class CollapseRepeats(logging.Filter):
    """A console handler's filter: the first WARNING-or-worse record of each (logger, message template) since the
    last ``flush`` passes, the others are counted; ``flush`` emits one line per template with its count."""

    def __init__(self) -> None:
        super().__init__()
        self.handlers: list[logging.Handler] = []
        self._first: dict[tuple[str, str], logging.LogRecord] = {}
        self._more: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or getattr(record, _SUMMARY_FIELD, False):
            return True
        key = (record.name, str(record.msg))
        if key not in self._first:
            self._first[key] = record
            return True
        self._more[key] = self._more.get(key, 0) + 1
        return False

    def flush(self, where: str = "this step") -> None:
        """One line per template repeated since the last flush (``where``: named in it); then start counting anew."""
        for key, n in self._more.items():
            first = self._first[key]
            line = logging.LogRecord(
                first.name,
                first.levelno,
                first.pathname,
                first.lineno,
                "... and %d more like it %s (every one in train.log): %.120s",
                (n, where, first.getMessage()),
                None,
            )
            setattr(line, _SUMMARY_FIELD, True)
            for handler in self.handlers:
                handler.handle(line)
        self._first.clear()
        self._more.clear()


class _FailedSamples(logging.Handler):
    """Appends the ``failed_sample`` evidence of each record that has one to a JSONL file."""

    def __init__(self, path: Path):
        super().__init__(logging.DEBUG)
        self.file = path.open("a", encoding="utf-8")

    def emit(self, record: logging.LogRecord) -> None:
        evidence = getattr(record, FAILED_SAMPLE_FIELD, None)
        if not isinstance(evidence, dict):
            return
        row = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created)), **evidence}
        # default=str: evidence is JSON-able by contract; a stray value must not lose the line
        self.file.write(json.dumps(row, default=str) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()
        super().close()


class RunLog:
    """``train.log``, ``failed_samples.jsonl`` and the collapsing of repeated console warnings for one run.

    Args:
        run_dir: the run folder (created if missing).
        logger: where the handlers go (default the root logger; tests pass their own).
    """

    def __init__(self, run_dir: str | Path, *, logger: logging.Logger | None = None):
        self.logger = logger or logging.getLogger()
        self.collapse = CollapseRepeats()
        self.files: list[logging.Handler] = []
        # the console handler itself (slime train's basicConfig one): not a FileHandler or a test's capture handler
        consoles: list[logging.Handler] = [h for h in self.logger.handlers if type(h) is logging.StreamHandler]
        for console in consoles:
            console.addFilter(self.collapse)
        self.collapse.handlers = consoles
        if int(os.environ.get("RANK", "0")) != 0:  # torchrun: rank 0 keeps the run's files
            return
        path = Path(run_dir)
        path.mkdir(parents=True, exist_ok=True)
        train_log = logging.FileHandler(path / "train.log", encoding="utf-8")
        train_log.setFormatter(
            consoles[0].formatter if consoles and consoles[0].formatter else logging.Formatter(_FORMAT)
        )
        self.files = [train_log, _FailedSamples(path / "failed_samples.jsonl")]
        for file in self.files:
            self.logger.addHandler(file)

    def write(self, line: str, *, name: str = "slime.progress") -> None:
        """A line the run prints itself (a step line, an eval line), into ``train.log`` too, as an INFO record of
        logger ``name`` (the console already has it: printed, not logged)."""
        if self.files:
            self.files[0].handle(
                logging.makeLogRecord({"name": name, "levelno": logging.INFO, "levelname": "INFO", "msg": line})
            )

    def flush_repeats(self, where: str = "this step") -> None:
        """The count line of each warning repeated since the last call (see ``CollapseRepeats``)."""
        self.collapse.flush(where)

    def close(self) -> None:
        """Flush the repeats, remove the handlers and the filter, close the files. Idempotent."""
        self.collapse.flush("before the end")
        for handler in self.collapse.handlers:
            handler.removeFilter(self.collapse)
        self.collapse.handlers = []
        for handler in self.files:
            self.logger.removeHandler(handler)
            handler.close()
        self.files = []
