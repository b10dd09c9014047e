"""A fake engine for scheduler tests: hand-checkable step costs and tokens, no jax.

Fake prefill takes 0.1 s, fake decode 0.01 s; each result() advances the manual clock by its
step's cost. The token sampled after a sequence reaches length n is 100 + n, whatever the step
(so a prompt of 5 gives 105, 106, 107, ... through prefill, decode or mixed steps alike).
"""


from pdjax.kv.pages import BlockTables
from pdjax.kv.transfer_result import TransferResult
from pdjax.request import Request, SamplingParams
from pdjax.scheduler.driver import DriverOptions
from pdjax.errors import DeviceError
from pdjax.scheduler.instance_queue import InstanceQueue as _InstanceQueue

PREFILL_S, DECODE_S = 0.1, 0.01


class FakePending:
  def __init__(self, clock, seconds, tokens, error=None):
    self.clock, self.seconds, self.tokens, self.error = clock, seconds, tokens, error

  def ready(self):
    return True   # collected in worker order; each result() advances the clock by its step

  def result(self):
    self.clock.advance(self.seconds)
    if self.error:
      raise self.error
    return self.tokens


class FakeInstance:
  def __init__(self, name, clock, num_pages=32, page_size=4, fail_prefill=False):
    self.name, self.clock = name, clock
    self.tables = BlockTables(num_pages, page_size)
    self.fail_prefill = fail_prefill
    self.calls = []

  def prefill(self, seqs):
    self.calls.append(("prefill", [len(s[0]) for s in seqs]))
    error = DeviceError("device lost") if self.fail_prefill else None
    return FakePending(self.clock, PREFILL_S, [100 + s[1] + len(s[0]) for s in seqs], error)

  def decode(self, seqs):
    self.calls.append(("decode", [s[1] for s in seqs]))
    return FakePending(self.clock, DECODE_S, [100 + s[1] + 1 for s in seqs])


OPTS = DriverOptions(token_budget=16, max_prefill_seqs=4, max_decode_batch=4, max_model_len=24,
                     pool_pages=32, page_size=4)


def InstanceQueue(instance, role, max_batch=4):
  return _InstanceQueue(instance, role, max_batch)


def ok_transfer(*_):
  return TransferResult(bytes=1, seconds=0.0)


def _req(i, prompt_len, max_new, arrival=0.0, eos=(), session=""):
  return Request(id=f"r{i}", arrival_s=arrival, prompt_ids=[7] * prompt_len,
                 sampling=SamplingParams(max_new_tokens=max_new), eos_ids=eos,
                 session=session)


