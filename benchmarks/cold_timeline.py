"""Where the TTFT of requests without a kvtier hit goes, per mode of one ``kvtier bench``.

Reads the timeline a bench run wrote (``KVTIER_TIMELINE=PATH kvtier bench ...``: every
engine process appends to PATH; each mode is one process) and the run's
``requests.json``. A request is *cold* when kvtier served none of its tokens (no hit
sources), in any mode. For each mode and each cold request, its TTFT (``runner.add`` to
``runner.first_token``) is split over the engine steps it spans:

- ``sched``: from a step's start to the worker's ``bind`` (scheduling: kvtier's lookups
  and ``build_connector_meta`` included);
- ``stores``: stores kept from the previous step, run at ``bind`` (``worker.stores``);
- ``loads``: the worker's ``start_loads`` (``worker.loads_done``: sync loads, flushes,
  async loads queued; vLLM 0.32 calls it before the forward only when the step has sync
  loads, after it otherwise);
- ``forward``: the rest from ``bind`` to ``wait_for_save`` (the model);
- ``after``: from ``wait_for_save`` to the step's end (stores ran there before they
  moved to the next step's start; the transfer results, sampling, output);
- ``copies``: time kvtier's copy threads ran (``copy.start`` .. ``copy.end`` off the
  engine's thread) during the step;
- ``queued``: from the request's arrival to the start of the first step it is in.

A baseline engine has no worker events: its whole step counts as ``forward``.

Sums per mode over the cold requests, and each mode's difference to the baseline.
Run: ``.venv/bin/python benchmarks/cold_timeline.py TIMELINE REQUESTS_JSON [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from typing import Any

from common import format_table, write_json

PARTS = ("queued", "sched", "stores", "loads", "forward", "after", "copies")


def read(path: str) -> dict[int, list[dict[str, Any]]]:
    """Events by process, in time order."""
    by_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                ev = json.loads(line)
                by_pid[ev["pid"]].append(ev)
    for evs in by_pid.values():
        evs.sort(key=lambda e: e["t"])
    return by_pid


def steps_of(evs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Each engine step's marks (times) and kvtier's durations in it (seconds)."""
    steps: list[dict[str, float]] = []
    cur: dict[str, float] | None = None
    copies: dict[int, float] = {}
    for e in evs:
        ev = e["ev"]
        if ev == "copy.start" and e.get("thread", "").startswith("kvtier-"):
            copies[e["job"]] = e["t"]
        elif ev == "copy.end" and e["job"] in copies:
            t0 = copies.pop(e["job"])
            if cur is not None:
                cur["copies"] = cur.get("copies", 0.0) + e["t"] - max(t0, cur["start"])
        if ev == "runner.step_start":
            cur = {"start": e["t"]}
        elif cur is None:
            continue
        elif ev == "worker.bind":
            cur["bind"] = e["t"]
        elif ev == "worker.stores":
            cur["stores"] = cur.get("stores", 0.0) + e.get("seconds", 0.0)
        elif ev == "worker.loads_done":
            cur["loads"] = cur.get("loads", 0.0) + e.get("seconds", 0.0)
        elif ev == "worker.wait_for_save":
            cur["save"] = e["t"]
        elif ev == "runner.step_end":
            cur["end"] = e["t"]
            steps.append(cur)
            cur = None
    return steps


def split(step: dict[str, float]) -> dict[str, float]:
    """A step's phases in seconds (module docstring)."""
    s, end = step["start"], step["end"]
    if "bind" not in step or "save" not in step:  # no kvtier in this engine
        return {"sched": 0.0, "stores": 0.0, "loads": 0.0, "forward": end - s, "after": 0.0}
    stores, loads = step.get("stores", 0.0), step.get("loads", 0.0)
    return {
        "sched": step["bind"] - s,
        "stores": stores,
        "loads": loads,
        "forward": step["save"] - step["bind"] - stores - loads,
        "after": end - step["save"],
        "copies": step.get("copies", 0.0),
    }


def cold_ids(requests: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, set[str]]:
    """Per workload: ids no mode served a token of from a tier."""
    out = {}
    for wl, modes in requests.items():
        hot = {r["id"] for reqs in modes.values() for r in reqs.get("requests", reqs) if _hit(r)}
        every = {r["id"] for reqs in modes.values() for r in reqs.get("requests", reqs)}
        out[wl] = every - hot
    return out


def _hit(r: dict[str, Any]) -> bool:
    return sum(r.get("hit_sources", {}).values()) > 0


def analyse(timeline: str, requests_json: str, modes: list[str]) -> dict[str, Any]:
    """Per mode (the engine processes in start order are ``modes``, as the bench runs
    them), the cold requests' TTFT summed and split (module docstring)."""
    with open(requests_json, encoding="utf-8") as f:
        requests = json.load(f)
    cold = set().union(*cold_ids(requests).values())
    out: dict[str, Any] = {}
    engines = [evs for evs in read(timeline).values() if any(e["ev"] == "runner.add" for e in evs)]
    engines.sort(key=lambda evs: evs[0]["t"])
    for mode, evs in zip(modes, engines, strict=False):
        adds = {e["req"]: e["t"] for e in evs if e["ev"] == "runner.add"}
        firsts = {e["req"]: e["t"] for e in evs if e["ev"] == "runner.first_token"}
        steps = steps_of(evs)
        total: dict[str, float] = dict.fromkeys(PARTS, 0.0)
        ttft = 0.0
        n = 0
        for rid, t_add in adds.items():
            if rid not in cold or rid not in firsts:
                continue
            t_first = firsts[rid]
            n += 1
            ttft += t_first - t_add
            span = [st for st in steps if st["end"] > t_add and st["start"] < t_first]
            if span:
                total["queued"] += max(0.0, span[0]["start"] - t_add)
            for st in span:
                for k, v in split(st).items():
                    total[k] += v
        out[mode] = {"cold_requests": n, "ttft_s": ttft, **{f"{k}_s": v for k, v in total.items()}}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("timeline")
    ap.add_argument("requests_json")
    ap.add_argument("--modes", default="baseline,async,sync,auto", help="as given to the bench")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    got = analyse(args.timeline, args.requests_json, args.modes.split(","))
    rows = [
        [m, v["cold_requests"], f"{v['ttft_s'] * 1e3:.0f}"]
        + [f"{v[f'{k}_s'] * 1e3:.0f}" for k in PARTS]
        for m, v in got.items()
    ]
    print(
        format_table(
            ["engine", "cold reqs", "TTFT sum ms", *PARTS],
            rows,
            title="cold requests' TTFT, summed, split over the steps they span (ms)",
        )
    )
    write_json(args.json, {"benchmark": "cold_timeline", "modes": got})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
