"""Ray Serve replicas start from any main program: here `python -` (the program on stdin, the mode
that multiprocessing's spawn cannot re-run), with tensor_parallel=2 inside the replica, so the
ranks start from a Ray worker process too. One replica of the tiny preset answers a greedy request.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("ray.serve", reason="the Ray Serve replicas need the [cluster] extra")

from live import free_port  # noqa: E402  (after the importorskip)

from interlock.parallel.process import child_env  # noqa: E402

PROGRAM = """\
import json, sys, time
import httpx, ray
from ray import serve
from interlock.server import ServerConfig
from interlock.server.ray_serve import ReplicaConfig, build_app

port = int(sys.argv[1])
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
try:
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    replicas = ReplicaConfig.fixed(1, cpus_per_replica=0.5, engine_options={"tensor_parallel": 2, "max_batch_size": 2})
    serve.run(build_app("tiny", ServerConfig(model_name="tiny"), replicas), name="interlock", route_prefix="/",
              blocking=False)
    deadline = time.monotonic() + 180
    while serve.status().applications["interlock"].status != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    body = {"model": "tiny", "prompt": "The list of", "max_tokens": 5, "temperature": 0}
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120)
    print("ANSWER", json.dumps({"status": answer.status_code, "body": answer.json()}))
finally:
    serve.shutdown()
    ray.shutdown()
"""


def test_replicas_with_tensor_parallel_start_from_a_program_on_stdin() -> None:
    done = subprocess.run([sys.executable, "-", str(free_port())], input=PROGRAM, env=child_env(),
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("ANSWER"))
    answer = json.loads(line.split(" ", 1)[1])
    assert answer["status"] == 200, answer
    assert answer["body"]["usage"]["completion_tokens"] == 5
    assert answer["body"]["choices"][0]["finish_reason"] == "length"
