"""`amp-troubleshooter server`: the Language Server Protocol over stdio (pygls).

Diagnostics are published when a document is opened, changed and saved (and cleared when it is
closed); code actions offer each finding's safe fix, a `# noqa` for its line, and a fix-all
(`source.fixAll.amp-troubleshooter`, what `lint --fix` would write).
"""
from __future__ import annotations

from pygls.lsp.server import LanguageServer  # first: a missing [lsp] extra is named by its package, pygls
from lsprotocol import types as lsp  # noqa: I001

from .. import __version__
from .lint import FIX_ALL, SOURCE, Linted, code_actions, diagnostics, lint_document


def build() -> LanguageServer:
    server = LanguageServer(SOURCE, __version__, text_document_sync_kind=lsp.TextDocumentSyncKind.Full)
    linted: dict[str, Linted] = {}

    def units():
        return server.workspace.position_codec.client_num_units

    def publish(uri: str, version: int | None = None) -> None:
        doc = server.workspace.get_text_document(uri)
        try:
            linted[uri] = lint_document(uri, doc.source)
        except Exception as exc:  # noqa: BLE001 - a broken pyproject.toml must not kill the editor's server
            server.window_log_message(lsp.LogMessageParams(type=lsp.MessageType.Error, message=f"{SOURCE}: {exc}"))
            return
        server.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(
            uri=uri, version=version, diagnostics=diagnostics(linted[uri], units())))

    @server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
    def did_open(params: lsp.DidOpenTextDocumentParams) -> None:
        publish(params.text_document.uri, params.text_document.version)

    @server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(params: lsp.DidChangeTextDocumentParams) -> None:
        publish(params.text_document.uri, params.text_document.version)

    @server.feature(lsp.TEXT_DOCUMENT_DID_SAVE)
    def did_save(params: lsp.DidSaveTextDocumentParams) -> None:
        publish(params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(params: lsp.DidCloseTextDocumentParams) -> None:
        linted.pop(params.text_document.uri, None)
        server.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=params.text_document.uri,
                                                                              diagnostics=[]))

    @server.feature(lsp.TEXT_DOCUMENT_CODE_ACTION, lsp.CodeActionOptions(
        code_action_kinds=[lsp.CodeActionKind.QuickFix, FIX_ALL]))
    def code_action(params: lsp.CodeActionParams) -> list[lsp.CodeAction]:
        uri = params.text_document.uri
        doc = linted.get(uri)
        if doc is None or doc.text != server.workspace.get_text_document(uri).source:
            publish(uri)
            doc = linted.get(uri)
        if doc is None:
            return []
        return code_actions(uri, doc, list(params.context.diagnostics), units(), params.context.only)

    return server


def serve() -> int:
    build().start_io()
    return 0
