"""`amp-troubleshooter server` driven over stdio as an editor drives it: initialize, didOpen ->
publishDiagnostics equal to `lint`'s findings, codeAction -> the finding's safe fix, shutdown/exit."""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from troubleshooter.lint import fix_text, lint_text
from troubleshooter.lint.docs import rule_url
from troubleshooter.lint.edits import Edit, apply_edits

pytest.importorskip("pygls", reason="the language server needs the [lsp] extra (requirements-dev.txt installs it)")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ("import torch\n\n𝛼 = 0.9; scaler = torch.cuda.amp.GradScaler()  # 𝛼 takes two UTF-16 units\n\n\n"
          "def train(model, loader, opt):\n    for x in loader:\n        with torch.autocast('cuda', dtype=torch.float16):\n"
          "            loss = model(x).sum()\n"
          "        scaler.scale(loss).backward()\n        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
          "        scaler.step(opt)\n        scaler.update()\n")


class Client:
    """A minimal LSP client: Content-Length framed JSON-RPC over the server's stdin/stdout."""

    def __init__(self, cwd: Path):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-m", "troubleshooter", "server"], cwd=cwd, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.watchdog = threading.Timer(60, self.proc.kill)  # a hung server fails the test, never the suite
        self.watchdog.start()
        self.next_id = 0

    def send(self, method: str, params=None, request: bool = True):
        msg = {"jsonrpc": "2.0", "method": method, "params": params}
        if request:
            self.next_id += 1
            msg["id"] = self.next_id
        body = json.dumps(msg).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()
        return msg.get("id")

    def read(self) -> dict:
        length = None
        while True:
            line = self.proc.stdout.readline()
            assert line, f"the server closed its output: {self.proc.stderr.read().decode()[-2000:]}"
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return json.loads(self.proc.stdout.read(length))

    def wait_for(self, pred) -> dict:
        while True:
            msg = self.read()
            if pred(msg):
                return msg

    def request(self, method: str, params) -> dict:
        rid = self.send(method, params)
        reply = self.wait_for(lambda m: m.get("id") == rid and "method" not in m)
        assert "error" not in reply, reply
        return reply["result"]

    def close(self) -> int:
        try:
            self.request("shutdown", None)
            self.send("exit", None, request=False)
            return self.proc.wait(timeout=30)
        finally:
            self.watchdog.cancel()
            self.proc.kill()


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def apply_lsp_edits(text: str, edits: list[dict]) -> str:
    """The document after LSP TextEdits (positions in UTF-16 units)."""
    lines = text.splitlines(True)

    def column(pos: dict) -> int:
        line = lines[pos["line"]] if pos["line"] < len(lines) else ""
        units, col = 0, 0
        while units < pos["character"]:
            units += utf16(line[col])
            col += 1
        return col + 1

    return apply_edits(text, [Edit(e["range"]["start"]["line"] + 1, column(e["range"]["start"]),
                                   e["range"]["end"]["line"] + 1, column(e["range"]["end"]), e["newText"])
                              for e in edits])


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    folder = tmp_path_factory.mktemp("editor")
    client = Client(folder)
    init = client.request("initialize", {"processId": None, "rootUri": folder.as_uri(), "capabilities": {}})
    client.send("initialized", {}, request=False)
    yield client, folder, init
    assert client.close() == 0


def open_document(client, path: Path, text: str, version: int = 1) -> list[dict]:
    uri = path.as_uri()
    client.send("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": version,
                                                          "text": text}}, request=False)
    note = client.wait_for(lambda m: m.get("method") == "textDocument/publishDiagnostics"
                           and m["params"]["uri"] == uri)
    return note["params"]["diagnostics"]


def test_initialize_advertises_sync_and_code_actions(session):
    _, _, init = session
    caps = init["capabilities"]
    assert init["serverInfo"]["name"] == "amp-troubleshooter"
    assert caps["textDocumentSync"]["openClose"] is True and caps["textDocumentSync"]["change"] == 1
    assert "quickfix" in caps["codeActionProvider"]["codeActionKinds"]


def test_open_publishes_lints_findings_and_code_actions_fix_them(session):
    client, folder, _ = session
    path = folder / "train.py"
    text = SCRIPT
    diags = open_document(client, path, text)
    report = lint_text(text, str(path))
    assert [(d["code"], d["range"]["start"]["line"] + 1, d["severity"]) for d in diags] == \
        [(f.rule, f.location.line, {"error": 1, "warning": 2, "info": 3}[f.severity.value]) for f in report.findings]
    lines = text.splitlines()
    for d, f in zip(diags, report.findings):
        assert d["message"].startswith(f.message) and d["source"] == "amp-troubleshooter"
        assert d["codeDescription"]["href"] == rule_url(f.rule)
        assert d["range"]["start"]["character"] == utf16(lines[f.location.line - 1][: f.location.column - 1])
    deprecated = next(d for d in diags if d["code"] == "AMP106")
    assert deprecated["range"]["start"]["character"] == len("𝛼 = 0.9; scaler = ") + 1  # UTF-16, not code points
    clip = next(d for d in diags if d["code"] == "AMP101")
    actions = client.request("textDocument/codeAction", {
        "textDocument": {"uri": path.as_uri()}, "range": clip["range"],
        "context": {"diagnostics": [clip], "only": ["quickfix"]}})
    fix = next(a for a in actions if a["isPreferred"])
    assert fix["kind"] == "quickfix" and fix["title"].startswith("AMP101")
    fixed = apply_lsp_edits(text, fix["edit"]["changes"][path.as_uri()])
    assert "        scaler.unscale_(opt)\n        torch.nn.utils.clip_grad_norm_" in fixed
    assert "AMP101" not in {f.rule for f in lint_text(fixed).findings}
    noqa = next(a for a in actions if "noqa" in a["title"])
    assert noqa["edit"]["changes"][path.as_uri()][0]["newText"] == "  # noqa: AMP101"
    everything = client.request("textDocument/codeAction", {
        "textDocument": {"uri": path.as_uri()}, "range": clip["range"],
        "context": {"diagnostics": [], "only": ["source.fixAll"]}})
    assert [a["kind"] for a in everything] == ["source.fixAll.amp-troubleshooter"]
    # the fix-all action writes what `lint --fix` writes (AMP101 and AMP106 here)
    assert apply_lsp_edits(text, everything[0]["edit"]["changes"][path.as_uri()]) == fix_text(text, str(path)).fixed_text
    assert 'scaler = torch.amp.GradScaler("cuda")' in fix_text(text, str(path)).fixed_text


def test_change_and_close_update_the_diagnostics_and_settings_apply(session):
    client, folder, _ = session
    (folder / "pyproject.toml").write_text('[tool.amp-troubleshooter]\nignore = ["AMP106"]\n')
    path = folder / "quiet.py"
    diags = open_document(client, path, SCRIPT)
    assert {d["code"] for d in diags} == {"AMP101"}  # AMP106 ignored by the project's settings
    uri = path.as_uri()
    clean = SCRIPT.replace("        torch.nn.utils.clip", "        scaler.unscale_(opt)\n        torch.nn.utils.clip")
    client.send("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2},
                                           "contentChanges": [{"text": clean}]}, request=False)
    note = client.wait_for(lambda m: m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri)
    assert note["params"]["diagnostics"] == []
    client.send("textDocument/didClose", {"textDocument": {"uri": uri}}, request=False)
    note = client.wait_for(lambda m: m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri)
    assert note["params"]["diagnostics"] == []
