"""Prometheus metrics of the OpenAI-compatible server: vLLM's metric names with a `pdjax:`
prefix (pdjax:time_to_first_token_seconds, pdjax:num_requests_running, ...), so a vLLM
dashboard reads them. Every metric carries `model_name`; per-instance ones `tier` (the
instance's role) and `instance`.

Two sources, two ways of counting:
  * `ServerMetrics.request_finished(req)`, once per request that reached a terminal state:
    the latency histograms (FINISHED requests only, as summary.json's percentiles: TTFT and
    queue time by prefill instance, TPOT and ITL by decode instance, E2E by path) and the
    counters of requests by terminal status and of successes by finish reason.
  * `ServerMetrics.update(engine_state(driver))`, a snapshot of the driver: a custom collector
    exposes the gauges and the driver's cumulative numbers (preemptions, transfer failures,
    fallbacks, role switches, prefix-cache tokens) straight from the latest snapshot, so a
    scrape shows exactly the snapshot's value however often update runs (no double counting;
    a counter drops only when a snapshot comes from a new driver, which Prometheus reads as a
    counter reset). The KV-transfer histograms are folded from the driver's transfer list,
    which it only appends to: each snapshot carries the entries past the last one folded (a
    shorter list means a new driver: they are rebuilt from it), so a scrape's cost does not
    grow with the run. Prefix-cache tokens and fallbacks are counted by the driver when they
    happen (scheduler/tally.py): they never decrease.

Host logic only (no jax): reads pdjax.request and the driver's plain attributes.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import threading

import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from pdjax.request import Status

# vLLM-like buckets (seconds, bytes).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
               20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0)
TRANSFER_S_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                      0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TRANSFER_BYTES_BUCKETS = tuple(float(2 ** 16 * 4 ** i) for i in range(10))   # 64 KiB .. 16 GiB
TERMINAL = tuple(s.value for s in Status if s.terminal)   # finished|rejected|failed|cancelled


@dataclasses.dataclass
class InstanceState:
  """One instance at scrape time. prefix_queries / prefix_hits: cumulative prefix-cache
  lookups in TOKENS, as vLLM's prefix_cache_queries/hits: prompt tokens of the requests first
  prefilled here / of those served from its cache (0 without a cache)."""
  name: str
  role: str
  running: int
  waiting: int
  kv_pages_used: int
  kv_pages_total: int
  prefix_queries: int
  prefix_hits: int


@dataclasses.dataclass
class EngineState:
  """The driver at scrape time. transfers: the driver's transfer records {"bytes",
  "seconds", "ok"} (an append-only list) from index transfers_first on (0: the whole list, a
  collector rebuilds its histograms from it); preemptions / role_switches: totals so far;
  fallbacks: fallback kind -> requests that took it (summary.json's faults.fell_back)."""
  instances: list[InstanceState]
  preemptions: int
  transfers: list[dict]
  role_switches: int
  fallbacks: dict[str, int]
  transfers_first: int = 0


def engine_state(driver, transfers_since: int = 0) -> EngineState:
  """Snapshot of a pdjax.scheduler.driver.Driver (call it on the driver's own thread, e.g.
  through Inbox.call). It reads driver.workers, .tally (prefix-cache tokens and fallbacks,
  counted when they happened), .transfers from index `transfers_since` on (what the
  collector has not folded yet: a scrape costs what is new, not the run's length; a list
  shorter than that is a new driver's, read whole), .preemptions and .role_switches."""
  transfers = driver.transfers
  first = transfers_since if transfers_since <= len(transfers) else 0
  new = list(transfers[first:])   # a SpilledList reads only the batches from `first` on
  tally = driver.tally.snapshot()
  instances = []
  for w in driver.workers:
    instances.append(InstanceState(
        name=w.name, role=w.role, running=len(w.running), waiting=len(w.waiting),
        kv_pages_used=w.tables.num_used_pages, kv_pages_total=w.total_pages(),
        prefix_queries=tally.prefix_queries[w.name], prefix_hits=tally.prefix_hits[w.name]))
  return EngineState(instances=instances, preemptions=int(driver.preemptions),
                     transfers=new, role_switches=len(driver.role_switches),
                     fallbacks=dict(sorted(tally.fallbacks.items())), transfers_first=first)


class _Buckets:
  """A histogram's state (per-bucket counts, sum) for a custom collector."""

  def __init__(self, bounds):
    self.bounds, self.counts, self.sum = tuple(bounds), [0] * (len(bounds) + 1), 0.0

  def observe(self, value: float) -> None:
    self.counts[bisect.bisect_left(self.bounds, value)] += 1   # le: value <= bound
    self.sum += value

  def family(self, name: str, doc: str, model_name: str) -> HistogramMetricFamily:
    f = HistogramMetricFamily(name, doc, labels=["model_name"])
    cumulative = list(itertools.accumulate(self.counts))
    les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
    f.add_metric([model_name], list(zip(les, cumulative)), self.sum)
    return f


class _EngineCollector:
  """Exposes the latest EngineState: gauges, counters equal to its cumulative numbers, and
  the KV-transfer histograms folded incrementally from its transfer list."""

  def __init__(self, model_name: str):
    self.model_name = model_name
    self._lock = threading.Lock()
    self._state: EngineState | None = None
    self._reset_transfers()

  def _reset_transfers(self) -> None:
    self._seen, self._failures = 0, 0
    self._seconds, self._bytes = _Buckets(TRANSFER_S_BUCKETS), _Buckets(TRANSFER_BYTES_BUCKETS)

  def transfers_seen(self) -> int:
    with self._lock:
      return self._seen

  def update(self, state: EngineState) -> None:
    with self._lock:
      first = state.transfers_first
      if first == 0:                  # the whole list (a new driver's, perhaps): rebuilt
        self._reset_transfers()
      elif first > self._seen:
        raise ValueError(f"a snapshot from transfer {first} on; {self._seen} folded so far")
      for t in state.transfers[self._seen - first:]:   # (a concurrent scrape folded some)
        if t["ok"]:
          self._seconds.observe(float(t["seconds"]))
          self._bytes.observe(float(t["bytes"]))
        else:
          self._failures += 1
      self._seen = max(self._seen, first + len(state.transfers))
      self._state = state

  def collect(self):
    """The families of the latest snapshot (before the first: counters at 0, no instances)."""
    with self._lock:
      state = self._state or EngineState([], 0, [], 0, {})
      failures, seconds, nbytes = self._failures, self._seconds, self._bytes
    m, per = self.model_name, ["model_name", "tier", "instance"]
    running = GaugeMetricFamily("pdjax:num_requests_running",
                                "Requests in the instance's running (decode) batch.", labels=per)
    waiting = GaugeMetricFamily("pdjax:num_requests_waiting",
                                "Requests queued on the instance for (re)prefill.", labels=per)
    usage = GaugeMetricFamily("pdjax:kv_cache_usage_perc",
                              "KV-cache usage, 0..1: pages sequences hold / pages in the pool.",
                              labels=per)
    queries = CounterMetricFamily("pdjax:prefix_cache_queries",
                                  "Prompt tokens looked up in the prefix cache.", labels=per)
    hits = CounterMetricFamily("pdjax:prefix_cache_hits",
                               "Prompt tokens served from the prefix cache.", labels=per)
    for i in state.instances:
      labels = [m, i.role, i.name]
      running.add_metric(labels, i.running)
      waiting.add_metric(labels, i.waiting)
      usage.add_metric(labels, i.kv_pages_used / i.kv_pages_total if i.kv_pages_total else 0.0)
      queries.add_metric(labels, i.prefix_queries)
      hits.add_metric(labels, i.prefix_hits)
    fallbacks = CounterMetricFamily("pdjax:request_fallbacks",
                                    "Requests that took a fallback, by kind.",
                                    labels=["model_name", "kind"])
    for kind, n in sorted(state.fallbacks.items()):
      fallbacks.add_metric([m, kind], n)
    out = [running, waiting, usage, queries, hits, fallbacks]
    for name, doc, value in [
        ("pdjax:num_preemptions", "Preemptions (KV dropped, recomputed later).",
         state.preemptions),
        ("pdjax:kv_transfer_failures", "Failed KV-transfer attempts.", failures),
        ("pdjax:role_switches", "Instances moved between the prefill and decode tiers.",
         state.role_switches)]:
      out.append(CounterMetricFamily(name, doc, labels=["model_name"]))
      out[-1].add_metric([m], value)
    out.append(seconds.family("pdjax:kv_transfer_seconds",
                              "Duration of successful KV transfers.", m))
    out.append(nbytes.family("pdjax:kv_transfer_bytes",
                             "Bytes of successful KV transfers (_sum: all bytes moved).", m))
    return out

  describe = collect   # the registry checks names against other collectors' at register()


class ServerMetrics:
  """The server's metrics in one registry (default: a private CollectorRegistry; pass
  prometheus_client.REGISTRY to add them to the process-wide one). Thread-safe."""

  def __init__(self, registry: prometheus_client.CollectorRegistry | None = None,
               model_name: str = ""):
    self.registry = prometheus_client.CollectorRegistry() if registry is None else registry
    self.model_name = model_name
    self._tiers: dict[str, str] = {}   # instance -> role, from the latest snapshot

    def hist(name, doc, labels, buckets):
      return prometheus_client.Histogram(name, doc, ["model_name", *labels], buckets=buckets,
                                         registry=self.registry)

    self.ttft = hist("pdjax:time_to_first_token_seconds", "Arrival to first token.",
                     ["tier", "instance"], TTFT_BUCKETS)
    self.queue = hist("pdjax:request_queue_time_seconds", "Arrival to prefill start.",
                      ["tier", "instance"], TTFT_BUCKETS)
    self.tpot = hist("pdjax:time_per_output_token_seconds",
                     "(E2E - TTFT) / (output tokens - 1).", ["tier", "instance"], TPOT_BUCKETS)
    self.itl = hist("pdjax:inter_token_latency_seconds", "Gaps between consecutive tokens.",
                    ["tier", "instance"], TPOT_BUCKETS)
    self.e2e = hist("pdjax:e2e_request_latency_seconds", "Arrival to last token.", ["path"],
                    E2E_BUCKETS)
    self.success = prometheus_client.Counter(
        "pdjax:request_success", "Finished requests, by finish reason (stop | length).",
        ["model_name", "finished_reason"], registry=self.registry)
    self.terminal = prometheus_client.Counter(
        "pdjax:requests_terminal", "Requests that reached a terminal state, by status.",
        ["model_name", "status"], registry=self.registry)
    for reason in ("stop", "length"):
      self.success.labels(model_name, reason)
    for status in TERMINAL:
      self.terminal.labels(model_name, status)
    self._engine = _EngineCollector(model_name)
    self.registry.register(self._engine)

  def _tier(self, instance: str, guess: str) -> str:
    """The instance's role in the latest snapshot; `guess` (from the request's path) before
    the first one."""
    return self._tiers.get(instance, guess)

  def request_finished(self, req) -> None:
    """Observes a request that reached a terminal state (histograms, success/failure counters
    by status); call it once per request. Latencies are observed for FINISHED requests only."""
    if not req.status.terminal:
      raise ValueError(f"request {req.id} is not terminal ({req.status.value})")
    m = self.model_name
    self.terminal.labels(m, req.status.value).inc()
    if req.status is not Status.FINISHED:
      return
    self.success.labels(m, req.finish_reason).inc()
    disagg = req.path == "disaggregated"
    p = req.prefill_instance or ""
    p_tier = self._tier(p, "prefill" if disagg else "colocated")
    d = req.decode_instance or p
    d_tier = self._tier(d, "decode" if disagg else "colocated")
    if req.ttft_s is not None:
      self.ttft.labels(m, p_tier, p).observe(req.ttft_s)
    if req.prefill_start_s is not None:
      self.queue.labels(m, p_tier, p).observe(req.prefill_start_s - req.arrival_s)
    if req.tpot_s is not None:
      self.tpot.labels(m, d_tier, d).observe(req.tpot_s)
    gaps = req.itl_s
    if gaps:
      itl = self.itl.labels(m, d_tier, d)
      for g in gaps:
        itl.observe(g)
    if req.e2e_s is not None:
      self.e2e.labels(m, req.path).observe(req.e2e_s)

  def transfers_seen(self) -> int:
    """Transfer records folded into the histograms so far (engine_state's transfers_since)."""
    return self._engine.transfers_seen()

  def update(self, state: EngineState) -> None:
    """Sets gauges and counters from a snapshot (counters take the snapshot's values)."""
    self._tiers = {i.name: i.role for i in state.instances}
    self._engine.update(state)

  def render(self) -> tuple[bytes, str]:
    """(body, content type) for GET /metrics."""
    return prometheus_client.generate_latest(self.registry), prometheus_client.CONTENT_TYPE_LATEST
