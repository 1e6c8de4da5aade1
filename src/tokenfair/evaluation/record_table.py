"""A run's per-request records as columns: one array per field instead of a dict per request.

The fields and their order are ``metrics.request_record``'s, plus any *extra* column (the
fleet's ``replica``).  Numbers are numpy arrays (float64, int64); a field that may be None
has a ``present`` mask beside its values; tenant, class and status are codes into their
names (first-seen order); request ids and reasons stay Python strings.  About 150 bytes a
request instead of about 1 KB a dict, and the metrics read whole columns
(:mod:`.table_metrics`).  ``rows()`` gives the records as the dicts ``request_record``
makes (same keys, same order, same Python types); ``write_jsonl`` writes requests.jsonl
byte for byte as ``json.dumps`` of those dicts would, a chunk at a time.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import IO, Any, Iterable, Iterator, Sequence

import numpy as np

from ..core.request import Request

FIELDS = ("request_id", "tenant", "class", "arrival_s", "scheduled_s", "first_token_s", "finish_s",
          "prompt_tokens", "output_tokens", "status", "reason", "preemptions", "deadline_s",
          "recomputed_tokens", "swapped_bytes", "predicted_output_tokens", "max_wait_s",
          "ttft_slo_s", "tpot_slo_s")
CATEGORIES = ("tenant", "class", "status")          # code arrays into name lists
STRINGS = ("request_id", "reason")                  # Python lists of str
NULLABLE_FLOATS = ("scheduled_s", "first_token_s", "finish_s", "deadline_s", "max_wait_s",
                   "ttft_slo_s", "tpot_slo_s")
INTS = ("prompt_tokens", "output_tokens", "preemptions", "recomputed_tokens", "swapped_bytes",
        "predicted_output_tokens")
# the Request attribute each field is read from
_ATTRS = {"class": "klass", "output_tokens": "num_output", "preemptions": "num_preemptions",
          "predicted_output_tokens": "predicted_output"}
JSONL_CHUNK = 1 << 13                               # records encoded per write


@dataclass(eq=False)
class RecordTable:
    """Invariants: every array and list has ``len(self)`` entries; ``codes[f][i]`` indexes
    ``names[f]``; ``values[f][i]`` is meaningless where ``present[f][i]`` is False (None)."""
    n: int
    strings: dict[str, list[str]]
    codes: dict[str, np.ndarray]                     # int32 codes per category field
    names: dict[str, list[str]]
    values: dict[str, np.ndarray]                    # float64 / int64 columns
    present: dict[str, np.ndarray] = field(default_factory=dict)   # bool, for nullable fields
    extra: tuple[str, ...] = ()                      # extra int-or-None columns, after FIELDS

    def __len__(self) -> int:
        return self.n

    def __eq__(self, other: object) -> bool:
        """Equal records: the same fields and the same values, row by row."""
        if not isinstance(other, RecordTable):
            return NotImplemented
        return self.keys == other.keys and self.rows() == other.rows()

    __hash__ = None     # type: ignore[assignment]  # mutable, compared by value

    @property
    def keys(self) -> tuple[str, ...]:
        return FIELDS + self.extra

    # -- building ------------------------------------------------------------------------
    @classmethod
    def from_requests(cls, requests: Sequence[Request],
                      extra: dict[str, Sequence[int | None]] | None = None) -> "RecordTable":
        return cls.from_columns(len(requests), _LazyColumns(requests), extra, ints_may_be_none=False)

    @classmethod
    def from_dicts(cls, records: Iterable[dict[str, Any]]) -> "RecordTable":
        recs = records if isinstance(records, list) else list(records)
        return cls.from_columns(len(recs), {f: list(map(itemgetter(f), recs)) for f in FIELDS})

    @classmethod
    def from_columns(cls, n: int, cols: "dict[str, list[Any]] | _LazyColumns",
                     extra: dict[str, Sequence[int | None]] | None = None,
                     ints_may_be_none: bool = True) -> "RecordTable":
        """``cols``: each field's values in record order (``status``: a Status or its value).
        ``ints_may_be_none``: an integer field may hold None (a load client's record has no
        predicted output); a Request's never do."""
        strings = {f: cols[f] for f in STRINGS}         # each column read once, then let go
        codes, names = {}, {}
        for f in CATEGORIES:
            col = cols[f]
            seen = list(dict.fromkeys(col))                # first-seen order
            lookup = {v: i for i, v in enumerate(seen)}
            codes[f] = np.fromiter(map(lookup.__getitem__, col), np.int32, n)
            names[f] = [getattr(v, "value", v) for v in seen] if f == "status" else seen
        values: dict[str, np.ndarray] = {"arrival_s": np.array(cols["arrival_s"], dtype=np.float64)}
        present: dict[str, np.ndarray] = {}
        for f in NULLABLE_FLOATS:
            values[f], present[f] = _nullable_floats(cols[f])
        for f in INTS:
            col = cols[f]
            if ints_may_be_none and any(v is None for v in col):
                values[f], present[f] = _nullable_ints(col)
            else:
                values[f] = np.array(col, dtype=np.int64)
        for f, col in (extra or {}).items():
            values[f], present[f] = _nullable_ints(col)
        return cls(n, strings, codes, names, values, present, tuple(extra or ()))

    # -- reading ---------------------------------------------------------------------------
    def column(self, f: str) -> list[Any]:
        """Field ``f`` as the Python values the records hold (None where absent)."""
        if f in self.strings:
            return self.strings[f]
        if f in self.codes:
            names = self.names[f]
            return [names[c] for c in self.codes[f].tolist()]
        vals = self.values[f].tolist()
        pres = self.present.get(f)
        if pres is None:
            return vals
        return [v if p else None for v, p in zip(vals, pres.tolist())]

    def rows(self, index: Sequence[int] | np.ndarray | None = None) -> list[dict[str, Any]]:
        """The records as dicts (all, or those at ``index``)."""
        part = self if index is None else self.take(np.asarray(index, dtype=np.int64))
        keys = part.keys
        return [dict(zip(keys, t)) for t in zip(*(part.column(f) for f in keys))]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for lo in range(0, self.n, JSONL_CHUNK):
            yield from self.rows(np.arange(lo, min(self.n, lo + JSONL_CHUNK)))

    def take(self, index: np.ndarray) -> "RecordTable":
        """The rows at ``index`` (in that order), as a table."""
        il = index.tolist()
        return RecordTable(len(il), {f: [s[i] for i in il] for f, s in self.strings.items()},
                           {f: c[index] for f, c in self.codes.items()}, self.names,
                           {f: v[index] for f, v in self.values.items()},
                           {f: p[index] for f, p in self.present.items()}, self.extra)

    # -- requests.jsonl ----------------------------------------------------------------------
    def write_jsonl(self, fh: IO[str]) -> None:
        """One ``json.dumps(record)`` line per record, ``JSONL_CHUNK`` records at a time."""
        template = "{" + ", ".join(json.dumps(k) + ": %s" for k in self.keys) + "}\n"
        encoded_names = {f: np.array([encode_basestring_ascii(v) for v in self.names[f]], dtype=object)
                         for f in CATEGORIES}
        for lo in range(0, self.n, JSONL_CHUNK):
            hi = min(self.n, lo + JSONL_CHUNK)
            parts = [self._encoded(f, lo, hi, encoded_names) for f in self.keys]
            fh.write("".join([template % t for t in zip(*parts)]))

    def _encoded(self, f: str, lo: int, hi: int, encoded_names: dict[str, np.ndarray]) -> list[str]:
        """Field ``f`` of rows ``lo:hi`` as JSON texts."""
        if f in self.strings:
            return list(map(encode_basestring_ascii, self.strings[f][lo:hi]))
        if f in self.codes:
            return encoded_names[f][self.codes[f][lo:hi]].tolist()
        vals = self.values[f][lo:hi]
        out = _float_json(vals) if vals.dtype.kind == "f" else np.array(list(map(int.__repr__, vals.tolist())), dtype=object)
        pres = self.present.get(f)
        if pres is not None:
            out[~pres[lo:hi]] = "null"
        return out.tolist()


class _LazyColumns:
    """A field's values read from the requests when asked (one list alive at a time)."""

    def __init__(self, requests: Sequence[Request]) -> None:
        self.requests = requests

    def __getitem__(self, f: str) -> list[Any]:
        return list(map(attrgetter(_ATTRS.get(f, f)), self.requests))


def _nullable_floats(col: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    """(values, present): numpy reads None as NaN; a NaN that was a value stays present."""
    vals = np.array(col, dtype=np.float64)
    missing = np.isnan(vals)
    present = ~missing
    if missing.any():
        rows = np.flatnonzero(missing)
        present[rows] = [col[i] is not None for i in rows.tolist()]
        vals[rows[~present[rows]]] = 0.0
    return vals, present


def _nullable_ints(col: Sequence[int | None]) -> tuple[np.ndarray, np.ndarray]:
    present = np.fromiter((v is not None for v in col), bool, len(col))
    return np.array([0 if v is None else v for v in col], dtype=np.int64), present


def _float_json(vals: np.ndarray) -> np.ndarray:
    """``json.dumps`` of each float (an object array of texts): its repr; NaN / Infinity /
    -Infinity as json writes them.  A value repeated through the column (a class's SLO) is
    formatted once."""
    uniq, inverse = np.unique(vals, return_inverse=True)
    if len(uniq) * 4 < len(vals) and not (np.signbit(vals) & (vals == 0)).any():   # -0.0 == 0.0
        return np.array([_one_float(v) for v in uniq.tolist()], dtype=object)[inverse]
    out = np.array(list(map(float.__repr__, vals.tolist())), dtype=object)
    odd = np.flatnonzero(~np.isfinite(vals))
    for i in odd.tolist():
        out[i] = _one_float(float(vals[i]))
    return out


def _one_float(v: float) -> str:
    if math.isfinite(v):
        return float.__repr__(v)
    return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")


def as_table(records: "RecordTable | Iterable[dict[str, Any]]") -> RecordTable:
    return records if isinstance(records, RecordTable) else RecordTable.from_dicts(records)
