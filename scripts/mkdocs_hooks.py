"""MkDocs hook (mkdocs.yml ``hooks``): two files of the repository's root are pages of the site as they are, so each
keeps its one home where a reader of the repository looks for it: README.md is the getting-started page (its links
into docs/ made the site's own), CHANGELOG.md the changelog."""
from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent


def readme_page(text: str) -> str:
    """README.md as a page of the site: its links into docs/ and to the changelog are the site's."""
    return text.replace("](docs/", "](").replace("](CHANGELOG.md)", "](changelog.md)")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, "getting-started.md", content=readme_page((ROOT / "README.md").read_text())))
    files.append(File.generated(config, "changelog.md", content=(ROOT / "CHANGELOG.md").read_text()))
    return files
