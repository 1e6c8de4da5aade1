"""The side-by-side HTML report of ``tokenfair gate`` (one self-contained file, no scripts)."""

from __future__ import annotations

import html
from pathlib import Path

from .gate import Row, TraceGate

_CSS = ("body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}.l{text-align:left}"
        ".pass{background:#dfd}.fail{background:#fdd}.worse{color:#a00}.better{color:#060}.nm{color:#888}")


def _e(x: object) -> str:
    return html.escape(str(x))


def _n(v: float | None) -> str:
    return "<span class=nm>not measured</span>" if v is None else f"{v:.4g}"


def _trend(row: Row) -> str:
    d = row.delta
    if d is None or abs(d) < 1e-12:
        return ""
    worse = d > 0 if row.better == "lower" else d < 0
    return "worse" if worse else "better"


def _rows_html(tg: TraceGate) -> str:
    breached = {c.name for c in tg.checks if not c.passed}
    body = []
    for row in tg.rows:
        d = row.delta
        mark = " class=fail" if f"{row.label} vs baseline" in breached else ""
        body.append(f"<tr{mark}><td class=l>{_e(row.scope)}</td><td class=l>{_e(row.group)}</td>"
                    f"<td class=l>{_e(row.metric)}</td><td>{_n(row.baseline)}</td><td>{_n(row.candidate)}</td>"
                    f"<td class={_trend(row)}>{'' if d is None else f'{d:+.4g}'}</td></tr>")
    return ("<table><tr><th class=l>scope</th><th class=l>group</th><th class=l>metric</th><th>baseline</th>"
            f"<th>candidate</th><th>delta</th></tr>{''.join(body)}</table>")


def _checks_html(tg: TraceGate) -> str:
    body = []
    for c in tg.checks:
        v = "n/a" if c.value is None else f"{c.value:.4g}"
        body.append(f"<tr><td class=l>{_e(c.name)}</td><td>{v}</td><td>{_e(c.op)} {c.limit:.4g}</td>"
                    f"<td class={'pass' if c.passed else 'fail'}>{'PASS' if c.passed else 'FAIL'}</td></tr>")
    return ("<table><tr><th class=l>check</th><th>candidate</th><th>limit</th><th>result</th></tr>"
            f"{''.join(body)}</table>")


def render_gate_html(gates: list[TraceGate], title: str) -> str:
    ok = all(g.passed for g in gates)
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)}</title><style>{_CSS}</style>"
             f"</head><body><h1>{_e(title)} <span class={'pass' if ok else 'fail'}>{'PASS' if ok else 'FAIL'}</span></h1>"]
    for g in gates:
        b, c = g.summaries.get("baseline", {}), g.summaries.get("candidate", {})
        parts.append(f"<h2>{_e(g.name)} <span class={'pass' if g.passed else 'fail'}>"
                     f"{'PASS' if g.passed else 'FAIL'}</span></h2>"
                     f"<p>baseline {_e(b.get('contract_version'))}@{_e(b.get('contract_hash'))} vs candidate "
                     f"{_e(c.get('contract_version'))}@{_e(c.get('contract_hash'))}; policy {_e(c.get('policy'))}, "
                     f"profile {_e(c.get('profile'))}, {c.get('requests', 0)} requests</p>"
                     "<h3>Checks</h3>" + _checks_html(g) + "<h3>Side by side</h3>" + _rows_html(g))
    parts.append("</body></html>")
    return "".join(parts)


def write_gate_report(out_dir: str | Path, gates: list[TraceGate], title: str = "tokenfair gate") -> Path:
    import json
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "gate.html").write_text(render_gate_html(gates, title))
    doc = {"passed": all(g.passed for g in gates),
           "traces": [{"name": g.name, "passed": g.passed, "checks": [c.as_dict() for c in g.checks],
                       "rows": [{"scope": r.scope, "group": r.group, "metric": r.metric, "baseline": r.baseline,
                                 "candidate": r.candidate} for r in g.rows]} for g in gates]}
    (d / "gate.json").write_text(json.dumps(doc, indent=2))
    return d / "gate.html"
