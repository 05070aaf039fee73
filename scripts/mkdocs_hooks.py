"""MkDocs hook (mkdocs.yml ``hooks``): the repository's CHANGELOG.md is the site's changelog page, so the file has
one home at the root, where a reader of the repository looks for it."""
from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

CHANGELOG = Path(__file__).resolve().parent.parent / "CHANGELOG.md"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, "changelog.md", content=CHANGELOG.read_text()))
    return files
