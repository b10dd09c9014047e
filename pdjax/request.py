"""Request, its sampling parameters and its timeline: the one record that moves through pdjax.

Pure Python (no jax): the router, the schedulers, the metrics and the simulator all read it.
Every timestamp is seconds on the run's clock (0 = start of the run).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import typing
import zlib


class Status(str, enum.Enum):
  WAITING = "waiting"          # arrived, queued for prefill
  PREFILLING = "prefilling"    # in a prefill batch
  TRANSFERRING = "transferring"  # prefilled, waiting for / in KV transfer to decode
  DECODING = "decoding"        # in a decode instance's running batch
  FINISHED = "finished"
  REJECTED = "rejected"
  FAILED = "failed"
  CANCELLED = "cancelled"      # the client aborted it

  terminal: bool                 # (set on each member below: read for every token of a run)


for _status in Status:
  _status.terminal = _status in (Status.FINISHED, Status.REJECTED, Status.FAILED,
                                 Status.CANCELLED)


class PendingToken(typing.NamedTuple):
  """A step row's input token that is not on the host yet: row `row` of the tokens sampled by
  the step still in flight on the same instance (overlapped scheduling). The instance feeds it
  to the next program straight from the device; the host learns it one step later."""
  row: int


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  temperature: float = 0.0     # 0 means greedy
  max_new_tokens: int = 16
  ignore_eos: bool = False
  seed: int | None = None      # this request's sampling seed (None: derived from its id)
  top_p: float = 1.0           # nucleus sampling: draw from the smallest set of most likely
                               # tokens holding this much mass; 1.0 means no filter


@dataclasses.dataclass(eq=False)   # a request is itself: queues find and remove it by identity
class Request:
  """One generation request and everything measured about it."""

  id: str
  arrival_s: float
  prompt_ids: list[int]
  sampling: SamplingParams = SamplingParams()
  eos_ids: tuple[int, ...] = ()
  tenant: str = ""
  session: str = ""            # multi-turn conversation id (session-sticky routing)
  priority: int = 0
  cache_salt: str = ""         # separates its prefix-cache pages from the tenant's others
  stopped_by_listener: bool = False   # a server's stop string ended it (finish_reason "stop")

  status: Status = Status.WAITING
  reason: str = ""             # why it was rejected / failed
  path: str = ""               # "colocated" | "disaggregated"
  path_reason: dict | None = None   # why (the path policy's inputs and choice: PathChoice.reason)
  output_ids: list[int] = dataclasses.field(default_factory=list)
  token_times: list[float] = dataclasses.field(default_factory=list)
  prefill_instance: str | None = None
  decode_instance: str | None = None
  prefill_start_s: float | None = None
  prefill_end_s: float | None = None
  transfer_bytes: int = 0
  transfer_s: float = 0.0
  transfer_start_s: float | None = None
  transfer_end_s: float | None = None
  transfer_group_ends_s: list[float] = dataclasses.field(default_factory=list)   # streamed:
                                        # each layer group's landing after transfer_start_s
  decode_start_s: float | None = None   # joined a decode batch (after transfer if any)
  preemptions: int = 0                  # times its KV was dropped and recomputed
  num_computed_tokens: int = 0          # of prefill_tokens, already in the KV cache
  cached_tokens: int = 0                # prompt tokens served from the prefix cache
  decode_cached_tokens: int = 0         # prompt tokens the decode instance held (not moved)
  fallbacks: list[str] = dataclasses.field(default_factory=list)   # recoveries, in order
  finish_s: float | None = None

  @property
  def prompt_len(self) -> int:
    return len(self.prompt_ids)

  @property
  def output_len(self) -> int:
    return len(self.output_ids)

  @property
  def max_len(self) -> int:
    """Tokens the KV cache must hold for this request at the most."""
    return self.prompt_len + self.sampling.max_new_tokens

  @property
  def prefill_len(self) -> int:
    """Tokens a (re)prefill must put in the cache: the prompt, plus all generated tokens but the
    last after a preemption (the last one is the next decode step's input)."""
    return self.prompt_len + max(len(self.output_ids) - 1, 0)

  @functools.cached_property   # (id and sampling are never reassigned; read every step)
  def sampling_seed(self) -> int:
    """The request's part of every sampled token's randomness: its own `seed`, else a stable
    hash of its id. With the run seed and the token's position it fixes the token's noise, so
    a request samples the same tokens however it is batched or wherever it runs."""
    if self.sampling.seed is not None:
      return self.sampling.seed & 0x7FFFFFFF
    return zlib.crc32(self.id.encode()) & 0x7FFFFFFF

  @property
  def prefill_tokens(self) -> list[int]:
    return (list(self.prompt_ids) + self.output_ids)[:self.prefill_len]

  @property
  def ttft_s(self) -> float | None:
    return self.token_times[0] - self.arrival_s if self.token_times else None

  @property
  def transfer_exposed_s(self) -> float | None:
    """The part of the KV transfer after the prefill's compute ended (the gap before the
    decode instance may start): all of it when sent after prefill, the tail of the last layer
    group when streamed (kv.stream_layers). None without a landed transfer."""
    if self.transfer_end_s is None or self.prefill_end_s is None:
      return None
    start = self.transfer_start_s if self.transfer_start_s is not None else self.prefill_end_s
    return max(self.transfer_end_s - max(start, self.prefill_end_s), 0.0)

  @property
  def e2e_s(self) -> float | None:
    return self.token_times[-1] - self.arrival_s if self.token_times else None

  @property
  def tpot_s(self) -> float | None:
    """(E2E - TTFT) / (output_len - 1); None for fewer than two tokens."""
    n = len(self.token_times)
    if n < 2:
      return None
    return (self.token_times[-1] - self.token_times[0]) / (n - 1)

  @property
  def itl_s(self) -> list[float]:
    t = self.token_times
    return [b - a for a, b in zip(t, t[1:])]

  @property
  def finish_reason(self) -> str | None:
    """Why a finished request stopped: "stop" (it generated a stop token, counted unless
    ignore_eos, or a server's stop string ended it) or "length" (max_new_tokens); None until
    it finished."""
    if self.status is not Status.FINISHED:
      return None
    if self.stopped_by_listener:
      return "stop"
    stopped = (not self.sampling.ignore_eos and bool(self.output_ids)
               and self.output_ids[-1] in self.eos_ids)
    return "stop" if stopped else "length"

  def fresh_copy(self) -> "Request":
    """The request as it arrives (what a workload made), with none of a run's state: another
    run serves it from scratch. The prompt ids are shared (never modified)."""
    return Request(id=self.id, arrival_s=self.arrival_s, prompt_ids=self.prompt_ids,
                   sampling=self.sampling, eos_ids=self.eos_ids, tenant=self.tenant,
                   session=self.session, priority=self.priority, cache_salt=self.cache_salt)

  def add_token(self, token: int, now_s: float) -> bool:
    """Appends a generated token; returns True when the request is done (EOS or length)."""
    self.output_ids.append(int(token))
    self.token_times.append(now_s)
    if len(self.output_ids) >= self.sampling.max_new_tokens:
      return True
    return (not self.sampling.ignore_eos) and int(token) in self.eos_ids

  def finish(self, status: Status, now_s: float, reason: str = "") -> None:
    assert status.terminal, status
    assert not self.status.terminal, f"request {self.id} already {self.status.value}"
    self.status = status
    self.reason = reason
    self.finish_s = now_s

  def to_record(self) -> dict:
    """The requests.jsonl line (contract: field names are relied on by checks)."""
    return {
        "id": self.id,
        "status": self.status.value,
        "reason": self.reason,
        "prompt_len": self.prompt_len,
        "output_ids": list(self.output_ids),
        "arrival_s": self.arrival_s,
        "ttft_s": self.ttft_s,
        "tpot_s": self.tpot_s,
        "e2e_s": self.e2e_s,
        "path": self.path,
        "path_reason": self.path_reason,
        "prefill_instance": self.prefill_instance,
        "decode_instance": self.decode_instance,
        "transfer_bytes": self.transfer_bytes,
        "transfer_s": self.transfer_s,
        "transfer_exposed_s": self.transfer_exposed_s,
        "tenant": self.tenant,
        "cached_tokens": self.cached_tokens,
        "decode_cached_tokens": self.decode_cached_tokens,
        "session": self.session,
        "prefill_start_s": self.prefill_start_s,
        "prefill_end_s": self.prefill_end_s,
        "transfer_start_s": self.transfer_start_s,
        "transfer_end_s": self.transfer_end_s,
        "transfer_group_ends_s": list(self.transfer_group_ends_s),
        "decode_start_s": self.decode_start_s,
        "finish_s": self.finish_s,
        "preemptions": self.preemptions,
        "fallbacks": list(self.fallbacks),
    }
