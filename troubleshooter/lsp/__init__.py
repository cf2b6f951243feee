"""The language server (`amp-troubleshooter server`): the linter's findings in editors, with quick fixes.

Needs the `[lsp]` extra (pygls). `lint.py` turns a document into findings exactly as `lint` does;
`server.py` speaks the Language Server Protocol over stdio.
"""
