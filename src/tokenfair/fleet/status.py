"""``tokenfair fleet status``: the fleet's state as Redis holds it (read only).

Per tenant: weight, tag S, requests dispatched / completed, predicted cost charged, actual
cost served and its share of the fleet's, leases in flight; per gateway: last heartbeat,
live or not, contract, requests running and queued per tenant; per backend: leases."""

from __future__ import annotations

from typing import Any

from .client import DEFAULT_HEARTBEAT_S, LIVE_FACTOR
from .redis_store import fleet_prefix


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _hash(r: Any, key: str) -> dict[str, str]:
    return {_s(k): _s(v) for k, v in r.hgetall(key).items()}


def read_status(r: Any, fleet: str, heartbeat_s: float = DEFAULT_HEARTBEAT_S) -> dict:
    """The fleet's state from a synchronous redis-py client ``r``."""
    p = fleet_prefix(fleet)
    sec, usec = r.time()
    now = float(sec) + float(usec) / 1e6
    tags, weights = _hash(r, f"{p}:S"), _hash(r, f"{p}:w")
    served, charged = _hash(r, f"{p}:served"), _hash(r, f"{p}:charged")
    dispatched, completed = _hash(r, f"{p}:dispatched"), _hash(r, f"{p}:completed")
    total = sum(float(v) for v in served.values())
    tenants = {}
    for t in sorted(set(tags) | set(served)):
        tenants[t] = {"weight": float(weights.get(t, 1.0)), "tag": float(tags.get(t, 0.0)),
                      "dispatched": int(dispatched.get(t, 0)), "completed": int(completed.get(t, 0)),
                      "charged_cost": float(charged.get(t, 0.0)), "served_cost": float(served.get(t, 0.0)),
                      "share": float(served.get(t, 0.0)) / total if total > 0 else 0.0,
                      "leases": int(r.zcount(f"{p}:lt:{t}", now, "+inf"))}
    per_class: dict[str, dict[str, dict]] = {}
    disp_tc = _hash(r, f"{p}:dispatched_tc")
    for key, v in _hash(r, f"{p}:served_tc").items():
        t, _, k = key.partition("|")
        per_class.setdefault(t, {})[k] = {"served_cost": float(v), "dispatched": int(disp_tc.get(key, 0))}
    for t, v in tenants.items():
        v["classes"] = per_class.get(t, {})
    info = _hash(r, f"{p}:gwinfo")
    gateways = {}
    for g, seen in r.zrange(f"{p}:gw", 0, -1, withscores=True):
        g = _s(g)
        contract, running, _ = (info.get(g, "||").split("|") + ["", "", ""])[:3]
        gateways[g] = {"last_heartbeat_s_ago": round(now - float(seen), 3),
                       "live": now - float(seen) <= LIVE_FACTOR * heartbeat_s, "contract": contract,
                       "running": int(running or 0),
                       "queue": {k: int(v) for k, v in _hash(r, f"{p}:q:{g}").items()}}
    backends = {_s(b): int(r.zcount(f"{p}:lb:{_s(b)}", now, "+inf")) for b in sorted(r.smembers(f"{p}:backends"))}
    fleet_contract = r.get(f"{p}:contract")
    return {"fleet": fleet, "contract": _s(fleet_contract) if fleet_contract else None,
            "vtime": float(_s(r.get(f"{p}:V") or 0.0)), "tenants": tenants, "gateways": gateways,
            "backends": backends}


def format_status(st: dict) -> str:
    lines = [f"fleet {st['fleet']}  contract {st['contract'] or '-'}  V {st['vtime']:.4g}", "",
             f"{'tenant':<16}{'weight':>7}{'tag S':>11}{'share':>8}{'served':>11}{'charged':>11}"
             f"{'disp':>7}{'done':>7}{'leases':>7}"]
    for t, v in st["tenants"].items():
        lines.append(f"{t:<16}{v['weight']:>7.3g}{v['tag']:>11.4g}{v['share']:>8.1%}{v['served_cost']:>11.0f}"
                     f"{v['charged_cost']:>11.0f}{v['dispatched']:>7}{v['completed']:>7}{v['leases']:>7}")
        for k, cv in sorted(v.get("classes", {}).items()):
            lines.append(f"  class {k:<24}{cv['served_cost']:>27.0f}{'':>11}{cv['dispatched']:>7}")
    lines += ["", f"{'gateway':<24}{'live':>5}{'seen s ago':>11}{'running':>8}  queued per tenant / contract"]
    for g, v in st["gateways"].items():
        q = ", ".join(f"{k}={n}" for k, n in sorted(v["queue"].items())) or "-"
        lines.append(f"{g:<24}{'yes' if v['live'] else 'no':>5}{v['last_heartbeat_s_ago']:>11.2f}"
                     f"{v['running']:>8}  {q} / {v['contract'] or '-'}")
    lines += ["", f"{'backend':<32}{'leases':>7}"]
    lines += [f"{b:<32}{n:>7}" for b, n in st["backends"].items()]
    return "\n".join(lines)
