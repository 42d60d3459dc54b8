"""What `specrouter soak` measures and says: how each request ended (`Outcome`), the outcomes summed
(`Tally`: requests, endings, errors by status, tokens, latency percentiles), the greedy outputs checked
against each other, durations as people write them, and the verdict and printout of a finished soak."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

UNARY_GREEDY, UNARY_SAMPLED = "unary greedy", "unary sampled"
STREAM_GREEDY, STREAM_SAMPLED = "stream greedy", "stream sampled"
STREAM_CANCELLED, STREAM_DROPPED = "stream cancelled", "stream dropped"
MIXED_KINDS = (UNARY_GREEDY, UNARY_SAMPLED, STREAM_GREEDY, STREAM_SAMPLED)
KINDS = (*MIXED_KINDS, STREAM_CANCELLED, STREAM_DROPPED)

# How a request ended: its own end, or one the client chose; anything else is an error (its gRPC status).
FINISHED, CANCELLED, DISCONNECTED, CUT = "finished", "cancelled", "disconnected", "cut"
OWN_ENDINGS = (CANCELLED, DISCONNECTED, CUT)

CUT_JOIN_S = 30.0             # how long cut clients get to notice before the soak gives up on them


# -- figures --------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between the closest ranks (numpy's default);
    None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_ms(seconds: Sequence[float]) -> dict:
    """p50, p99 and the count of `seconds`, the percentiles in milliseconds."""
    p50, p99 = percentile(seconds, 50), percentile(seconds, 99)
    return {"p50": None if p50 is None else p50 * 1e3, "p99": None if p99 is None else p99 * 1e3,
            "count": len(seconds)}


@dataclass
class Outcome:
    """One request as its client saw it; times in time.monotonic seconds."""

    kind: str
    started: float
    ended: float
    tokens: int = 0
    ending: str = FINISHED           # FINISHED, one of OWN_ENDINGS, or "" for an error
    error: str = ""                  # the gRPC status name of an error
    message: str = ""                # the server's message with it
    first_token_s: float | None = None
    gaps: list[tuple[float, int]] = field(default_factory=list)   # (seconds since the last chunk, its tokens)


class Tally:
    """Outcomes summed: requests by kind, endings, errors by status, tokens, latencies."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.endings: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.first_error: dict[str, str] = {}
        self.tokens = 0
        self.first_token_s: list[float] = []
        self.between_tokens_s: list[float] = []
        self.last_end: float | None = None

    def observe(self, o: Outcome) -> None:
        self.requests[o.kind] += 1
        if o.error:
            self.errors[o.error] += 1
            self.first_error.setdefault(o.error, o.message)
        else:
            self.endings[o.ending] += 1
        self.tokens += o.tokens
        if o.first_token_s is not None:
            self.first_token_s.append(o.first_token_s)
        for gap, tokens in o.gaps:
            self.between_tokens_s.extend([gap / tokens] * tokens)
        self.last_end = o.ended if self.last_end is None else max(self.last_end, o.ended)

    def summary(self, seconds: float) -> dict:
        """The figures over a measurement of `seconds`."""
        return {
            "requests": sum(self.requests.values()),
            "by_kind": {k: self.requests[k] for k in KINDS if self.requests[k]},
            "endings": {e: self.endings[e] for e in (FINISHED, *OWN_ENDINGS)},
            "errors": sum(self.errors.values()),
            "errors_by_status": dict(sorted(self.errors.items())),
            "first_error": dict(sorted(self.first_error.items())),
            "tokens": self.tokens,
            "tokens_per_s": self.tokens / seconds if seconds > 0 else 0.0,
            "first_token_ms": latency_ms(self.first_token_s),
            "between_tokens_ms": latency_ms(self.between_tokens_s),
        }


class GreedyOutputs:
    """Greedy outputs by prompt: each must agree with every other of its prompt (the shorter a prefix of
    the longer), as greedy decoding gives the target's tokens whatever the batch beside it."""

    def __init__(self) -> None:
        self.longest: dict[str, list[int]] = {}
        self.checked = 0
        self.differ: list[str] = []

    def check(self, prompt: str, tokens: Sequence[int]) -> bool:
        known = self.longest.get(prompt)
        self.checked += 1
        if known is None or len(tokens) > len(known):
            self.longest[prompt] = list(tokens)
        n = min(len(tokens), len(known or ()))
        if known is not None and list(tokens[:n]) != known[:n]:
            at = next(i for i in range(n) if tokens[i] != known[i])
            self.differ.append(f"prompt {prompt[:40]!r}: token {at} is {tokens[at]} here, {known[at]} before")
            return False
        return True


# -- durations ----------------------------------------------------------------------------------


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")


def parse_duration(text: str) -> float:
    """Seconds in `90s`, `10m`, `1h`, `1m30s` or a plain number of seconds."""
    spoken = text.strip().lower()
    try:
        return float(spoken)
    except ValueError:
        pass
    parts = _DURATION.findall(spoken)
    if not parts or "".join(n + u for n, u in parts) != spoken:
        raise ValueError(f"{text!r} is not a duration; write it like 90s, 10m, 1h or 1m30s")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def spoken_duration(seconds: float) -> str:
    """`10m`, `1m30s`, `45s`, `2.5s`."""
    if seconds < 60:
        return f"{seconds:g}s"
    m, s = divmod(round(seconds), 60)
    return f"{m}m{s}s" if s else f"{m}m"


# -- the verdict and the printout -----------------------------------------------------------------


def soak_failures(report: dict) -> list[str]:
    """What makes the soak fail, one line each; empty when it held."""
    out = []
    for figures, when in ((report, ""), (report["warmup"], " in the warm-up")):
        if figures["errors"]:
            first = "; ".join(f"{code}: {message}" for code, message in figures["first_error"].items())
            counts = ", ".join(f"{code} {n}" for code, n in figures["errors_by_status"].items())
            out.append(f"{figures['errors']} errors{when} besides the clients' own cancellations ({counts}); "
                       f"first: {first}")
    if not report["endings"][FINISHED]:
        out.append("no request finished")
    cut = report["endings"][CUT] + report["warmup"]["cut"]
    if cut:
        out.append(f"{cut} requests had not finished {spoken_duration(report['settings']['grace_s'])} "
                   "after the deadline and were cancelled")
    busy = {name: n for name, n in report["live_states"].items() if n != 0}
    if busy:
        out.append(f"live states at the end, after {report['release_wait_s']:.1f} s: "
                   + ", ".join(f"{name} {'no answer' if n is None else n}" for name, n in busy.items()))
    if report["greedy_differ"]:
        out.append(f"{len(report['greedy_differ'])} greedy outputs differ from another of their prompt; first: "
                   f"{report['greedy_differ'][0]}")
    limit = report["settings"]["max_rss_growth"]
    for name, row in (report["rss"] or {}).items():
        if row["growth_pct"] is None:
            out.append(f"RSS of {name} not read at the start or the end")
        elif row["growth_pct"] > limit:
            out.append(f"RSS of {name} grew {row['growth_pct']:.1f}% (limit {limit:g}%): "
                       f"{row['start_mib']:.0f} to {row['end_mib']:.0f} MiB")
    for name, code in report["exited"].items():
        out.append(f"{name} exited during the soak with code {code}")
    if report["clients_crashed"]:
        out.append(f"{len(report['clients_crashed'])} clients stopped on an error of their own; first: "
                   f"{report['clients_crashed'][0]}")
    if report["clients_stuck"]:
        out.append(f"{report['clients_stuck']} clients still waited on their calls {CUT_JOIN_S:.0f} s after the cut")
    return out


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f} ms"


def format_soak(report: dict) -> str:
    s = report["settings"]
    where = "a local cluster" if report["local_cluster"] else "the router"
    endings = report["endings"]
    lines = [
        f"soak: {s['clients']} clients ({report['cancelling_clients']} ending streams early) against {where} at "
        f"{report['router']}, {report['seconds']:.0f} s measured after {spoken_duration(s['warmup_s'])} of warm-up",
        f"requests            {report['requests']} ("
        + ", ".join(f"{k} {n}" for k, n in report["by_kind"].items()) + ")",
        f"endings             {endings[FINISHED]} finished; by the clients: {endings[CANCELLED]} cancelled, "
        f"{endings[DISCONNECTED]} disconnected, {endings[CUT]} cut at the end",
        f"errors              {report['errors']}"
        + ("" if not report["errors"] else " (" + ", ".join(f"{c} {n}" for c, n in report["errors_by_status"].items()) + ")"),
        f"greedy outputs      {report['greedy_checked']} checked against their prompt's others, "
        f"{len(report['greedy_differ'])} differ",
        f"throughput          {report['tokens_per_s']:.1f} tokens/s ({report['tokens']} tokens)",
    ]
    for label, key in (("time to first token", "first_token_ms"), ("time between tokens", "between_tokens_ms")):
        d = report[key]
        lines.append(f"{label:<20}p50 {ms(d['p50'])}, p99 {ms(d['p99'])} ({d['count']} samples)")
    states = ", ".join(f"{n} {'no answer' if v is None else v}" for n, v in report["live_states"].items())
    w = report["warmup"]
    lines.append(f"warm-up             {w['requests']} requests (not in the figures above), {w['errors']} errors, "
                 f"{w['cut']} cut")
    lines.append(f"live states at end   {states} (after {report['release_wait_s']:.1f} s)")
    if report["rss"] is None:
        lines.append("RSS                 n/a (a router given by address)")
    else:
        lines.append(f"{'RSS (MiB)':<20}{'start':>8}{'end':>8}{'growth':>9}")
        for name, row in report["rss"].items():
            start = "n/a" if row["start_mib"] is None else f"{row['start_mib']:.1f}"
            end = "n/a" if row["end_mib"] is None else f"{row['end_mib']:.1f}"
            growth = "n/a" if row["growth_pct"] is None else f"{row['growth_pct']:+.1f}%"
            lines.append(f"  {name:<18}{start:>8}{end:>8}{growth:>9}")
    failures = soak_failures(report)
    lines.append("PASS" if not failures else f"FAIL ({len(failures)})")
    return "\n".join(lines)
