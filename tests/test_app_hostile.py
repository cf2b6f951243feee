"""Hostile callers against one real server, as the operator starts it for trusted users:
`python app.py --allow-exec --job-timeout 20 --job-memory-mb 2048`, behind a login whose
password, like a cloud key, sits in the server's environment. Driven with raw HTTP (the
two-step `/gradio_api/call/<name>` protocol), since an attacker need not use gradio_client.

One server for the whole module (starting it costs seconds); each test is a few calls.
"""
from __future__ import annotations

import json
import os
import struct
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

USER, PASSWORD = "alice", "pw-7c1e9a-secret"
CLOUD_KEY = "cloud-key-5b2f0d-secret"
SECRETS = (PASSWORD, CLOUD_KEY)
TINY = "mlp:hidden=16,depth=2,in_features=8,batch_size=4"


@pytest.fixture(scope="module")
def server():
    from tests.test_app_harness import AppServer

    srv = AppServer("--allow-exec", "--job-timeout", "20", "--job-memory-mb", "2048",
                    env={"AMP_TROUBLESHOOTER_AUTH": f"{USER}:{PASSWORD}", "CLOUD_API_KEY": CLOUD_KEY})
    try:
        yield srv
    finally:
        srv.close()


class Caller:
    """A logged-in raw HTTP caller: uploads, and calls named endpoints the two-step way."""

    def __init__(self, url: str):
        import httpx

        self.http = httpx.Client(base_url=url.rstrip("/"), timeout=120)
        assert self.http.post("/login", data={"username": USER, "password": PASSWORD}).status_code == 200

    def upload(self, path: Path, name: str | None = None) -> dict:
        with open(path, "rb") as fh:
            r = self.http.post("/gradio_api/upload", files={"files": (name or path.name, fh)})
        r.raise_for_status()
        return {"path": r.json()[0], "meta": {"_type": "gradio.FileData"}}

    def submit(self, name: str, data: list) -> str:
        r = self.http.post(f"/gradio_api/call/{name}", json={"data": data})
        assert r.status_code == 200, r.text  # never "Queue is full"
        return r.json()["event_id"]

    def result(self, name: str, event_id: str) -> tuple[str, object]:
        """("complete", what the endpoint's function returned) or ("error", message)."""
        kind, payload = None, None
        with self.http.stream("GET", f"/gradio_api/call/{name}/{event_id}", timeout=180) as stream:
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    kind = line[7:].strip()
                elif line.startswith("data: ") and kind in ("complete", "error"):
                    payload = json.loads(line[6:])
                    break
        if kind == "error":
            return "error", (payload or {}).get("error") if isinstance(payload, dict) else str(payload)
        return kind, payload[0] if isinstance(payload, list) and len(payload) == 1 else payload

    def call(self, name: str, data: list) -> tuple[str, object]:
        return self.result(name, self.submit(name, data))

    def error(self, name: str, data: list) -> str:
        kind, message = self.call(name, data)
        assert kind == "error", f"{name} answered {kind}: {str(message)[:300]}"
        assert "internal error" not in message and "Traceback" not in message, message
        assert len(message) < 2500, f"a {len(message):,}-character message"
        return message


@pytest.fixture(scope="module")
def caller(server):
    return Caller(server.url)


def _check(spec_file=None, preset="", yaml_text="", weights=None) -> list:
    return [preset, yaml_text, spec_file, weights, "cpu", "alignment", 2, 10, "cuda"]


# --- 1. only files the caller uploaded are read, and only uploaded code runs ----------------

def test_server_files_named_by_string_are_neither_read_nor_run(caller, tmp_path):
    marker = tmp_path / "ran"
    bait = tmp_path / "bait.py"  # a server file that would leave a mark if it ever ran
    bait.write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                    "def build_model():\n    import torch\n    return torch.nn.Linear(2, 2)\n"
                    "def make_batch(n):\n    import torch\n    return torch.randn(n, 2)\n")
    for named in (str(bait), {"path": str(bait)}, {"path": str(bait), "meta": {"_type": "gradio.FileData"}},
                  {"path": f"{tmp_path}/../{tmp_path.name}/bait.py"}):
        for name, data in [("lint", ["", named, "", ""]), ("check", _check(spec_file=named)),
                           ("speedup", ["", "", named, "cpu", "fp32", 2, False]), ("trace", [named, "", 2, "cpu", "cuda"])]:
            message = caller.error(name, data)
            assert "not an uploaded file" in message or "not uploaded by a user" in message, (name, message)
    message = caller.error("inspect", ["/etc/passwd"])
    assert "not an uploaded file" in message and "root:" not in message
    assert not marker.exists(), "a server file named by the caller was run"


# --- 2. YAML: one bounded loader, short messages ---------------------------------------------

def _bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines + [f"weights: *a{levels - 1}", "model: {layers: [ReLU]}", "input: {shape: [1, 4]}", ""])


def test_an_alias_bomb_under_weights_is_refused_with_a_short_message(caller, tmp_path):
    text = _bomb()
    assert len(text) < 500
    spec = tmp_path / "bomb.yaml"
    spec.write_text(text)
    for data in (_check(yaml_text=text), _check(spec_file=caller.upload(spec))):
        message = caller.error("check", data)
        assert "alias" in message and len(message) < 500
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * 400_000 + "\nmodel: {layers: [ReLU]}\n")
    assert "over the limit" in caller.error("check", _check(spec_file=caller.upload(big)))
    assert "nests more than" in caller.error("check", _check(yaml_text="model: " + "[" * 5000 + "]" * 5000))


# --- 3. a monster model is refused by its computed size, before anything is built ------------

def test_a_model_too_big_by_its_size_is_refused_before_building(caller):
    for preset in ("gpt:n_layer=3000", "gpt:d_model=1000000000", "gpt:n_layer=1000000"):
        message = caller.error("check", _check(preset=preset))
        assert "would have" in message and "time limit" not in message, message


# --- 4, 5. jobs: their whole process tree stops with them; they see no server secret; memory --

LEAVES_CHILDREN_AND_LOOKS_FOR_SECRETS = """
import glob, os, subprocess, sys, time
pids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True).pid]
child = os.fork()
if child == 0:
    time.sleep(600)
    os._exit(0)
pids.append(child)
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    daemon = os.fork()
    if daemon == 0:
        time.sleep(600)
    os.write(w, str(daemon).encode())
    os._exit(0)
os.wait()
pids.append(int(os.read(r, 32)))
open({pid_file!r}, 'w').write(' '.join(map(str, pids)))

secrets = {secrets!r}
parent = {{}}  # this test's server and what runs below it; other servers on the machine are not ours to count
for proc in glob.glob('/proc/[0-9]*'):
    try:
        parent[int(proc[6:])] = int(open(proc + '/stat').read().rsplit(')', 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        continue
tree, grew = {{{server_pid}}}, True
while grew:
    below = {{pid for pid, ppid in parent.items() if ppid in tree}} - tree
    tree, grew = tree | below, bool(below)
texts, server_seen = [repr(dict(os.environ))], 0
for pid in sorted(tree):
    try:
        cmdline = open(f'/proc/{{pid}}/cmdline', 'rb').read().decode(errors='replace')
        environ = open(f'/proc/{{pid}}/environ', 'rb').read().decode(errors='replace')
    except OSError:
        continue
    server_seen += 'app.py' in cmdline and '--allow-exec' in cmdline and bool(environ)
    texts += [cmdline, environ]
found = sum(secret in text for secret in secrets for text in texts)
REPORT = f'FOUND={{found}} SERVER_SEEN={{server_seen}} ENV={{sorted(os.environ)}}'
print(REPORT)
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie: a killed process whose parent (the worker, gone itself, or an init
    that reaps late) has not collected it yet keeps its /proc entry in state Z, and runs nothing."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _alive(pid_file: Path, grace_s: float = 10.0) -> list[int]:
    """The job's children still running; SIGKILL is delivered asynchronously, so a child may take
    a moment to go on a loaded machine (the wait ends as soon as none runs)."""
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 3
    deadline = time.monotonic() + grace_s
    while True:
        alive = [p for p in pids if _running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def test_jobs_leave_no_child_alive_and_see_no_server_secret(server, caller, tmp_path):
    """A model file and a traced script each start a setsid() child, a forked child and a
    double-forked daemon, and look for the login password and the cloud key in their environment
    and in the environment and command line of every process of this test's server they can read
    (the server's own included: SERVER_SEEN; other servers on the machine are left out). They count
    what they find; the secrets are never printed. When each job has ended (the model file by
    raising), none of its children is alive and nothing was found."""
    pid_file = tmp_path / "model-pids"
    model = tmp_path / "model.py"
    model.write_text(LEAVES_CHILDREN_AND_LOOKS_FOR_SECRETS.format(pid_file=str(pid_file), secrets=list(SECRETS),
                                                                  server_pid=server.proc.pid)
                     + "def build_model():\n    raise RuntimeError(REPORT)\ndef make_batch(n):\n    return None\n")
    message = caller.error("check", _check(spec_file=caller.upload(model)))
    assert "FOUND=0 SERVER_SEEN=1" in message and "'PATH'" in message, message
    assert "AMP_TROUBLESHOOTER_AUTH" not in message and "CLOUD_API_KEY" not in message
    assert _alive(pid_file) == []
    pid_file = tmp_path / "trace-pids"
    script = tmp_path / "train.py"
    script.write_text(LEAVES_CHILDREN_AND_LOOKS_FOR_SECRETS.format(pid_file=str(pid_file), secrets=list(SECRETS),
                                                                   server_pid=server.proc.pid))
    kind, out = caller.call("trace", [caller.upload(script), "", 2, "cpu", "cuda"])
    assert kind == "complete", out
    assert "FOUND=0 SERVER_SEEN=1" in json.loads(out[0])["exit"]["stdout_tail"]
    assert _alive(pid_file) == []


def test_a_job_over_its_memory_limit_is_told_so(caller, tmp_path):
    model = tmp_path / "model.py"
    model.write_text("def build_model():\n    block = bytearray(4 * 1024 ** 3)\n"
                     "def make_batch(n):\n    return None\n")
    message = caller.error("check", _check(spec_file=caller.upload(model)))
    assert "ran out of memory" in message and "2048 MiB" in message


# --- 6, 7. concurrent lints, and cheap endpoints beside full queues --------------------------

def test_concurrent_lints_are_clean_and_rules_answer_meanwhile(caller, tmp_path):
    block = ("def step_{i}(model, opt, scaler, x, y):\n    with torch.autocast('cuda', dtype=torch.float16):\n"
             "        loss = model(x).float().mean() + ((((x + 1) * 2) - 3) / 4).sum() * {i}\n"
             "    scaler.scale(loss).backward()\n    scaler.step(opt)\n    scaler.update()\n")
    big = tmp_path / "big.py"
    big.write_text("import torch\n" + "".join(block.format(i=i) for i in range(400)))
    deep = tmp_path / "deep.py"
    deep.write_text("x = " + "+".join(["a"] * 900) + "\nimport torch\nscaler = torch.cuda.amp.GradScaler()\n")
    uploads = [caller.upload(big), caller.upload(deep)]
    events = [caller.submit("lint", ["", uploads[i % 2], "", ""]) for i in range(8)]
    results, finished = [None] * len(events), [0.0] * len(events)

    def wait(i):
        results[i] = caller.result("lint", events[i])
        finished[i] = time.monotonic()

    readers = [threading.Thread(target=wait, args=(i,)) for i in range(len(events))]
    for t in readers:
        t.start()
    kind, rules = caller.call("rules", ["AMP101"])
    rules_done = time.monotonic()
    for t in readers:
        t.join()
    assert kind == "complete" and json.loads(rules[0])["id"] == "AMP101"
    assert rules_done < max(finished), "rules was not answered while lints were waiting: the test proves nothing"
    for kind, out in results:
        assert kind == "complete", out
        report = json.loads(out[0])
        assert not report["errors"], report["errors"]


def test_cheap_endpoints_answer_while_jobs_fill_the_queue_and_a_hang_ends_at_the_limit(caller, tmp_path):
    """A model file that hangs holds the device until the job's time limit; sixty-five device jobs
    wait behind it. /rules and /recipe still answer (with a global queue size of 64, they said
    "Queue is full"), and the hanging job ends at the limit with a readable message."""
    model = tmp_path / "hangs.py"
    model.write_text("import time\ndef build_model():\n    time.sleep(900)\n"
                     "def make_batch(batch_size):\n    return None\n")
    holder = caller.submit("check", _check(spec_file=caller.upload(model)))
    waiting = [caller.submit("capability", ["cpu"]) for _ in range(65)]
    assert caller.call("rules", [""])[0] == "complete"
    assert caller.call("recipe", ['{"precision": "bf16"}'])[0] == "complete"
    kind, message = caller.result("check", holder)
    assert kind == "error" and "time limit of 20 s" in message, message
    assert "/tmp" not in message and "_job" not in message and "Traceback" not in message
    assert all(caller.result("capability", e)[0] == "complete" for e in waiting[-3:])


# --- 8. each hostile input gets a clear, bounded message -------------------------------------

def test_hostile_inputs_get_clear_short_messages(caller, tmp_path):
    notebook = tmp_path / "deep.ipynb"
    notebook.write_text('{"cells": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "nests more than" in caller.error("lint", ["", caller.upload(notebook), "", ""])
    kind, out = caller.call("lint", ["x = " + "-" * 10_000 + "1\n", None, "", ""])
    assert kind == "complete" and "nests too deeply" in json.loads(out[0])["errors"][0]["message"]
    assert "nests more than" in caller.error("recommend", ["[" * 100_000 + "]" * 100_000])
    assert "nests more than" in caller.error("recipe", ['{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"])
    header = json.dumps({"w": {"dtype": "F16", "shape": [100_000, 100_000], "data_offsets": [0, 32]}}).encode()
    lying = tmp_path / "lying.safetensors"
    lying.write_bytes(struct.pack("<Q", len(header)) + header + bytes(32))
    assert "does not describe this file" in caller.error("inspect", [caller.upload(lying)])


# --- 9. cancelling needs the login too ---------------------------------------------------------

def test_cancel_needs_the_login(server, caller):
    import httpx

    body = {"session_hash": "someone-else", "fn_index": 0, "event_id": "their-event"}
    assert httpx.post(server.url + "gradio_api/cancel", json=body).status_code == 401
    assert caller.http.post("/gradio_api/cancel", json=body).status_code == 200


# --- the documented client on this server -------------------------------------------------

def test_trace_endpoint_runs_with_gradio_client(server, tmp_path):
    """With the trace module (merged from its own branch) the script runs; without it, a sentence."""
    import importlib.util

    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError

    client = Client(server.url, auth=(USER, PASSWORD), verbose=False, download_files=str(tmp_path))
    script = tmp_path / "train.py"
    script.write_text("import torch\nm = torch.nn.Linear(4, 2)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for _ in range(3):\n    loss = m(torch.randn(8, 4)).pow(2).mean()\n"
                      "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n")
    if importlib.util.find_spec("troubleshooter.trace") is None:
        with pytest.raises(AppError) as info:
            client.predict(script=handle_file(str(script)), args="", steps=3, device="cpu", api_name="/trace")
        assert "not available" in str(info.value) and "Traceback" not in str(info.value)
        return
    result, _ = client.predict(script=handle_file(str(script)), args="", steps=3, device="cpu", api_name="/trace")
    result = json.loads(result)
    assert result["script"] == "train.py" and "findings" in result and "/tmp" not in json.dumps(result)
