"""The Azure reader's row loop (index reads from csv's plain reader) against csv.DictReader's
view of the same file, and the timestamp parser against calendar.timegm."""

from __future__ import annotations

import calendar
import csv
import random
import re

import pytest

from tokenfair.workloads import readers
from tokenfair.workloads.traces import parse_timestamp_ns, read_azure
from tokenfair.workloads.workload import MAX_REQUEST_TOKENS, WorkloadError, parse_number

TRICKY = ("GeneratedTokens,Extra,TIMESTAMP,ContextTokens,Extra\n"      # reordered, a repeated column
          "5,a,2023-11-16 18:15:46.6805900,374,b\n"
          "\n"                                                           # blank: skipped, not counted
          "7,,2024-02-29T23:59:59.123456789123, 12 ,\n"                 # leap day, 12 fraction digits
          "9,x,2023-11-16 18:15:47,400\n"                                # short: the last Extra is missing
          "3,x,2023-11-16 18:15:48.5,400,y,z\n"                         # long
          "3,x,2023-11-31 18:15:48.5,400,y\n"                           # day 31 of November: timegm's rule
          "0,x,2023-11-16 18:15:49.5,400,y\n"                           # zero tokens
          "4,x,2023-11-16 18:15:50.5,\n"                                 # short: ContextTokens empty
          "4\n"                                                          # short: no timestamp
          "4,x,2023-11-16 24:00:00,1,y\n"                               # hour 24
          "2,x, 2023-11-16 18:15:51.0 ,1_000,y\n"                       # spaces, an underscore int
          "2,x,2023-11-16 18:15:52,99999999999999999999,y\n")          # past MAX_REQUEST_TOKENS


def reference_rows(path):
    """(arrival ns, id, prompt, output) or the error, per data row, as DictReader sees them."""
    out = []
    with path.open(newline="") as fh:
        for i, d in enumerate(csv.DictReader(fh), start=2):
            where = f"{path}:{i}"
            try:
                if None in d:
                    raise WorkloadError(f"{where}: more fields than the header has")
                ns = parse_timestamp_ns(d.get("TIMESTAMP") or "", where)
                vals = []
                for f in ("ContextTokens", "GeneratedTokens"):
                    raw = d.get(f)
                    if raw is None or not raw.strip():
                        raise WorkloadError(f"{where}: field {f!r} is missing")
                    vals.append(parse_number(raw.strip(), int, where, f, minimum=1, maximum=MAX_REQUEST_TOKENS))
                out.append((i, ns, f"conv-{i - 2}", *vals))
            except WorkloadError as err:
                out.append((i, str(err)))
    return out


def test_azure_rows_as_dictreader_reads_them(tmp_path):
    p = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    p.write_text(TRICKY)
    ref = reference_rows(p)
    good = [r for r in ref if len(r) == 5]
    bad = [r for r in ref if len(r) == 2]
    assert len(good) == 5 and len(bad) == 6          # the file exercises both paths
    wl = read_azure(conv_path=p, skip_bad_rows=True)
    assert [(s.line, s.message) for s in wl.skipped] == bad
    ns0 = min(r[1] for r in good)
    expect = sorted(((r[2], (r[1] - ns0) / 1e9, r[3], r[4]) for r in good), key=lambda x: x[1])
    assert [(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in wl.rows] == expect
    assert {r.tenant for r in wl.rows} == {"conv"}
    with pytest.raises(WorkloadError, match=re.escape(bad[0][1])):
        read_azure(conv_path=p)


def test_timestamp_equals_timegm():
    rng = random.Random(7)
    for _ in range(2000):
        y, mo, d = rng.randrange(1970, 2100), rng.randrange(1, 13), rng.randrange(1, 32)
        h, mi, s = rng.randrange(24), rng.randrange(60), rng.randrange(61)
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randrange(0, 12)))
        text = f"{y:04d}-{mo:02d}-{d:02d}{rng.choice(' T')}{h:02d}:{mi:02d}:{s:02d}" + (f".{frac}" if frac else "")
        expect = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) * 10**9 + int(frac[:9].ljust(9, "0"))
        assert parse_timestamp_ns(text) == expect, text
    for text in ("2023-13-01 00:00:00", "2023-00-01 00:00:00", "0000-01-01 00:00:00", "2023-01-00 00:00:00",
                 "2023-01-32 00:00:00", "2023-01-01 00:60:00", "2023-01-01 00:00:61"):
        with pytest.raises(WorkloadError, match="not a valid date/time"):
            parse_timestamp_ns(text)


def test_a_parsed_minute_reads_its_rows_by_slicing_to_the_same_value():
    """The fast path (a minute seen before) gives what the full parse gives, and every text
    the full parse rejects is rejected: mutations of timestamps whose minute is cached."""
    rng = random.Random(11)
    base = "2023-11-16 18:15:46.6805900"
    primed = base[:16] + ":00"
    for _ in range(3000):
        chars = list(base)
        for _ in range(rng.randint(0, 3)):
            i = rng.randrange(len(chars) + 1)
            op = rng.random()
            if op < 0.4 and i < len(chars):
                chars[i] = rng.choice("0123456789 .:-T\u00b2x\t")
            elif op < 0.7:
                chars.insert(i, rng.choice("0123456789 .:"))
            elif i < len(chars):
                del chars[i]
        text = "".join(chars)[:rng.randint(15, 32)]
        readers._MINUTE_SECS.clear()
        try:
            full = parse_timestamp_ns(text)
        except WorkloadError as err:
            full = str(err)
        for prime in (primed, text[:16] + ":00.0"):
            try:
                parse_timestamp_ns(prime)              # caches the minute when it parses
            except WorkloadError:
                pass
        try:
            fast = parse_timestamp_ns(text)
        except WorkloadError as err:
            fast = str(err)
        assert fast == full, text

    class CountingPattern:                             # the full parse's regex, counted
        calls = 0

        def match(self, text):
            CountingPattern.calls += 1
            return pattern.match(text)

    pattern, readers._TS = readers._TS, CountingPattern()
    try:
        readers._MINUTE_SECS.clear()
        first = parse_timestamp_ns(primed)
        assert parse_timestamp_ns(base) == first + 46_680_590_000 and CountingPattern.calls == 1
    finally:
        readers._TS = pattern
