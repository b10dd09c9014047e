"""cluster.launcher = "ray": every instance a Ray actor in its own process (local processes
only), KV pulled actor to actor with jax.experimental.transfer. Greedy tokens equal the
single-process run's, the no-cache reference's and HF's; a decode process killed mid-decode,
an injected kill with a restart, and a pull whose source stopped are all survived with exact
accounting. Each test stops the actors it started; the module stops Ray."""

import json
import os
import signal
import subprocess
import sys

import pytest
import ray

from conftest import tiny_engine_options
from helpers.ray_fixtures import hf_outputs, ray_cluster  # noqa: F401  (fixtures)
from pdjax.runner import serve_requests as serving
from pdjax.engine.cluster import build_instances
from pdjax.faults.injector import FaultInjector
from pdjax.faults.spec import FaultSpec
from pdjax.models.llama_config import config_from_hf
from pdjax.request import Request, SamplingParams, Status

pytestmark = pytest.mark.slow

PROMPTS = [[1, 5, 9, 14, 27, 3, 88], [1, 100], [1] + list(range(10, 60)), [1, 7, 7, 7, 9],
           [1] + list(range(30, 47)), [1, 64, 32, 16, 8, 4, 2]]
MAX_NEW = [12, 9, 16, 20, 5, 14]
ARRIVALS = [0.0, 0.0, 0.01, 0.02, 0.05, 0.1]


def _requests(arrivals=ARRIVALS):
  return [Request(id=f"r{i}", arrival_s=a, prompt_ids=p, eos_ids=(2,),
                  sampling=SamplingParams(max_new_tokens=m))
          for i, (p, m, a) in enumerate(zip(PROMPTS, MAX_NEW, arrivals))]


def _raylets() -> set[str]:
  """Pids of the Ray daemons running on this machine (raylet, gcs_server); under pytest-xdist
  only those under this worker's RAY_TMPDIR (tests/conftest.py), not another worker's."""
  own = os.environ.get("RAY_TMPDIR", "")
  return {pid for pid in os.listdir("/proc") if pid.isdigit()
          and any(d in _cmdline(pid).split(" ")[0] for d in ("/raylet", "/gcs_server"))
          and own in _cmdline(pid)}


def _cmdline(pid: str) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().replace(b"\0", b" ").decode(errors="replace")
  except OSError:
    return ""


def test_cli_ray_run_equals_local_and_stops_its_ray(tmp_path):
  """pdjax.run with cluster.launcher=ray starts its own local Ray, serves the smoke workload
  with one process per instance (KV servers on the node's address, as across hosts), writes
  the same outputs as the one-process run, and leaves no Ray process behind. (Other test
  processes may run Ray clusters of their own meanwhile: only daemons that were not there
  before count.)"""
  before = _raylets()
  outputs = {}
  for launcher in ("local", "ray"):
    workdir = tmp_path / launcher
    proc = subprocess.run(
        [sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
         "--config.mode=disaggregated", f"--config.cluster.launcher={launcher}",
         # one TP1 instance per tier: two actor processes, not four (the points here are
         # the launcher, the cross-process KV and the clean stop; TP2 actors are tested below)
         "--config.cluster.prefill.instances=1", "--config.cluster.prefill.tp=1",
         "--config.cluster.decode.instances=1", "--config.cluster.decode.tp=1",
         "--config.cluster.transfer_host=node",   # the actors' node address, as multi-host
         f"--workdir={workdir}", "--config.progress=False",
         f"--config.compile_cache_dir={os.environ['PDJAX_TEST_COMPILE_CACHE']}"],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (workdir / "requests.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["finished"] * 8
    outputs[launcher] = {r["id"]: r["output_ids"] for r in rows}
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["kv_pages_leaked"] == 0 and summary["kv_transfer"]["count"] == 8
  assert outputs["ray"] == outputs["local"]
  assert _raylets() - before == set()




@pytest.fixture
def build(ray_cluster, hf_llama):
  """build(tiers, **opts) -> actor instances on the HF checkpoint; released after the test."""
  path, _ = hf_llama
  built = []

  def make(tiers, **overrides):
    instances = ray_cluster.build_instances(tiers, config_from_hf(path),
                                            tiny_engine_options(**overrides), checkpoint=path)
    built.extend(instances)
    return instances

  yield make
  for inst in built:   # a stopped process must be running again to die of SIGKILL cleanly
    if inst.alive and _alive(inst.pid):
      os.kill(inst.pid, signal.SIGCONT)
  ray_cluster.release(built)


def _serve(ray_cluster, instances, requests, **kw):
  return serving.serve("disaggregated", instances, requests,
                       transfer_fn=ray_cluster.transfer_fn, **kw)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


@pytest.mark.parametrize("tiers,overlap", [
    ([("prefill", 1, 2), ("decode", 1, 2)], False),
    ([("prefill", 2, 2), ("decode", 2, 1)], True),
], ids=["1p1d-tp2", "2p2d-tp2-to-tp1-overlap"])
def test_actors_match_single_process_and_hf(ray_cluster, build, hf_llama, hf_outputs, tiers,
                                            overlap):
  instances = build(tiers)
  pids = {inst.pid for inst in instances}
  assert len(pids) == len(instances) and os.getpid() not in pids   # a process each
  result = _serve(ray_cluster, instances, _requests(), overlap=overlap)
  assert [r.status for r in result.requests] == [Status.FINISHED] * len(PROMPTS)
  assert [r.output_ids for r in result.requests] == hf_outputs
  assert len(result.transfers) == len(PROMPTS) and all(t["ok"] for t in result.transfers)
  # Exactly the pages each prompt needed crossed processes (page_size 8; k and v, 2 layers,
  # 2 kv heads, head_dim 16, float32: 4096 bytes a page).
  assert [r.transfer_bytes for r in result.requests] == [
      -(-len(p) // 8) * 4096 for p in PROMPTS]
  assert serving.kv_pages_leaked(instances) == 0
  path, _ = hf_llama
  from pdjax.engine.cluster import host_params
  local = build_instances(tiers, config_from_hf(path),
                          host_params(config_from_hf(path), checkpoint=path, seed=0,
                                      dtype="float32"), tiny_engine_options())
  alone = serving.serve("disaggregated", local, _requests(), overlap=overlap)
  assert [r.output_ids for r in alone.requests] == hf_outputs


def test_a_decode_process_killed_mid_decode(ray_cluster, build, hf_outputs):
  """decode-0's process is SIGKILLed just before its third decode step: the step's results
  never come, the driver sees the process gone, recomputes its requests on decode-1."""
  instances = build([("prefill", 1, 2), ("decode", 2, 1)])
  d0 = next(i for i in instances if i.name == "decode-0")
  steps, killed_rows = [], []
  decode = d0.decode

  def decode_then_die(seqs, prev=None):
    steps.append(len(seqs))
    if len(steps) == 3:
      killed_rows.append(len(seqs))
      os.kill(d0.pid, signal.SIGKILL)
    return decode(seqs, prev)

  d0.decode = decode_then_die
  result = _serve(ray_cluster, instances, _requests([0.0] * len(PROMPTS)))
  assert not _alive(d0.pid)
  assert [r.status for r in result.requests] == [Status.FINISHED] * len(PROMPTS)
  assert [r.output_ids for r in result.requests] == hf_outputs
  moved = [r for r in result.requests if "instance_died:recomputed" in r.fallbacks]
  assert len(moved) >= killed_rows[0] > 0
  assert all(r.decode_instance == "decode-1" for r in moved)
  assert result.faults["instances_killed"] == 1 and result.faults["injected"] == {}
  assert serving.kv_pages_leaked(instances) == 0


def test_injected_kill_ends_the_process_and_restart_rejoins_empty(ray_cluster, build,
                                                                  hf_outputs):
  instances = build([("prefill", 1, 2), ("decode", 2, 1)])
  d0 = next(i for i in instances if i.name == "decode-0")
  old_pid = d0.pid
  spec = FaultSpec(kills=(("decode-0", 0.0),), restart_s=0.05)
  result = _serve(ray_cluster, instances, _requests(), injector=FaultInjector(spec))
  assert not _alive(old_pid)
  assert d0.alive and d0.pid != old_pid and _alive(d0.pid)
  assert result.faults["instances_killed"] == 1 and result.faults["instances_restarted"] == 1
  assert [r.status for r in result.requests] == [Status.FINISHED] * len(PROMPTS)
  assert [r.output_ids for r in result.requests] == hf_outputs
  # The restarted process serves: a second run on the same instances uses both decoders.
  again = _serve(ray_cluster, instances, _requests([0.0] * len(PROMPTS)))
  assert [r.output_ids for r in again.requests] == hf_outputs
  assert {r.decode_instance for r in again.requests} == {"decode-0", "decode-1"}
  assert serving.kv_pages_leaked(instances) == 0


@pytest.mark.parametrize("policy", ["retry_then_recompute", "fail"])
def test_a_pull_whose_source_stopped_hits_its_deadline(ray_cluster, build, hf_outputs, policy):
  """r0's KV moves; then prefill-0 is stopped (SIGSTOP) once it has offered r1's pages: r1's
  and r2's pulls never complete, each attempt fails at the 2 s deadline, and the recovery
  policy recomputes them on the decode instance or fails them with the reason."""
  instances = build([("prefill", 1, 2), ("decode", 1, 2)])
  p0 = instances[0]
  sent = []

  def transfer_then_stop(src, src_pages, dst, dst_pages):
    if len(sent) == 1:
      ray.get(sent[0].pull)            # r0 landed
    transfer = ray_cluster.transfer_fn
    offered = transfer.offer(src, src_pages, dst)
    if len(sent) == 1:
      ray.get(offered[1])              # r1's pages offered, then the process stops
      os.kill(p0.pid, signal.SIGSTOP)
    sent.append(transfer.pull(src, dst, dst_pages, offered))
    return sent[-1]

  requests = _requests([0.0, 0.5, 0.5])[:3]
  result = serving.serve("disaggregated", instances, requests, transfer_fn=transfer_then_stop,
                         transfer_retries=1, transfer_backoff_s=0.01,
                         transfer_failure_policy=policy)
  r0, r1, r2 = result.requests
  assert r0.status == Status.FINISHED and r0.output_ids == hf_outputs[0] and not r0.fallbacks
  why = f"prefill-0->decode-0: DeviceError: KV pull from {p0.address} not complete after 2 s"
  if policy == "fail":
    assert [r1.status, r2.status] == [Status.FAILED, Status.FAILED]
    assert {r1.reason, r2.reason} == {f"kv transfer failed after 2 attempt(s): {why}"}
  else:
    assert [r1.output_ids, r2.output_ids] == hf_outputs[1:3]
    assert r1.fallbacks == r2.fallbacks == ["transfer_failed:recompute_on_decode"]
  assert [t["ok"] for t in result.transfers] == [True] + [False] * 4
  assert result.faults["transfer_retries"] == 2
  assert serving.kv_pages_leaked(instances) == 0


def test_ray_result_keeps_device_errors_and_lets_bugs_through(ray_cluster):
  from pdjax.distributed.remote import ray_result
  from pdjax.errors import DeviceError, InstanceLost

  def _raise(kind: str):   # local: pickled by value (the workers cannot import tests/)
    from pdjax.errors import DeviceError
    if kind == "device":
      raise DeviceError("JaxRuntimeError: INTERNAL: boom")
    raise ValueError("a bug in the actor")

  task = ray.remote(num_cpus=0)(_raise)
  with pytest.raises(DeviceError) as e:
    ray_result(task.remote("device"), "decode-0")
  assert str(e.value) == "JaxRuntimeError: INTERNAL: boom"
  assert not isinstance(e.value, InstanceLost)
  with pytest.raises(ValueError) as e:
    ray_result(task.remote("bug"), "decode-0")
  assert not isinstance(e.value, DeviceError) and "a bug in the actor" in str(e.value)
