"""A :class:`~tokenfair.serve.jobs.RecordSink` whose file is rotated by size.

When appending a line would take ``path`` past ``max_bytes``, ``path.<keep-1>`` becomes
``path.<keep>`` (the oldest, ``path.<keep>``, is dropped), ..., ``path`` becomes ``path.1``
and a new ``path`` is opened.  A line is never split across files.
:func:`tokenfair.workloads.records.record_files` lists the files oldest first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .jobs import RecordSink

DEFAULT_KEEP_FILES = 5


class RotatingRecordSink(RecordSink):
    def __init__(self, path: str | Path, max_bytes: int, keep_files: int = DEFAULT_KEEP_FILES,
                 keep: int = 100_000) -> None:
        if max_bytes <= 0 or keep_files < 1:
            raise ValueError("records rotation: max size must be > 0 and at least one rotated file kept")
        super().__init__(path, keep)
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.keep_files = keep_files
        self.num_rotations = 0

    def add(self, rec: dict) -> None:
        line = json.dumps(rec) + "\n"
        with self._lock:
            self.items.append(rec)
            if self._fh is None:
                return
            if self._fh.tell() > 0 and self._fh.tell() + len(line) > self.max_bytes:
                self._rotate()
            self._fh.write(line)
            self._fh.flush()

    def _rotate(self) -> None:
        self._fh.close()
        for i in range(self.keep_files, 0, -1):
            src = self.path if i == 1 else self.path.with_name(f"{self.path.name}.{i - 1}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i}"))
        self._fh = self.path.open("a")
        self.num_rotations += 1


def make_record_sink(path: str | Path | None, max_mb: float | None) -> RecordSink:
    """A plain sink, or a rotating one when ``max_mb`` is given (with a path)."""
    if path is None or max_mb is None:
        return RecordSink(path)
    return RotatingRecordSink(path, int(max_mb * 1024 * 1024))
