"""Every python example of README.md and docs/*.md runs as written (the convention is at the top
of docs/README.md): a page's blocks in order, in one namespace, in a fresh directory holding
``frozen.pb`` (the demo CNN); a block marked ``<!-- no-run: why -->`` is skipped."""
import os

import pytest

from tfsurgery import pipeline
from docs_examples import NO_RUN, ROOT, pages, python_blocks

PAGES = [page for page in pages() if any(runs for _, _, runs in python_blocks(page))]


def test_the_convention_holds_and_new_pages_are_found():
    assert (ROOT / "docs" / "README.md") in pages()
    assert {"README.md", "python-api.md", "plugins.md", "training.md"} <= {p.name for p in PAGES}
    assert NO_RUN.search("<!-- no-run: needs a Keras ResNet50 -->")
    assert not NO_RUN.search("<!-- no-run: -->")           # a reason is required


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_the_examples_of_a_page_run(page, article, tmp_path, monkeypatch):
    (tmp_path / "frozen.pb").write_bytes(article.graph_def.SerializeToString())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pipeline, "USER", {})           # the page's own transforms stay there
    namespace = {"__name__": "__docs__"}
    for line, code, runs in python_blocks(page):
        if runs:
            source = "\n" * (line - 1) + code              # tracebacks point into the page
            exec(compile(source, str(page), "exec"), namespace)
    assert os.getcwd() == str(tmp_path)                  # no example wandered off
