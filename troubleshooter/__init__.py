"""AMP Troubleshooter: find and fix what goes wrong when PyTorch training moves to FP16/BF16.

Importing the package stays cheap (no torch import) so the linter and questionnaire work
without touching the GPU stack. `nanhunt` is loaded on first use.
"""
__version__ = "0.1.0"  # the one place the version is written; pyproject.toml reads it from here

# Where people find the tool; SARIF's tool.driver.informationUri points here.
HOMEPAGE = "https://pypi.org/project/amp-troubleshooter/"
# The source repository. Each lint rule's page is docs/rules/AMPnnn.md there (generated from the rule);
# SARIF helpUri, the text output and the language server link to it (troubleshooter/lint/docs.py).
REPOSITORY = "https://github.com/amp-troubleshooter/amp-troubleshooter"

__all__ = ["__version__", "HOMEPAGE", "REPOSITORY", "nanhunt"]


def __getattr__(name):
    if name == "nanhunt":
        from .engine.nanhunt import nanhunt

        return nanhunt
    raise AttributeError(f"module 'troubleshooter' has no attribute {name!r}")
